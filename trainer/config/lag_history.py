"""rollout.lag_probs from a run: the lag distribution of a run that already ran (an asynchronous
one, say), so that a lockstep run or study replays its staleness.

Every metrics row records `batch_age`: how many versions behind the weights that generated the
iteration's batch were when it reached its update. The distribution is the run's histogram of
those ages, P(lag = k) = (batches of age k) / (batches), k = 0..the largest age seen. Every batch
that reached its update counts, the ones the gate (algo.staleness gate) dropped included: the lag
is how old a batch arrives, and what a run does with an old batch is its own setting. The text
given is replaced by the probabilities, so a run's config.yaml records them and does not depend
on the other folder still existing.
"""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

MAX_LAGS = 65  # rollout.lag_probs holds P(lag=0)..P(lag=64): rollout.lag's range

ALLOWED = ("comma-separated probabilities P(lag=0),...,P(lag=K), or a run folder (or its metrics.jsonl) whose "
           "rows have batch_age")


def is_probabilities(text: str) -> bool:
    """Whether `text` is a list of numbers (checked further by the field's rule), not a path."""
    try:
        [float(x) for x in text.split(",")]
    except ValueError:
        return False
    return True


def batch_ages(metrics: Path) -> list[int]:
    """The `batch_age` of each row of a metrics.jsonl (rows without one skipped), in iterations' order."""
    ages = []
    for n, line in enumerate(metrics.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            raise ValueError(f"{metrics} line {n} is not JSON") from None
        if "batch_age" in row:
            ages.append(int(row["batch_age"]))
    return ages


def histogram(ages: list[int]) -> str:
    """The share of each age 0..max(ages), as rollout.lag_probs text: [0, 1, 1, 3] -> '0.25,0.5,0,0.25'."""
    counts, n = Counter(ages), len(ages)
    # 12 significant digits: the shares sum to 1 within 1e-10, and read back exactly as written
    return ",".join(f"{counts[k] / n:.12g}" for k in range(max(ages) + 1))


def resolve_lag_probs(text: str) -> str:
    """rollout.lag_probs as given -> as stored: probabilities (or empty) unchanged; a run folder
    or a metrics.jsonl -> its histogram of batch ages. ValueError naming the option otherwise."""
    if not text.strip() or is_probabilities(text):
        return text
    path = Path(text).expanduser()
    metrics = path / "metrics.jsonl" if path.is_dir() else path
    if not metrics.is_file():
        raise ValueError(f"rollout.lag_probs={text!r}: neither probabilities nor a run folder or metrics.jsonl "
                         f"(no such {'file' if path.is_dir() else 'file or folder'}: {metrics}); give {ALLOWED}")
    try:
        ages = batch_ages(metrics)
    except ValueError as e:
        raise ValueError(f"rollout.lag_probs={text!r}: {e}; give {ALLOWED}") from None
    if not ages:
        raise ValueError(f"rollout.lag_probs={text!r}: {metrics} has no rows with batch_age (a run from before "
                         f"runs recorded it?); give {ALLOWED}")
    if max(ages) >= MAX_LAGS:
        raise ValueError(f"rollout.lag_probs={text!r}: {metrics} has batch ages up to {max(ages)}, and lockstep "
                         f"draws lags up to {MAX_LAGS - 1}; give {ALLOWED}")
    return histogram(ages)
