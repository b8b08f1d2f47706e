"""Update plans: how one iteration's turns are split into sequential update phases (``UpdatePlan``,
``Phase``).

The updater runs the phases in order. Before each phase it recomputes the "old" log-probs of the
phase's rows with the current weights (so a later phase sees the weights earlier phases produced),
asks the plan to adjust the phase's advantages, runs the epochs × minibatches of the phase, and —
when the plan wants them — hands the plan the rows' log-probs after the phase, so it can carry
per-trajectory state forward (keyed by trajectory id, never by row position).

The default plan is one phase with every row: the ordinary PPO-style update. Plans split on the
iteration's ``TurnTable`` (trajectory ids, steps, groups, fork copies), the same table the estimator used.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from agentgym.training.api.turn_table import TurnTable


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
        >>> from agentgym.rollout.records import EpisodeGroup, Trajectory, Turn
        >>> def trajectory(name, length):
        ...     return Trajectory([Turn([1], [2], [-0.1], 0.0, "s")] * length, "t", 0, trajectory_id=name)
        >>> table = TurnTable.from_groups([EpisodeGroup("g", "t", 0,
        ...                                             [trajectory("a", 2), trajectory("b", 1)])])
        >>> [(p.name, p.rows.tolist()) for p in UpdatePlan().phases(table)]
        [('all', [0, 1, 2])]
    """

    wants_logprobs_after: bool = False
    """Compute the phase rows' log-probs after the phase's update and pass them to ``after_phase``."""

    def phases(self, table: TurnTable) -> list[Phase]:
        """The phases of one iteration, in the order they run."""
        return [Phase("all", np.arange(table.num_turns, dtype=np.int64))]

    def advantages(self, phase: Phase, table: TurnTable, advantages: np.ndarray) -> np.ndarray:
        """The advantages the phase trains with (``advantages`` are the phase rows' own, float64)."""
        return advantages

    def after_phase(self, phase: Phase, table: TurnTable, old_logprobs: list[np.ndarray],
                    new_logprobs: list[np.ndarray]) -> dict[str, float]:
        """Called after a phase when ``wants_logprobs_after``: per phase row, the response tokens'
        log-probs before (the recomputed old ones) and after the update. Returns metrics."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        """State carried across iterations and checkpoints (default: none)."""
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Reinstate ``state_dict()``."""
