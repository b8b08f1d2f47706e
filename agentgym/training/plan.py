"""Update plans: how one iteration's turns are split into sequential update phases (``UpdatePlan``, ``Phase``).

The updater runs the phases in order. Before each phase it recomputes the "old" log-probs of the
phase's rows with the current weights (so a later phase sees the weights earlier phases produced),
asks the plan to adjust the phase's advantages, runs the epochs × minibatches of the phase, and —
when the plan wants them — hands the plan the rows' log-probs after the phase, so it can carry
per-trajectory state forward (keyed by trajectory id, never by row position).

The default plan is one phase with every row: the ordinary PPO-style update.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class TurnIndex:
    """Per-turn facts an update plan may split on; arrays of shape (num_turns,) in estimator order."""

    trajectory_id: np.ndarray
    """object (str): the turn's ``Trajectory.trajectory_id``."""
    step: np.ndarray
    """int64: position of the turn in its trajectory (0-based)."""
    group: np.ndarray
    """int64: index of the turn's group in the batch."""
    copied: np.ndarray | None = None
    """bool: the turn is a fork's copy of a turn that its parent trajectory (or an ancestor) also
    holds (``step < Trajectory.fork_turn``): the same tokens in the same context; None: no forks."""


@dataclass(frozen=True)
class Phase:
    """One update phase: which turns it trains on."""

    name: str
    """For metrics (``phase/<name>/...``) and messages."""
    rows: np.ndarray
    """int64 indices into the iteration's turns (estimator order)."""


class UpdatePlan:
    """Base (and default) update plan: one phase with every turn; no per-phase adjustment.

    Subclasses override ``phases`` (and optionally ``advantages``/``after_phase``); set
    ``wants_logprobs_after = True`` to receive each phase's log-probs after its update.

    Example:
        >>> index = TurnIndex(np.array(["a", "a", "b"], dtype=object), np.array([0, 1, 0]), np.zeros(3, int))
        >>> [(p.name, p.rows.tolist()) for p in UpdatePlan().phases(index)]
        [('all', [0, 1, 2])]
    """

    wants_logprobs_after: bool = False
    """Compute the phase rows' log-probs after the phase's update and pass them to ``after_phase``."""

    def phases(self, index: TurnIndex) -> list[Phase]:
        """The phases of one iteration, in the order they run."""
        return [Phase("all", np.arange(index.step.shape[0], dtype=np.int64))]

    def advantages(self, phase: Phase, index: TurnIndex, advantages: np.ndarray) -> np.ndarray:
        """The advantages the phase trains with (``advantages`` are the phase rows' own, float64)."""
        return advantages

    def after_phase(self, phase: Phase, index: TurnIndex, old_logprobs: list[np.ndarray],
                    new_logprobs: list[np.ndarray]) -> dict[str, float]:
        """Called after a phase when ``wants_logprobs_after``: per phase row, the response tokens'
        log-probs before (the recomputed old ones) and after the update. Returns metrics."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        """State carried across iterations and checkpoints (default: none)."""
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Reinstate ``state_dict()``."""
