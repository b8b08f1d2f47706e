"""RLOO: REINFORCE leave-one-out baseline (``rloo``).

Â_i = R_i − (1/(G−1)) Σ_{j≠i} R_j (Ahmadian et al. 2024, "Back to Basics", Eq. 6), which equals
G/(G−1) · (R_i − mean_G R); broadcast to every turn of trajectory i.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from agentgym.rollout.records import EpisodeGroup
from agentgym.training.api import TurnTable, episode_advantages, register_algorithm


@dataclass(frozen=True)
class RLOOArgs:
    """Arguments of ``rloo``."""

    invalid_action_penalty: float = 0.0
    """Subtracted from the advantage of a turn whose action was invalid (that turn only)."""


def rloo_advantages(groups: Sequence[EpisodeGroup], args: RLOOArgs) -> np.ndarray:
    """Leave-one-out advantages; a group of one trajectory has no baseline and gets 0.

    Example:
        >>> from agentgym.rollout.records import Trajectory, Turn
        >>> def traj(r): return Trajectory([Turn([], [], [], r, "s")], "t", 0)
        >>> rloo_advantages([EpisodeGroup("g", "t", 0, [traj(1.0), traj(0.0), traj(0.0)])],
        ...                 RLOOArgs()).tolist()
        [1.0, -0.5, -0.5]
    """
    table = TurnTable.of(groups)
    centred = episode_advantages(table, 0.0, "mean_norm", 0.0)
    size = np.bincount(table.trajectory_group, minlength=len(groups)).astype(np.float64)[table.group]
    # The G/(G−1) factor turns mean-centring into leave-one-out; the penalty is subtracted after it,
    # so λ stays λ whatever the group size.
    penalty = args.invalid_action_penalty * table.invalid
    return np.where(size > 1, centred * size / np.maximum(size - 1.0, 1.0) - penalty, 0.0)


register_algorithm("rloo", rloo_advantages, RLOOArgs,
                   description="REINFORCE leave-one-out trajectory advantages")
