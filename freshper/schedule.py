"""Annealing schedules for the importance-sampling exponent beta."""
from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class LinearSchedule:
    """beta(step) goes linearly from `start` at step `begin` to `end` at step `begin + steps`,
    then stays at `end`. PER (Schaul et al., 2016) anneals beta towards 1 so that the bias the
    prioritised sampling introduces is fully corrected by the end of training."""

    start: float = 0.4
    end: float = 1.0
    steps: int = 1000
    begin: int = 0

    def __post_init__(self):
        for name in ("start", "end"):
            v = getattr(self, name)
            if not 0.0 <= v <= 1.0:
                raise ValueError(f"LinearSchedule.{name} must lie in [0, 1], got {v}")
        if self.steps <= 0:
            raise ValueError(f"LinearSchedule.steps must be > 0, got {self.steps}")

    def __call__(self, step: int) -> float:
        frac = min(max((step - self.begin) / self.steps, 0.0), 1.0)
        return self.start + frac * (self.end - self.start)

    def to_dict(self) -> dict:
        return {"kind": "linear", **asdict(self)}


def linear_beta(start: float = 0.4, end: float = 1.0, steps: int = 1000, begin: int = 0) -> LinearSchedule:
    """A beta schedule for `ReplayBuffer(beta=...)`: linear from `start` to `end` over `steps`."""
    return LinearSchedule(start=start, end=end, steps=steps, begin=begin)


def schedule_from_dict(d: dict) -> LinearSchedule:
    if d.get("kind") != "linear":
        raise ValueError(f"unknown beta schedule kind {d.get('kind')!r}; known: 'linear'")
    return LinearSchedule(**{k: v for k, v in d.items() if k != "kind"})
