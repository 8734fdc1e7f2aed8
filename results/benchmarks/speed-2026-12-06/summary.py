"""The figures README.md and BENCHMARKS.md give from this folder and ../game-67c-2026-12-06/ that
the bench's own tables do not print: each game iteration's seconds (the phases
bench_iteration_at sums, by iteration) with its share of groups with signal, each side's peak
memory from rss.txt, and the default jobs' validation, time, peak, replayed ratio and phase sums,
with the bf16 - float32 difference over seeds 0-3 (seeds 0-1 from the two earlier folders).
Memory in GB as kB / 1e6, as GNU time's figures elsewhere in BENCHMARKS.md.

    .venv/bin/python results/benchmarks/speed-2026-12-06/summary.py   # from the checkout's root
"""
import json
import re
import statistics
from pathlib import Path

from freshper.trainer.train.metrics import compute_seconds

HERE = Path(__file__).resolve().parent
UP = HERE.parent
T975_3 = 3.182  # Student t, 3 degrees of freedom, two-sided 95%


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def games():
    for folder in (UP / "game-67c-2026-12-06" / "game", HERE / "game-67c", HERE / "game-skip", HERE / "game-mb"):
        print(f"{folder.relative_to(UP)}: iteration, groups with signal, A s, B s, A/B; "
              "updates (on-policy + replay) A and B")
        a, b = rows(folder / "A0.jsonl"), rows(folder / "B0.jsonl")
        for ra, rb in zip(a, b):
            sa, sb = compute_seconds(ra), compute_seconds(rb)
            ua = ra["time_onpolicy_update"] + ra["time_replay_update"]
            ub = rb["time_onpolicy_update"] + rb["time_replay_update"]
            print(f"  {ra['iteration']}  {rb.get('groups_with_signal', '-')}  {sa:.1f}  {sb:.1f}  {sa / sb:.2f}x"
                  f"  {ua:.1f}  {ub:.1f}")
        for side, r in (("A", a), ("B", b)):  # iterations 1-2, as bench_iteration_at's medians
            steps = [r[i]["env_steps"] - r[i - 1]["env_steps"] for i in (1, 2)]
            gen = statistics.median(r[i]["time_generate"] for i in (1, 2))
            upd = statistics.median(r[i]["time_onpolicy_update"] + r[i]["time_replay_update"] for i in (1, 2))
            it = statistics.median(compute_seconds(r[i]) for i in (1, 2))
            print(f"  {side}, medians of iterations 1-2: generation {gen / statistics.mean(steps):.2f} s an env step, "
                  f"updates {upd / it:.0%} of the iteration")


def peaks():
    peak = {}
    for line in (UP / "game-67c-2026-12-06" / "rss.txt").read_text().splitlines():
        for pid, kb, python in re.findall(r"(\d+) (\d+) (\S+)", line.split(" ", 1)[1] if " " in line else ""):
            side = "67c351c" if "wt-67c" in python else "main"
            peak[side] = max(peak.get(side, 0), int(kb))
    print("game-67c-2026-12-06 peak resident memory:", {k: f"{v / 1e6:.2f} GB" for k, v in peak.items()})


def default_job(path: Path, time_file: Path | None) -> dict:
    r = rows(path)
    sums = {}
    for row in r:
        for k, v in row.items():
            if k.startswith("time_") and k != "time_rollout":
                sums[k[5:]] = sums.get(k[5:], 0.0) + v
    out = {"before": r[0]["eval_success"], "after": r[-1]["final_eval_success"],
           "ratio_it13": r[13].get("replay_ratio_mean"), **{k: round(v) for k, v in sums.items() if v > 1}}
    if time_file is not None and time_file.exists():
        text = time_file.read_text()
        out["wall"] = re.search(r"Elapsed .*: (\S+)", text).group(1)
        out["peak_gb"] = round(int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", text).group(1)) / 1e6, 2)
    return out


def default_jobs():
    runs = {("float32", 0): UP / "bf16-cpu-2026-12-05" / "default-float32.jsonl",
            ("float32", 1): UP / "bf16-cpu-2026-12-05" / "default-float32-seed1.jsonl",
            ("bfloat16", 0): UP / "bf16-masters-learning-2026-12-06" / "default-bfloat16-seed0.jsonl",
            ("bfloat16", 1): UP / "bf16-masters-learning-2026-12-06" / "default-bfloat16-seed1.jsonl"}
    for d in ("float32", "bfloat16"):
        for s in (2, 3):
            runs[(d, s)] = HERE / f"default-{d}-seed{s}.jsonl"
    after = {}
    for (d, s), path in sorted(runs.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        r = default_job(path, path.with_suffix(".time"))
        after[(d, s)] = r["after"]
        print(f"default job, {d}, seed {s} ({path.parent.name}):", r)
    diff = [after[("bfloat16", s)] - after[("float32", s)] for s in range(4)]
    m, sd = statistics.mean(diff), statistics.stdev(diff)
    half = T975_3 * sd / len(diff) ** 0.5
    mean = {d: statistics.mean(after[(d, s)] for s in range(4)) for d in ("float32", "bfloat16")}
    print(f"validation after, mean over seeds 0-3: float32 {mean['float32']:.3f}, bf16 {mean['bfloat16']:.3f}")
    print("bf16 - float32 by seed:", [round(x, 3) for x in diff],
          f"mean {m:+.3f}, 95% interval [{m - half:+.2f}, {m + half:+.2f}]")


if __name__ == "__main__":
    games()
    peaks()
    default_jobs()
