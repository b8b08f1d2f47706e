"""Shared settings and check of the end-to-end learning tests of the algorithms and options.

The learning tests are marked ``slow`` (CI runs them in their own step: ``make test-slow``). Each trains one
seed, the one its numbers were measured on, so it pins that run against regressions; it is named
``test_regression_pin_...`` and is no evidence that the method learns on other seeds. The seeds 0-2 numbers
are in benchmarks/README.md (``python benchmarks/algorithms.py``). The pins are measured at one torch thread,
which tests/conftest.py sets for every test process: a seeded run's numbers change with the thread count.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

#: Overrides on a quickstart preset for a shorter CPU run that still learns (half the iterations).
LEARN = ["iterations=30", "checkpoint_every=0"]

#: The quickstart's whole budget, for what learns more slowly (measured on seed 0 at 30 iterations:
#: LLDS on GiGPO 27% -> 36%, at 60: 27% -> 55%; SeeUPO, GRPO-like, 60 iterations: seed 0 27% -> 27%,
#: seed 2 28% -> 47%; at one torch thread EPO on GiGPO, 30 iterations: 27% -> 33%, at 60: 27% -> 55%).
#: Each pin's numbers are measured in a fresh process: ``make test-slow`` runs several in each of its
#: worker processes, and a run's result must not depend on what ran before it there.
LEARN_FULL = ["iterations=60", "checkpoint_every=0"]

#: The options (GSPO, DAPO, EPO, LLDS) are tested on top of GiGPO, the quickstart's algorithm: they are
#: usable with any algorithm, and GiGPO learns the quickstart fastest (their presets use GRPO, which
#: ``benchmarks/algorithms.py`` compares them with).
ON_GIGPO = ["algorithm.name=gigpo",
            "algorithm.args={gamma: 0.95, mode: mean_norm, invalid_action_penalty: 0.1}"]


def assert_learns(report: dict[str, Any], min_gain: float = 0.15) -> None:
    """Held-out success (greedy, 64 episodes on seeds training never sees) rose by ``min_gain``."""
    before, after = report["eval"]["before"]["success_rate"], report["eval"]["after"]["success_rate"]
    assert after - before >= min_gain, f"held-out success {before:.0%} -> {after:.0%}"


#: Overrides for a short run that exercises every phase (SFT, collect, update, held-out eval) in seconds.
SMALL = ["iterations=4", "checkpoint_every=0", "rollout.num_tasks=2", "rollout.group_size=4",
         "eval.num_episodes=4", "sft.num_episodes=4", "sft.num_epochs=2", "env.max_turns=4"]


def small(*overrides: str) -> list[str]:
    """``SMALL`` with ``key=value`` overrides: a key already in it takes the new value in place, others are
    added.

    >>> small("iterations=2", "model.device=cpu")[:2], small("model.device=cpu")[-1]
    (['iterations=2', 'checkpoint_every=0'], 'model.device=cpu')
    """
    values = {item.split("=", 1)[0]: item for item in SMALL}
    for item in overrides:
        values[item.split("=", 1)[0]] = item
    return list(values.values())
