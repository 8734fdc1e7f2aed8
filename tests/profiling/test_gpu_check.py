"""profiling/gpu_check.sh fits one device call: valid bash, every step under its own budget, and
the worst case (budgets plus kill grace) at most 480 s, leaving a 600 s call room for the
machine's start and the transfers."""
import re
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "profiling" / "gpu_check.sh"


def test_gpu_check_is_valid_bash_and_fits_480_seconds():
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)
    text = SCRIPT.read_text()
    budgets = {k: int(v) for k, v in re.findall(r"\[([\w-]+)\]=(\d+)", re.search(r"BUDGETS=\((.*?)\)", text,
                                                                                  re.S).group(1))}
    grace = int(re.search(r"^GRACE=(\d+)", text, re.M).group(1))
    steps = re.findall(r"^\s*(?:step|skip) ([\w-]+)", text, re.M)
    assert set(steps) == set(budgets), "every step has a budget and every budget a step"
    guarded = re.search(r'^IF_TIME="([\w -]*)"', text, re.M).group(1).split()
    fixed = {k: v for k, v in budgets.items() if k not in guarded}
    assert sum(fixed.values()) + grace * len(fixed) <= 480, fixed
    for name in guarded:  # launched only when elapsed + its budget + grace still fits 480 s
        assert re.search(r"\$\(date \+%s\) - t_start \+ \$\{BUDGETS\[" + name + r"\]\} \+ GRACE > 480", text), name


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
