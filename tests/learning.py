"""Shared settings and check of the end-to-end learning tests of the algorithms and options."""

from __future__ import annotations

from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

#: Overrides on a quickstart preset for a short CPU run that still learns: fewer iterations, a smaller
#: held-out evaluation, no intermediate checkpoint.
LEARN = ["iterations=20", "checkpoint_every=0", "eval.num_episodes=32"]


def assert_learns(report: dict[str, Any], min_gain: float = 0.1) -> None:
    """Training success in the last 5 iterations beats the first 5 by ``min_gain``, and held-out success
    does not fall (greedy, on seeds training never sees)."""
    rates = [h["rollout/success_rate"] for h in report["history"]]
    first, last = sum(rates[:5]) / 5, sum(rates[-5:]) / 5
    before, after = report["eval"]["before"]["success_rate"], report["eval"]["after"]["success_rate"]
    assert last - first >= min_gain, f"training success {first:.0%} -> {last:.0%} ({rates})"
    assert after >= before, f"held-out success fell: {before:.0%} -> {after:.0%}"
