"""curves.png of `freshper compare`: one panel per thing the comparison's runs logged, none empty.

Training success with 95% bands always; where some arm logged it: eval success; for replay arms,
KL(mu || pi) per token of replayed trajectories against their age, the shares of replayed
trajectories by age and the IS-weight ESS over training; for a lagged comparison (some batch
older than the weights that train on it), the shares of trained batches by age per arm, the
episodes the gate dropped and the weight the decay gave each age; for a tau sweep, the AUCs
against tau. A panel holds the arms that logged its data, and is drawn only if one did.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from ..train.intervals import t975
from ..train.metrics import points
from .replay_stats import age_shares, kl_by_age
from .staleness import batch_age_shares, weight_by_age

LABELS = {"success": ("environment steps", "training success, mean and 95% band"),
          "eval_success": ("environment steps", "eval success (validation states), mean and 95% band"),
          "kl": ("age of the replayed trajectory (iterations; 0 drawn at 0.5)", "KL(mu || pi) per token, mean"),
          "ages": ("age bin of replayed trajectories (lowest age; 0 drawn at 0.5)", "share of replayed trajectories"),
          "ess": ("environment steps", "IS-weight ESS fraction, mean over seeds"),
          "batch_ages": ("age of the trained batch (versions)", "share of trained on-policy batches"),
          "dropped": ("environment steps", "episodes the gate dropped, cumulative, mean over seeds"),
          "weights": ("age of the trained batch (versions)", "the decay's weight (batch_weight), mean"),
          "tau": ("tau (iterations)", "AUC, mean and 95% interval")}


def curve(rows: list[dict], grid: np.ndarray, key: str = "success") -> np.ndarray:
    """`key` interpolated onto env-step `grid` (placed as metrics.points places it); rows without
    `key` are skipped."""
    pts = points(rows, key)
    if not pts:
        return np.full(grid.shape, np.nan)
    x, y = np.array(pts, dtype=float).T
    return np.interp(grid, x, y)


def _smooth(c: np.ndarray, k: int) -> np.ndarray:
    """Moving average over k grid points (9 of 201: 4.5% of the budget); edges padded."""
    return np.convolve(np.pad(c, (k // 2, k // 2), mode="edge"), np.ones(k) / k, "valid")


def _bands(items: list, grid: np.ndarray, key: str, k: int):
    """(mean, 95% half-width) over seeds of `key`'s curve smoothed over k grid points, or None
    where no seed logged it."""
    curves = np.stack([curve(rows, grid, key) for _, rows, _ in items])
    if np.isnan(curves).all():
        return None
    smooth = np.stack([_smooth(c, k) for c in curves])
    m = np.nanmean(smooth, 0)
    n = len(items)
    return m, (t975(n - 1) * np.nanstd(smooth, 0, ddof=1) / math.sqrt(n) if n > 1 else 0 * m)


def panels(by_label: dict[str, list], summary: dict, budget: int, sweep: bool) -> dict[str, list[dict]]:
    """{panel: its lines}, only panels some arm has data for; a line is {x, y, label, and color,
    half (a 95% band around y), marker, yerr (error bars), or width and shift (bars) where it has
    them}."""
    grid = np.linspace(0, budget, 201)
    out: dict[str, list[dict]] = {}
    lagged = any(max(batch_age_shares(rows), default=0) > 0 for items in by_label.values() for _, rows, _ in items)
    for i, (label, items) in enumerate(by_label.items()):
        arm = {"label": label, "color": f"C{i}"}
        for key in ("success", "eval_success"):
            band = _bands(items, grid, key, 9 if key == "success" else 1)
            if band is not None:
                out.setdefault(key, []).append({**arm, "x": grid, "y": band[0], "half": band[1]})
        pooled = [r for _, rows, _ in items for r in rows]
        kl = kl_by_age(pooled)
        if kl:
            ages = [max(a, 0.5) for a in kl]  # age 0 drawn at 0.5 on the log axis
            out.setdefault("kl", []).append({**arm, "x": ages, "y": [v[0] for v in kl.values()], "marker": "o"})
            out.setdefault("ages", []).append({**arm, "x": ages, "y": list(age_shares(kl).values()), "marker": "o"})
        ess = _bands(items, grid, "is_ess", 9)
        if ess is not None:
            out.setdefault("ess", []).append({**arm, "x": grid, "y": ess[0]})
        shares = batch_age_shares(pooled)
        if lagged and shares:
            out.setdefault("batch_ages", []).append({**arm, "x": list(shares), "y": list(shares.values())})
        dropped = _bands(items, grid, "episodes_dropped_total", 1)
        if dropped is not None and dropped[0].max() > 0:
            out.setdefault("dropped", []).append({**arm, "x": grid, "y": dropped[0]})
        weights = weight_by_age(pooled)
        if any(w != 1.0 for w in weights.values()):
            out.setdefault("weights", []).append({**arm, "x": list(weights), "y": list(weights.values()),
                                                  "marker": "o"})
    bars = out.get("batch_ages", [])
    for j, line in enumerate(bars):  # side by side at each age: arms drawn with the same lags stay visible
        line["width"] = 0.8 / len(bars)
        line["shift"] = (j - (len(bars) - 1) / 2) * line["width"]
    if sweep:
        taus = [items[0][0]["tau"] for items in by_label.values()]
        for key, name in (("auc", "AUC (training success)"), ("auc_eval_success", "AUC (eval success)")):
            means = np.array([summary[label][key][0] for label in by_label])
            half = np.nan_to_num(np.array([summary[label][key][1] for label in by_label]))
            lower, upper = means - np.clip(means - half, 0, 1), np.clip(means + half, 0, 1) - means
            out.setdefault("tau", []).append({"label": name, "x": taus, "y": means, "yerr": [lower, upper]})
    return out


def _draw(ax, line: dict) -> None:
    if "width" in line:
        ax.bar(np.asarray(line["x"]) + line["shift"], line["y"], line["width"], color=line["color"],
               label=line["label"])
        return
    if "yerr" in line:
        ax.errorbar(line["x"], line["y"], yerr=line["yerr"], marker="o", capsize=3, label=line["label"])
        return
    ax.plot(line["x"], line["y"], marker=line.get("marker"), color=line.get("color"), label=line["label"])
    if "half" in line:  # the 95% interval of the mean, drawn within the feasible range [0, 1]
        m, h = line["y"], line["half"]
        ax.fill_between(line["x"], np.clip(m - h, 0, 1), np.clip(m + h, 0, 1), color=line.get("color"), alpha=0.2)


def _age_bin_ticks(ax) -> None:
    """The replay age bins' own ticks (0 drawn at 0.5, then 1, 2, 4, ...): plain numbers, no minor
    labels, which matplotlib adds (and overlaps) when the ages span less than a decade."""
    ax.set_xscale("log")
    lo, hi = ax.get_xlim()
    ticks = [0.5] + [2.0 ** i for i in range(0, 12) if 2.0 ** i <= max(hi, 1.0)]
    ax.set_xticks(ticks, ["0"] + [f"{t:g}" for t in ticks[1:]])
    ax.minorticks_off()
    ax.set_xlim(lo, hi)


def figure(by_label: dict[str, list], summary: dict, budget: int, sweep: bool, title: str = ""):
    """The matplotlib Figure of `panels`, three panels a row; `by_label`: {arm: [(job, rows, summary), ...]}."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    draws = panels(by_label, summary, budget, sweep)
    cols = min(3, len(draws))
    rows = math.ceil(len(draws) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 4 * rows), squeeze=False)
    for a in list(axes.flat)[len(draws):]:
        fig.delaxes(a)
    for ax, (key, lines) in zip(axes.flat, draws.items()):
        for line in lines:
            _draw(ax, line)
        ax.set_xlabel(LABELS[key][0])
        ax.set_ylabel(LABELS[key][1])
        ax.grid(alpha=0.3)
        if key in ("kl", "ages"):
            _age_bin_ticks(ax)
        if key == "tau":
            taus = draws["tau"][0]["x"]
            ax.set_xscale("log")
            ax.set_xticks(taus, [f"{t:g}" for t in taus])
            ax.minorticks_off()
        if key in ("batch_ages", "weights"):
            ax.xaxis.get_major_locator().set_params(integer=True)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.97))  # the title above the panels, not over them
    return fig


def plot(path: Path, by_label: dict[str, list], summary: dict, budget: int, sweep: bool) -> None:
    """Write `figure` to `path` (curves.png), titled by the comparison's folder."""
    import matplotlib.pyplot as plt

    fig = figure(by_label, summary, budget, sweep, title=Path(path).parent.name)
    fig.savefig(path, dpi=110)
    plt.close(fig)
