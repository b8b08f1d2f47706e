"""The run's learning-curve plot (``learning_curve.png``): training rollouts and held-out evaluations."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np


def smooth(values: Sequence[float], window: int) -> list[float]:
    """Trailing mean over the last ``window`` values (fewer at the start, where fewer exist).

    Example:
        >>> smooth([0.0, 1.0, 0.0, 1.0], window=2)
        [0.0, 0.5, 0.5, 0.5]
    """
    if not len(values):
        return []
    cumulative = np.concatenate([[0.0], np.cumsum(np.asarray(values, dtype=np.float64))])
    ends = np.arange(1, len(values) + 1)
    starts = np.maximum(0, ends - window)
    return ((cumulative[ends] - cumulative[starts]) / (ends - starts)).tolist()


def learning_curve_figure(report: dict[str, Any], window: int | None = None) -> Any:
    """The learning-curve figure of a report (a matplotlib ``Figure``; the caller closes it).

    Training-rollout success per iteration is drawn faint, with its trailing mean over ``window``
    iterations (default: a tenth of the run) on top. Held-out evaluations are drawn only where they
    were measured, as markers with no line between them (two evaluations say nothing about what lay
    between): before SFT and before RL at iteration 0, any ``eval.every`` evaluations, and after RL.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    history, evals = report["history"], report["eval"]
    window = window or max(1, min(len(history), max(3, round(len(history) / 10))))
    fig, ax = plt.subplots(figsize=(9, 4))
    xs = [h["iteration"] for h in history]
    success = [h["rollout/success_rate"] for h in history]
    ax.plot(xs, success, color="tab:blue", alpha=0.3, linewidth=1, label="training rollouts (raw)")
    ax.plot(xs, smooth(success, window), color="tab:blue", linewidth=2,
            label=f"training rollouts (mean of {window})")
    points = [(0, evals["before"]["success_rate"]),
              *((h["iteration"], h["eval/success_rate"]) for h in history if "eval/success_rate" in h),
              (report["iterations"], evals["after"]["success_rate"])]
    label = "held-out (greedy), after SFT" if evals.get("before_sft") else "held-out (greedy)"
    ax.plot([p[0] for p in points], [p[1] for p in points], linestyle="None", marker="o", markersize=7,
            color="tab:orange", label=label)
    if evals.get("before_sft"):
        points.append((0, evals["before_sft"]["success_rate"]))
        ax.plot([0], [points[-1][1]], linestyle="None", marker="s", markersize=7, markerfacecolor="white",
                color="tab:orange", label="held-out before SFT")
    for x, y in points:
        ax.annotate(f"{y:.0%}", (x, y), textcoords="offset points", xytext=(8, -3), fontsize=8)
    ax.set_xlabel("iteration")
    ax.set_ylabel("success rate")
    ax.set_ylim(-0.02, 1.08)
    ax.set_title(f"{report['algorithm']} on {report['env']}")
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)  # never over a point
    fig.tight_layout()
    return fig


def plot_learning_curve(report: dict[str, Any], path: Path) -> None:
    """Write ``learning_curve_figure(report)`` to ``path`` (PNG)."""
    import matplotlib.pyplot as plt

    fig = learning_curve_figure(report)
    try:
        fig.savefig(path, dpi=110)
    finally:
        plt.close(fig)
