"""GiGPO: group-in-group policy optimisation (``gigpo``; Feng et al. 2025, arXiv 2505.10978).

Everything that makes GiGPO GiGPO is here: the episode-level (macro) advantage over the group's
trajectories (Eq. 3), anchor-state step groups built from ``state_key`` inside each episode group
(§3.2), discounted step returns (Eq. 6), the step-level (micro) advantage (Eq. 7), and their
combination A = A^E + ω·A^S (Eq. 8). Invalid actions cost ``invalid_action_penalty`` in both the
episode score and the step return of the offending turn, after discounting (as verl-agent does).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from agentgym.rollout.records import EpisodeGroup
from agentgym.training.api import (
    NormMode,
    TurnTable,
    discounted_returns,
    episode_advantages,
    group_mean_std,
    normalize,
    register_algorithm,
)


@dataclass(frozen=True)
class GiGPOArgs:
    """Arguments of ``gigpo``."""

    gamma: float = 0.95
    """Discount of the step returns G_t = r_t + γ G_{t+1} (Eq. 6)."""
    mode: NormMode = "mean_norm"
    """``mean_norm`` (F_norm = 1, the paper's default) or ``mean_std_norm`` (divide by the std)."""
    step_advantage_weight: float = 1.0
    """ω in A = A^E + ω·A^S (Eq. 8)."""
    episode_baseline: Literal["trajectory", "turn"] = "trajectory"
    """``trajectory``: mean/std over the group's N trajectories (paper Eq. 3). ``turn``: over every
    turn of the group, so long trajectories weigh more (verl-agent's default)."""
    invalid_action_penalty: float = 0.1
    """λ subtracted from the episode score and the step return of a turn with an invalid action."""
    epsilon: float = 1e-6
    """Added to std in ``mean_std_norm``."""


def step_advantages(table: TurnTable, gamma: float, invalid_action_penalty: float, mode: NormMode,
                    epsilon: float) -> np.ndarray:
    """A^S: each turn's discounted return relative to the other turns taken from the same state.

    Anchor-state groups are the turns of one episode group whose ``state_key`` is equal, whatever
    the time step (§3.2). A state visited once has no baseline: its step advantage is 0.
    """
    returns = discounted_returns(table, gamma) - invalid_action_penalty * table.invalid
    num_states = int(table.state.max()) + 1 if table.num_turns else 0
    count, mean, std = group_mean_std(table.state, returns, num_states)
    advantage = normalize(returns, mean[table.state], std[table.state], mode, epsilon)
    return np.where(count[table.state] > 1, advantage, 0.0)


def gigpo_advantages(groups: Sequence[EpisodeGroup], args: GiGPOArgs) -> np.ndarray:
    """A = A^E + ω·A^S per turn (Eq. 8).

    Example (two trajectories of one task: they share the start state "s0"; the successful one
    moved to "s1" and got reward 1, the other bumped a wall and stayed; γ = 1, so A^E = ±0.5, and
    from "s0" the returns are [1, 0, 0], giving A^S = 1 − 1/3 and −1/3 twice; "s1" is a singleton):
        >>> from agentgym.rollout.records import Trajectory, Turn
        >>> win = Trajectory([Turn([], [], [], 0.0, "s0"), Turn([], [], [], 1.0, "s1")], "t", 0)
        >>> lose = Trajectory([Turn([], [], [], 0.0, "s0"), Turn([], [], [], 0.0, "s0")], "t", 0)
        >>> adv = gigpo_advantages([EpisodeGroup("g", "t", 0, [win, lose])], GiGPOArgs(gamma=1.0,
        ...                        invalid_action_penalty=0.0))
        >>> np.round(adv, 4).tolist()
        [1.1667, 0.5, -0.8333, -0.8333]
    """
    table = TurnTable.of(groups)
    episode = episode_advantages(table, args.invalid_action_penalty, args.mode, args.epsilon,
                                 baseline=args.episode_baseline)
    step = step_advantages(table, args.gamma, args.invalid_action_penalty, args.mode, args.epsilon)
    return episode + args.step_advantage_weight * step


register_algorithm("gigpo", gigpo_advantages, GiGPOArgs,
                   description="GiGPO: episode advantage + anchor-state step advantage")
