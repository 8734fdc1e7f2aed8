"""Readouts of a comparison that hold something other than env steps equal.

An arm with K replay updates makes 1 + K optimizer steps per iteration and costs more compute per
env step than on-policy; its lead at equal env steps may be nothing but those extra updates. So
besides the primary readout (final validation at equal env steps) `freshper compare` reports,
paired by seed against the control arm (the first of --arms):

- validation at equal optimizer updates: each arm's validation curve, as a function of the updates
  made before it ran, read at the fewest updates any arm of that seed makes in all;
- validation at equal measured compute: the same against the seconds of training work (every
  timed phase but validation and checkpoints, each second once: compute_seconds), read at the
  least any arm of the seed spends.
  Seconds compare only on one machine: a seed whose arms ran on different machines (source.json's
  "machine") is left out of this readout, and the table says how many were;
- env steps to reach the control's final validation (the rollout volume each arm needs for the
  control's result, as ReMix reports it): where its validation curve first reaches that value,
  linear between validation points; not reached within the budget is counted, not imputed.

Validation points sit where the validation ran: before iteration i's rollout (so after the
updates and compute of iterations 0..i-1), and the final one after the last iteration. Curves are
linear between points and never extrapolated: a value asked past an arm's last point is NaN.
"""
from __future__ import annotations

import math

import numpy as np

from ..train.intervals import mean_ci
from ..train.metrics import compute_seconds


def cumulative(rows: list[dict], x: str) -> list[float] | None:
    """The cumulative quantity `x` after each row: "env_steps", "updates" (optimizer steps) or
    "compute" (seconds, compute_seconds); None when the rows do not log it."""
    if x == "compute":
        return list(np.cumsum([compute_seconds(r) for r in rows]))
    if not all(x in r for r in rows):
        return None
    return [float(r[x]) for r in rows]


def eval_track(rows: list[dict], x: str, key: str = "eval_success") -> list[tuple[float, float]]:
    """(cumulative x when the validation ran, validation value) over a run, in order; [] when x is
    not logged."""
    cum = cumulative(rows, x)
    if cum is None:
        return []
    pts = []
    for i, r in enumerate(rows):
        if key in r:
            pts.append((cum[i - 1] if i else 0.0, float(r[key])))
    if rows and f"final_{key}" in rows[-1]:
        pts.append((cum[-1], float(rows[-1][f"final_{key}"])))
    return pts


def value_at(track: list[tuple[float, float]], x: float) -> float:
    """The track's value at x, linear between its points; NaN outside [first x, last x]."""
    if not track:
        return math.nan
    xs, ys = np.array(track, dtype=float).T
    if x < xs[0] - 1e-9 or x > xs[-1] + 1e-9:
        return math.nan
    return float(np.interp(x, xs, ys))


def first_reach(track: list[tuple[float, float]], target: float) -> float:
    """The first x at which the track, linear between points, reaches `target`; NaN if never."""
    for i, (x1, y1) in enumerate(track):
        if y1 >= target:
            if i == 0:
                return float(x1)
            x0, y0 = track[i - 1]
            return float(x0 + (target - y0) / (y1 - y0) * (x1 - x0))
    return math.nan


def final_x(rows: list[dict], x: str) -> float:
    cum = cumulative(rows, x)
    return math.nan if not cum else float(cum[-1])


def study_machines(folder) -> dict[str, str]:
    """{run name: machine type} from a study folder's machines.md, {} where it has none. The file's
    table has a "type" column (one name per machine type) and a "runs" column listing run names
    (`<arm>-s<seed>`); a run listed under two types gets both, joined by " + "."""
    import re
    from pathlib import Path

    path = Path(folder) / "machines.md"
    if not path.is_file():
        return {}
    out: dict[str, set] = {}
    header = None
    for line in path.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not line.startswith("|") or set(cells[0]) <= set("-: "):
            continue
        if header is None:
            header = [c.lower() for c in cells]
            if "type" not in header or "runs" not in header:
                raise ValueError(f"{path}: its table needs a 'type' and a 'runs' column, has {header}")
            continue
        kind = cells[header.index("type")]
        for run in re.findall(r"\b[a-z][a-z-]*-s\d+\b", cells[header.index("runs")]):
            out.setdefault(run, set()).add(kind)
    return {run: " + ".join(sorted(kinds)) for run, kinds in out.items()}


def run_machine(job: dict) -> str | None:
    """The machine a run ran on, as one comparable string: the job's "machine", else its folder's
    source.json (resumes included: a run resumed elsewhere has two), else the machine type its
    study folder's machines.md gives it; None when none of them records it."""
    if "machine" in job:
        return job["machine"]
    import json
    from pathlib import Path

    if not job.get("run"):
        return None
    run = Path(job["run"])
    path = run / "source.json"
    if path.is_file():
        info = json.loads(path.read_text())
        seen = [info.get("machine")] + [r.get("machine") for r in info.get("resumed", [])]
        known = sorted({json.dumps(m, sort_keys=True) for m in seen if m})
        if known:
            return " + ".join(known)
    return study_machines(run.parent).get(run.name)


def matched(by_label: dict, key: str = "eval_success") -> dict:
    """{arm: {"updates": ..., "compute": ..., "reach": ...}} against the first arm (the control), per
    seed both ran. "updates"/"compute": (mean, half-width, wins, n, per-seed differences) of the arm's
    validation minus the control's, both read at that seed's least final updates / compute over all
    arms. "reach": (median env steps to the control's final validation over the seeds that reached
    it, reached, n, per-seed env steps with NaN for not reached)."""
    labels = list(by_label)
    if not labels:
        return {}
    runs = {label: {j["seed"]: rows for j, rows, _ in items} for label, items in by_label.items()}
    machines = {label: {j["seed"]: run_machine(j) for j, _, _ in items} for label, items in by_label.items()}
    seeds = sorted(set.intersection(*(set(r) for r in runs.values())))
    control = labels[0]
    out: dict = {label: {} for label in labels}
    # seconds compare only on one machine: a seed whose arms ran on two, or whose machine is not
    # recorded for every arm, is left out of the compute readout (and counted in the table)
    unknown = [s for s in seeds if any(machines[label][s] is None for label in labels)]
    mixed = [s for s in seeds if s not in unknown and len({machines[label][s] for label in labels}) > 1]
    out[control]["compute_mixed_machines"] = mixed
    out[control]["compute_unrecorded_machines"] = unknown
    for x in ("updates", "compute"):
        at = {}
        for s in seeds:
            finals = [final_x(runs[label][s], x) for label in labels]
            if any(math.isnan(f) for f in finals) or (x == "compute" and (s in mixed or s in unknown)):
                continue
            at[s] = min(finals)
        vals = {label: {s: value_at(eval_track(runs[label][s], x, key), at[s]) for s in at} for label in labels}
        for label in labels[1:]:
            d = [vals[label][s] - vals[control][s] for s in at]
            d = [v for v in d if not math.isnan(v)]
            out[label][x] = (*mean_ci(d), sum(v > 0 for v in d), len(d), d) if d else None
        out[control][x + "_value"] = {s: vals[control][s] for s in at}
    for label in labels:
        steps = []
        for s in seeds:
            target = runs[control][s][-1].get(f"final_{key}")
            steps.append(math.nan if target is None else first_reach(eval_track(runs[label][s], "env_steps", key),
                                                                      float(target)))
        ok = [v for v in steps if not math.isnan(v)]
        out[label]["reach"] = (float(np.median(ok)) if ok else math.nan, len(ok), len(steps), steps)
    return out


def matched_table(by_label: dict, budget: int, key: str = "eval_success") -> tuple[str, dict]:
    """The markdown section of `matched` and its JSON-able form."""
    res = matched(by_label, key)
    if len(res) < 2:
        return "", {}
    control = next(iter(res))

    def cell(v, left_out=False):
        if v is None:
            return "n/a (seeds left out, above)" if left_out else "n/a (not logged)"
        m, h, wins, n, _ = v
        return f"{m:.3f} (—) [{wins}/{n}]" if math.isnan(h) else f"{m:.3f} ± {h:.3f} [{wins}/{n}]"

    lines = [f"\n\nMatched readouts, paired by seed against {control} (mean ± 95% t-interval of the difference in "
             f"{key}; in brackets, on how many seeds the arm is higher): at the fewest optimizer updates any arm "
             "of the seed makes, at the least training compute (seconds of every timed phase but validation "
             "and checkpoints, each second once) any arm of the seed spends; and the env steps each arm needs "
             f"to reach {control}'s final {key} (median over the seeds that reach it within the {budget}-step budget, "
             "linear between validation points)\n",
             "| arm | at equal updates | at equal compute | env steps to reach the control's final | reached |",
             "|---|---|---|---|---|"]
    mixed, unknown = res[control]["compute_mixed_machines"], res[control]["compute_unrecorded_machines"]
    if mixed:
        lines[0] += (f"\nAt equal compute, {len(mixed)} seed(s) are left out because their arms ran on different "
                     f"machines (source.json, or the study's machines.md): {mixed}\n")
    if unknown:
        lines[0] += (f"\nAt equal compute, {len(unknown)} seed(s) are left out because no machine is recorded for "
                     f"some of their arms (neither source.json nor a machines.md beside the runs): {unknown}\n")
    js = {}
    for label, r in res.items():
        med, ok, n, steps = r["reach"]
        reach = "—" if math.isnan(med) else f"{med:.0f}"
        up = "(control)" if label == control else cell(r["updates"])
        co = "(control)" if label == control else cell(r["compute"], bool(mixed or unknown))
        lines.append(f"| {label} | {up} | {co} | {reach} | {ok}/{n} |")
        js[label] = {"reach_median_env_steps": med, "reached": ok, "seeds": n, "reach_per_seed": steps}
        for x in ("updates", "compute"):
            if label != control and r[x] is not None:
                m, h, wins, nn, d = r[x]
                js[label][f"at_equal_{x}"] = {"mean": m, "ci95": h, "higher": wins, "seeds": nn, "per_seed": d}
    return "\n".join(lines), js
