"""The run's report (``report.json``) and learning-curve plot (``learning_curve.png``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def plot_learning_curve(report: dict[str, Any], path: Path) -> None:
    """Training-rollout success per iteration, with the held-out evals before and after."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    history = report["history"]
    fig, ax = plt.subplots(figsize=(7, 4))
    xs = [h["iteration"] for h in history]
    ax.plot(xs, [h["rollout/success_rate"] for h in history], label="training rollouts (sampled)")
    evals = [(h["iteration"], h["eval/success_rate"]) for h in history if "eval/success_rate" in h]
    points = [(0, report["eval"]["before"]["success_rate"]), *evals,
              (report["iterations"], report["eval"]["after"]["success_rate"])]
    ax.plot([p[0] for p in points], [p[1] for p in points], "o--", label="held-out eval (greedy)")
    ax.set_xlabel("iteration")
    ax.set_ylabel("success rate")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title(f"{report['algorithm']} on {report['env']}")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
