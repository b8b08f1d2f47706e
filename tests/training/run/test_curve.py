"""The learning-curve plot: measured held-out points only (markers, no line between evaluations), the
before-SFT point included, and the training curve smoothed with its raw values faint behind it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from agentgym.training.run.curve import learning_curve_figure, plot_learning_curve, smooth


def _eval(rate: float) -> dict:
    return {"success_rate": rate}


REPORT = {
    "algorithm": "gigpo", "env": "maze-v0", "iterations": 6,
    "history": [{"iteration": i + 1, "rollout/success_rate": r}
                for i, r in enumerate([0.0, 1.0, 0.0, 1.0, 1.0, 1.0])],
    "eval": {"before_sft": _eval(0.05), "before": _eval(0.3), "after": _eval(0.8)},
}
REPORT["history"][2]["eval/success_rate"] = 0.5  # a held-out evaluation at iteration 3


def test_smoothing_is_a_trailing_mean_over_the_window() -> None:
    # Hand-computed: the first values average what exists so far.
    assert smooth([0.0, 1.0, 0.0, 1.0, 1.0], window=2) == pytest.approx([0.0, 0.5, 0.5, 0.5, 1.0])
    assert smooth([0.2, 0.4, 0.9], window=3) == pytest.approx([0.2, 0.3, 0.5])
    assert smooth([0.3, 0.7], window=1) == pytest.approx([0.3, 0.7])
    assert smooth([], window=4) == []


def test_held_out_points_are_markers_only_and_include_before_sft() -> None:
    import matplotlib.pyplot as plt

    fig = learning_curve_figure(REPORT, window=2)
    try:
        lines = {line.get_label(): line for line in fig.axes[0].get_lines()}
        held_out = [line for label, line in lines.items() if label.startswith("held-out")]
        points = sorted((float(x), float(y)) for line in held_out
                        for x, y in zip(line.get_xdata(), line.get_ydata(), strict=True))
        assert points == [(0.0, 0.05), (0.0, 0.3), (3.0, 0.5), (6.0, 0.8)]
        for line in held_out:
            assert line.get_linestyle() == "None" and line.get_marker() not in (None, "None", "")
        raw = lines["training rollouts (raw)"]
        smoothed = next(line for label, line in lines.items() if label.startswith("training rollouts (mean"))
        assert raw.get_alpha() is not None and raw.get_alpha() <= 0.35
        assert (smoothed.get_alpha() or 1.0) > raw.get_alpha()
        assert list(np.asarray(smoothed.get_ydata())) == pytest.approx([0.0, 0.5, 0.5, 0.5, 1.0, 1.0])
    finally:
        plt.close(fig)


def test_the_plot_is_written(tmp_path: Path) -> None:
    plot_learning_curve({**REPORT, "eval": {**REPORT["eval"], "before_sft": None}}, tmp_path / "curve.png")
    assert (tmp_path / "curve.png").stat().st_size > 1000
