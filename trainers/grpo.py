"""GRPO and Dr.GRPO: group-relative trajectory advantages (``grpo``).

Every turn of a trajectory gets the trajectory's group-normalised return (Shao et al. 2024,
DeepSeekMath Eq. 3 applied to episode returns). ``normalize_std=False`` drops the std division:
Dr.GRPO (Liu et al. 2025, "Understanding R1-Zero-Like Training", §3.1).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from agentgym.rollout.records import EpisodeGroup
from agentgym.training.api import TurnTable, episode_advantages, register_algorithm


@dataclass(frozen=True)
class GRPOArgs:
    """Arguments of ``grpo``."""

    normalize_std: bool = True
    """Divide by the group's (unbiased) return std; False is Dr.GRPO."""
    epsilon: float = 1e-6
    """Added to the std so all-equal groups don't divide by zero (their advantage is 0)."""
    invalid_action_penalty: float = 0.0
    """Subtracted from the score of a turn whose action was invalid (that turn only)."""


def grpo_advantages(groups: Sequence[EpisodeGroup], args: GRPOArgs) -> np.ndarray:
    """Â_i = (R_i − mean_G R) / (std_G R + ε), broadcast to every turn of trajectory i.

    Example:
        >>> from agentgym.rollout.records import Trajectory, Turn
        >>> def traj(*rewards): return Trajectory([Turn([], [], [], r, "s") for r in rewards], "t", 0)
        >>> group = EpisodeGroup("g", "t", 0, [traj(0.0, 1.0), traj(0.0)])
        >>> grpo_advantages([group], GRPOArgs(normalize_std=False)).tolist()
        [0.5, 0.5, -0.5]
    """
    table = TurnTable.of(groups)
    mode = "mean_std_norm" if args.normalize_std else "mean_norm"
    return episode_advantages(table, args.invalid_action_penalty, mode, args.epsilon, baseline="trajectory")


register_algorithm("grpo", grpo_advantages, GRPOArgs,
                   description="GRPO (std-normalised) / Dr.GRPO (normalize_std=false) trajectory advantages")
