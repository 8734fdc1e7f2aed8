"""profiling/gpu_check.sh fits one device call with room for a rerun: valid bash, every step under
its own budget, the essential rows first and out within 150 s in the worst case (budgets plus kill
grace), the whole call within 300 s, and a dry run on the CPU that goes through every step in
that order, running the loss profile and the asynchronous step's runs for real.

Wrong variants these tests were checked to reject (once each, by hand): the asynchronous step
echoed in the dry run instead of run; bench_async's ratio inverted (sync / async); its modes
swapped (the "sync" run asynchronous); a step run only if time is left placed before a step that
always runs (its `fits` check would then not see the later budgets)."""
import os
import re
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "profiling" / "gpu_check.sh"


def _settings(text):
    budgets = {k: int(v) for k, v in re.findall(r"\[([\w-]+)\]=(\d+)", re.search(r"BUDGETS=\((.*?)\)", text,
                                                                                  re.S).group(1))}
    value = lambda name: re.search(rf'^{name}="?([\w -]*?)"?$', text, re.M).group(1)  # noqa: E731
    return (budgets, int(value("GRACE")), value("ESSENTIAL").split(), int(value("ESSENTIAL_BY")),
            value("IF_TIME").split(), int(value("WORST")))


def _order(text):
    """Step names in the order the script reaches them (first mention by `step` or `skip`)."""
    seen = []
    for name in re.findall(r"^\s*(?:step|skip) ([\w-]+)", text, re.M):
        if name not in seen:
            seen.append(name)
    return seen


def test_gpu_check_fits_150_seconds_for_the_essential_rows_and_300_in_all():
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)
    text = SCRIPT.read_text()
    budgets, grace, essential, essential_by, guarded, worst = _settings(text)
    assert (essential_by, worst) == (150, 300)
    order = _order(text)
    assert set(order) == set(budgets), "every step has a budget and every budget a step"
    assert order[:len(essential)] == essential, "the essential steps come first, in their order"
    assert {"kernel-tests", "loss", "buffer-step"} <= set(essential)
    assert sum(budgets[k] for k in essential) + grace * len(essential) <= essential_by
    fixed = [k for k in budgets if k not in guarded]
    assert sum(budgets[k] for k in fixed) + grace * len(fixed) <= worst, {k: budgets[k] for k in fixed}
    # `fits` sees only the elapsed time and its own step's budget: every step it guards comes after
    # every step that always runs, or those could push the call past the worst case
    assert max(order.index(k) for k in fixed) < min(order.index(k) for k in guarded), order
    assert guarded[0] == "async", "asynchronous generation, never run on a GPU, is the first step run if time is left"
    unmeasured = re.search(r'^UNMEASURED="([\w -]*)"$', text, re.M).group(1).split()
    assert set(unmeasured) <= set(budgets) and {"async", "bench_trl", "baselines"} <= set(unmeasured), unmeasured
    assert re.search(r"\(\( \$\(date \+%s\) - t_start \+ \$\{BUDGETS\[\$1\]\} \+ GRACE <= WORST \)\)", text)
    for name in guarded:  # launched only when elapsed + its budget + grace still fits the worst case
        assert re.search(rf"fits {name}\b", text), name
    assert order.index("loss") < order.index("baselines") and order.index("bench_trl") > order.index("baselines")
    # names survive a timeout: the tests run verbose, and each step's output is printed as it comes
    assert all("-v " in line for line in text.splitlines() if re.match(r"\s*step [\w-]+ \w+\.txt python3 -m pytest",
                                                                        line))
    assert "| tee " in text


def test_every_command_that_can_hang_runs_under_a_budget():
    """Outside the step helper, the preamble function and --fetch-wheels, no line calls python3
    or pytest: an import there (vllm takes seconds) would escape every timeout."""
    text = SCRIPT.read_text()
    body = re.sub(r"^preamble\(\) \{.*?^\}", "", text, flags=re.S | re.M)
    body = re.sub(r'^if \[ "\$\{1:-\}" = "--fetch-wheels" \].*?^fi', "", body, flags=re.S | re.M)
    loose = [line for line in body.splitlines()
             if re.search(r"\b(python3|pytest)\b", line) and not re.match(r"\s*(step |#|\s*--)", line)
             and "step " not in line]
    assert not loose, loose


def test_the_preamble_lists_trls_imports():
    text = SCRIPT.read_text()
    mods = re.search(r'^TRL_IMPORTS="([^"]*)"', text, re.M | re.S).group(1).split()
    assert {"trl", "accelerate", "pandas", "pyarrow", "psutil", "jinja2", "fsspec", "huggingface_hub",
            "datasets", "transformers"} <= set(mods)


def test_dry_run_on_the_cpu(tmp_path):
    """`--dry-run`: the preamble, a small loss profile and the asynchronous step's runs (tiny
    batches, on the CPU) run for real, every other step is echoed, the summary lists each step
    once in the script's order, and the call ends with 0. The loss step names the float32-logits
    path; the asynchronous step prints each run's batch ages (all 0 in the synchronous run, at
    most max_lag in the other: its batch 1 is made from version 0 while the trainer trains on
    batch 0, so swapped modes show a 1 in the "sync" line) and a ratio that is the quotient of
    the two runs' episodes per second."""
    env = {**os.environ, "OUT": str(tmp_path), "PATH": os.path.dirname(sys.executable) + os.pathsep +
           os.environ.get("PATH", "")}
    run = subprocess.run(["bash", str(SCRIPT), "--dry-run"], capture_output=True, text=True, env=env, timeout=420)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    out = run.stdout
    summary = (tmp_path / "summary.txt").read_text().splitlines()
    names = [line.split("|")[1].strip() for line in summary]
    order = _order(SCRIPT.read_text())
    assert names == order, (names, order)
    status = dict((line.split("|")[1].strip(), line.split("|")[2].strip()) for line in summary)
    assert status["preamble"] == "dry ok" and status["loss"] == "dry ok", status
    assert re.search(r"^trl imports: \d+/\d+ present; missing: ", out, re.M)
    assert re.search(r"^\| GEMMs \| [\d.]+ \| \d+% \| 3 \|$", out, re.M), "one chunk: three head GEMMs"
    assert out.index("== kernel-tests") < out.index("== loss") < out.index("== buffer-step") < out.index("== wheels")
    assert status["async"] == "dry ok", status
    summary_part = out[out.index("== summary"):]
    assert re.search(r"^fused loss path on cpu, torch \S+: LM head: float32 logits from bfloat16 operands, "
                     r"path (out_dtype|out_dtype-mm|upcast): ", summary_part, re.M), summary_part[-2000:]
    found = re.findall(r"^round 0 (async|sync): iteration [\d.]+ s, episodes/s ([\d.]+), batch ages ([\d ]+)$",
                       summary_part, re.M)
    runs = {m: (float(rate), [int(x) for x in ages.split()]) for m, rate, ages in found}
    assert set(runs) == {"async", "sync"}, summary_part[-2000:]
    assert len(runs["sync"][1]) == 2 and set(runs["sync"][1]) == {0}, runs
    assert len(runs["async"][1]) == 2 and set(runs["async"][1]) <= {0, 1, 2}, runs  # at most max_lag 2
    ratio = float(re.search(r"^async / sync episodes per second: ([\d.]+)x$", summary_part, re.M).group(1))
    a, b = runs["async"][0], runs["sync"][0]  # printed to 2 decimals, as the ratio is
    assert a > 0 and b > 0, runs
    assert abs(ratio - a / b) <= 0.005 + a / b * (0.005 / a + 0.005 / b) * 1.01, (ratio, a, b)
