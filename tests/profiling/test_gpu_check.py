"""profiling/gpu_check.sh fits one device call with room for a rerun: valid bash, every step under
its own budget, the essential rows first and out within 150 s in the worst case (budgets plus kill
grace), the whole call within 300 s, and a dry run on the CPU that goes through every step in
that order."""
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
    """`--dry-run`: the preamble and a small loss profile run for real, every other step is
    echoed, the summary lists each step once in the script's order, and the call ends with 0."""
    env = {**os.environ, "OUT": str(tmp_path), "PATH": os.path.dirname(sys.executable) + os.pathsep +
           os.environ.get("PATH", "")}
    run = subprocess.run(["bash", str(SCRIPT), "--dry-run"], capture_output=True, text=True, env=env, timeout=300)
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
