"""HGPO: hierarchy-of-groups policy optimisation (``hgpo``; ICLR 2026, verl-agent ``recipe/hgpo``).

For every turn, HGPO compares its discounted return with the other turns of the same episode group
that share its recent *history* of env states: level k holds the turns whose last k ``state_key``
values (the current state and the k−1 before it) are identical, for k = 1..K+1 with K the prompt's
history window (k = 1 is GiGPO's anchor-state group; level k exists at step t only when k ≤ t+1).
Each level with at least two members gives a group-relative advantage (population std in
``mean_std_norm``); the turn's advantage is the average of its per-level advantages weighted by
(k+1)^α over the levels it keeps. An optional base item (level 0, weight 1) is the episode-level
advantage of GiGPO's Eq. 3. A turn left with nothing gets 0: HGPO has no episode term by default.

Everything is vectorised: the history key of level k is built from level k−1 with one ``np.unique``
over all turns, so the cost is O(K · num_turns log num_turns) with no Python loop over turns.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from agentgym.errors import ConfigError
from agentgym.rollout.records import EpisodeGroup
from agentgym.training.api import (
    NormMode,
    TurnTable,
    discounted_returns,
    episode_advantages,
    group_mean_std,
    register_algorithm,
)


@dataclass(frozen=True)
class HGPOArgs:
    """Arguments of ``hgpo`` (defaults: the reference's ``hgpo_trainer.yaml`` and scripts)."""

    history_length: int = 2
    """K: levels k = 1..K+1 compare the last k states. Match it to ``rollout.window_turns`` so the
    deepest level is the history the prompt shows (the reference ties the two)."""
    gamma: float = 0.95
    """Discount of the step returns G_t = r_t + γ G_{t+1}."""
    mode: NormMode = "mean_std_norm"
    """``mean_norm``: G − mean; ``mean_std_norm``: (G − mean) / (population std + ε)."""
    length_weight_alpha: float = 1.0
    """α of the level weights (k+1)^α; 0 weighs every kept level equally, larger α favours deeper
    (more consistent) histories."""
    base_group: bool = False
    """Add the episode-level advantage as a level-0 item with weight 1 (off in every reference script)."""
    episode_baseline: Literal["trajectory", "turn"] = "trajectory"
    """Baseline of the base item, as in ``gigpo``: over the group's trajectories (GiGPO Eq. 3) or over
    its turns (verl-agent's length-weighted statistics)."""
    invalid_action_penalty: float = 0.1
    """λ subtracted from the step return (and the base item's score) of a turn with an invalid action."""
    epsilon: float = 1e-6
    """Added to the std in ``mean_std_norm``."""
    zero_tolerance: float = 1e-8
    """Per-level advantages with |a| ≤ this are dropped before weighting (see ``weighted_levels``)."""

    def __post_init__(self) -> None:
        if isinstance(self.history_length, bool) or self.history_length < 0:
            raise ConfigError(f"HGPOArgs.history_length must be an integer >= 0, got {self.history_length!r}")
        if not 0.0 <= self.gamma <= 1.0:
            raise ConfigError(f"HGPOArgs.gamma must be in [0, 1], got {self.gamma}")
        if self.zero_tolerance < 0 or self.epsilon < 0:
            raise ConfigError("HGPOArgs.zero_tolerance and HGPOArgs.epsilon must be >= 0")


def history_groups(table: TurnTable, num_levels: int) -> list[np.ndarray]:
    """Ids of the history-consistent groups of every turn, one array per level k = 1..num_levels.

    ``ids[k-1][i]`` is the same for two turns of one episode group exactly when their last k states
    are equal; it is −1 where the turn has fewer than k states behind it (step < k−1). State ids are
    already unique per (group, state_key), so groups never mix tasks.

    Example (two trajectories A→B→C and B→B→C; the third turns share the last 2 states but not 3):
        >>> from agentgym.rollout.records import Trajectory, Turn
        >>> def traj(*keys): return Trajectory([Turn([], [], [], 0.0, k) for k in keys], "t", 0)
        >>> table = TurnTable.from_groups([EpisodeGroup("g", "t", 0,
        ...                                             [traj("A", "B", "C"), traj("B", "B", "C")])])
        >>> [ids.tolist() for ids in history_groups(table, 3)]
        [[0, 1, 2, 1, 1, 2], [-1, 0, 2, -1, 1, 2], [-1, -1, 0, -1, -1, 1]]
    """
    n = table.num_turns
    levels = [table.state.astype(np.int64)]
    has_previous = table.step > 0  # turns are stored contiguously and in order within a trajectory
    previous = np.maximum(np.arange(n) - 1, 0)
    num_states = int(table.state.max()) + 1 if n else 0
    for _ in range(1, num_levels):
        behind = np.where(has_previous, levels[-1][previous], -1)
        valid = behind >= 0
        # The last-k history is (the last-(k−1) history of the previous turn, this turn's state).
        pair = behind[valid] * num_states + table.state[valid]
        ids = np.full(n, -1, dtype=np.int64)
        if pair.size:
            ids[valid] = np.unique(pair, return_inverse=True)[1].reshape(-1)
        levels.append(ids)
    return levels


def level_advantages(ids: np.ndarray, returns: np.ndarray, mode: NormMode, epsilon: float
                     ) -> tuple[np.ndarray, np.ndarray]:
    """One level's group-relative advantages and which turns have one (a group of ≥ 2 members).

    Unlike GiGPO, HGPO normalises by the *population* std (verl-agent's ``unbiased=False``).

    Returns:
        ``(advantage, present)``, both shape (num_turns,); advantage is 0 where not present.
    """
    member = ids >= 0
    advantage = np.zeros(ids.shape[0])
    present = np.zeros(ids.shape[0], dtype=bool)
    if not member.any():
        return advantage, present
    group, values = ids[member], returns[member]
    count, mean, _ = group_mean_std(group, values)
    squares = np.bincount(group, weights=(values - mean[group]) ** 2, minlength=count.shape[0])
    std = np.sqrt(squares / np.maximum(count, 1))
    centred = values - mean[group]
    if mode == "mean_std_norm":
        scale = std[group] + epsilon
        centred = centred / np.where(scale > 0, scale, 1.0)
    elif mode != "mean_norm":
        raise ConfigError(f"unknown normalisation mode {mode!r}; use 'mean_norm' or 'mean_std_norm'")
    advantage[member] = centred
    present[member] = count[group] > 1
    return np.where(present, advantage, 0.0), present


def weighted_levels(items: np.ndarray, present: np.ndarray, weights: np.ndarray, zero_tolerance: float
                    ) -> np.ndarray:
    """Σ_k w_k a_k / Σ_k w_k over the kept items of each turn; 0 where none is kept.

    An item is kept when its level is present and |a_k| > ``zero_tolerance``. The reference keeps
    items that are not exactly 0.0; an advantage that should be 0 (a member equal to its group's mean)
    comes out of float arithmetic as ±1e-17 or exactly 0 depending on rounding, and that flip changes
    the other levels' weights, so a tolerance implements the intent (drop zero-variance items).
    The reference also adds 1e-6 to the weight sum to avoid dividing by zero; here turns with no
    kept item are set to 0 explicitly, so the weights sum exactly to 1.

    Args:
        items: (num_turns, num_levels) per-level advantages.
        present: (num_turns, num_levels) bool, the level has a group of ≥ 2 for this turn.
        weights: (num_levels,) level weights.
        zero_tolerance: |a| at or below which an item is dropped.

    Example:
        >>> items = np.array([[0.5, 1e-17, -0.2], [0.0, 0.0, 0.0]])   # 1e-17: a rounding "zero"
        >>> weighted_levels(items, np.ones((2, 3), bool), np.array([2.0, 3.0, 4.0]), 1e-8).round(4).tolist()
        [0.0333, 0.0]
    """
    kept = present & (np.abs(items) > zero_tolerance)
    weight = np.where(kept, weights[None, :], 0.0)
    total = weight.sum(axis=1)
    weighted = (weight * np.where(kept, items, 0.0)).sum(axis=1)
    return np.where(total > 0, weighted / np.where(total > 0, total, 1.0), 0.0)


def hgpo_advantages(groups: Sequence[EpisodeGroup], args: HGPOArgs) -> np.ndarray:
    """Per-turn HGPO advantages, shape (num_turns,), order group → trajectory → turn.

    Example (one task, two trajectories from state "s"; the winner moved to "w" and got 1, the other
    stayed; γ = 1, K = 1, ``mean_norm``. Level 1: the three turns in "s" have returns [1, 0, 0],
    mean 1/3; "w" is a singleton. Level 2: the histories (s, w) and (s, s) are singletons. So the
    winner's turn in "w" keeps nothing and gets 0):
        >>> from agentgym.rollout.records import Trajectory, Turn
        >>> win = Trajectory([Turn([], [], [], 0.0, "s"), Turn([], [], [], 1.0, "w")], "t", 0)
        >>> lose = Trajectory([Turn([], [], [], 0.0, "s"), Turn([], [], [], 0.0, "s")], "t", 0)
        >>> args = HGPOArgs(history_length=1, gamma=1.0, mode="mean_norm", invalid_action_penalty=0.0)
        >>> np.round(hgpo_advantages([EpisodeGroup("g", "t", 0, [win, lose])], args), 4).tolist()
        [0.6667, 0.0, -0.3333, -0.3333]
    """
    table = TurnTable.of(groups)
    num_levels = args.history_length + 1
    returns = discounted_returns(table, args.gamma) - args.invalid_action_penalty * table.invalid
    columns, present = [], []
    for ids in history_groups(table, num_levels):
        advantage, has = level_advantages(ids, returns, args.mode, args.epsilon)
        columns.append(advantage)
        present.append(has)
    weights = (np.arange(1, num_levels + 1, dtype=np.float64) + 1.0) ** args.length_weight_alpha
    if args.base_group:
        episode = episode_advantages(table, args.invalid_action_penalty, args.mode, args.epsilon,
                                     baseline=args.episode_baseline)
        columns.insert(0, episode)
        present.insert(0, np.ones(table.num_turns, dtype=bool))
        weights = np.r_[1.0, weights]  # level 0: (0 + 1)^α = 1
    if table.num_turns == 0:
        return np.zeros(0)
    return weighted_levels(np.stack(columns, axis=1), np.stack(present, axis=1), weights, args.zero_tolerance)


register_algorithm("hgpo", hgpo_advantages, HGPOArgs,
                   description="HGPO: weighted advantages over history-consistent step groups "
                               "(levels 1..K+1)")
