"""``TurnTable`` (the flat, per-turn numpy view of a batch of groups), ``Batch`` (an iteration's groups with
their table) and vectorised group statistics.

Estimators work on a ``TurnTable`` so no estimator loops over turns in Python: every quantity is an
array of shape (num_turns,) in the order group → trajectory → turn, and group statistics are
``np.bincount`` reductions over integer group ids. The same table is what update plans split an
iteration's turns on (``agentgym.training.api.plan``) and where packing reads each row's turn position:
the loop builds one ``Batch`` per iteration and passes it, with its table, to the estimator and the update.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, overload

import numpy as np

from agentgym.rollout.records import EpisodeGroup

NormMode = Literal["mean_norm", "mean_std_norm"]


@dataclass(frozen=True)
class TurnTable:
    """Per-turn arrays of a batch, shape (num_turns,) each, order group → trajectory → turn."""

    group: np.ndarray
    """int64: index of the turn's episode group."""
    trajectory: np.ndarray
    """int64: global index of the turn's trajectory (0..num_trajectories-1)."""
    step: np.ndarray
    """int64: position of the turn in its trajectory (0-based)."""
    reward: np.ndarray
    """float64: env reward of the step."""
    invalid: np.ndarray
    """bool: the action was invalid."""
    state: np.ndarray
    """int64: id of (group, state_key); equal ids = same env state within the same group."""
    trajectory_group: np.ndarray
    """int64, shape (num_trajectories,): the group of each trajectory."""
    trajectory_return: np.ndarray
    """float64, shape (num_trajectories,): undiscounted return of each trajectory."""
    trajectory_id: np.ndarray
    """object (str): the turn's ``Trajectory.trajectory_id`` (update plans key per-trajectory state on it)."""
    copied: np.ndarray
    """bool: the turn is a fork's copy of a turn that its parent trajectory (or an ancestor) also holds
    (``step < Trajectory.fork_turn``): the same tokens in the same context."""

    @property
    def num_turns(self) -> int:
        return int(self.group.shape[0])

    @classmethod
    def of(cls, groups: Sequence[EpisodeGroup]) -> TurnTable:
        """The table of ``groups``: the one a ``Batch`` carries (what the loop hands an estimator), else a new
        one (an estimator called on a plain list of groups).

        Changed in v0.1: answers the batch's table instead of remembering the last table it built, because the
        loop now passes the table with the batch.

        Example:
            >>> from agentgym.rollout.records import EpisodeGroup, Trajectory, Turn
            >>> groups = [EpisodeGroup("g", "t", 0, [Trajectory([Turn([], [], [], 1.0, "s")], "t", 0)])]
            >>> batch = Batch.of(groups)
            >>> TurnTable.of(batch) is batch.table, TurnTable.of(groups).num_turns
            (True, 1)
        """
        return groups.table if isinstance(groups, Batch) else cls.from_groups(groups)

    @classmethod
    def from_groups(cls, groups: Sequence[EpisodeGroup]) -> TurnTable:
        """A new table of ``groups``."""
        trajectories = [t for g in groups for t in g.trajectories]
        lengths = np.fromiter((len(t.turns) for t in trajectories), dtype=np.int64, count=len(trajectories))
        traj_group = np.repeat(np.arange(len(groups), dtype=np.int64),
                               [len(g.trajectories) for g in groups]).astype(np.int64)
        turns = [turn for t in trajectories for turn in t.turns]
        reward = np.fromiter((t.reward for t in turns), dtype=np.float64, count=len(turns))
        invalid = np.fromiter((t.invalid for t in turns), dtype=bool, count=len(turns))
        trajectory = np.repeat(np.arange(len(trajectories), dtype=np.int64), lengths)
        starts = np.cumsum(lengths) - lengths
        step = np.arange(len(turns), dtype=np.int64) - np.repeat(starts, lengths)
        group = traj_group[trajectory] if len(turns) else np.zeros(0, dtype=np.int64)
        keys = np.array([t.state_key for t in turns], dtype=object)
        state = _group_local_ids(group, keys)
        traj_return = np.bincount(trajectory, weights=reward, minlength=len(trajectories))
        ids = np.array([t.trajectory_id for t in trajectories], dtype=object)
        fork_turn = np.fromiter((t.fork_turn or 0 for t in trajectories), dtype=np.int64,
                                count=len(trajectories))
        trajectory_id = ids[trajectory] if len(turns) else np.zeros(0, dtype=object)
        copied = step < fork_turn[trajectory] if len(turns) else np.zeros(0, dtype=bool)
        return cls(group, trajectory, step, reward, invalid, state, traj_group, traj_return, trajectory_id,
                   copied)


@dataclass(frozen=True)
class Batch(Sequence[EpisodeGroup]):
    """An iteration's groups, in order, with their ``TurnTable`` built once: what the loop hands the estimator
    (as its ``groups``: a sequence of groups like any other) and the update.

    Example:
        >>> from agentgym.rollout.records import EpisodeGroup, Trajectory, Turn
        >>> runs = [Trajectory([Turn([], [], [], 1.0, "s")] * 2, "t", 0)]
        >>> batch = Batch.of([EpisodeGroup("g", "t", 0, runs)])
        >>> len(batch), batch[0].group_id, batch.table.num_turns
        (1, 'g', 2)
    """

    groups: tuple[EpisodeGroup, ...]
    """The groups, order of the table's rows."""
    table: TurnTable
    """Their table (``TurnTable.from_groups(groups)``)."""

    @classmethod
    def of(cls, groups: Sequence[EpisodeGroup]) -> Batch:
        """``groups`` and their new table."""
        return cls(tuple(groups), TurnTable.from_groups(groups))

    @overload
    def __getitem__(self, index: int) -> EpisodeGroup: ...
    @overload
    def __getitem__(self, index: slice) -> tuple[EpisodeGroup, ...]: ...
    def __getitem__(self, index: int | slice) -> EpisodeGroup | tuple[EpisodeGroup, ...]:
        return self.groups[index]

    def __len__(self) -> int:
        return len(self.groups)


def _group_local_ids(group: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """Integer ids of (group, key) pairs: same key in different groups gets different ids."""
    if keys.size == 0:
        return np.zeros(0, dtype=np.int64)
    _, key_code = np.unique(keys.astype(str), return_inverse=True)
    combined = group * (int(key_code.max()) + 1) + key_code.reshape(-1)
    _, state = np.unique(combined, return_inverse=True)
    return state.reshape(-1).astype(np.int64)


def group_mean_std(ids: np.ndarray, values: np.ndarray, num_ids: int | None = None
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-id count, mean and unbiased (n−1) std of ``values``; std is 0 for ids seen once.

    A group whose values are all equal gets exactly that value as its mean and exactly 0 as its
    std (a float sum divided by the count can miss the value by a rounding error, which
    normalisation would then blow up into an O(1) advantage).

    Example:
        >>> count, mean, std = group_mean_std(np.array([0, 0, 1]), np.array([1.0, 3.0, 5.0]))
        >>> count.tolist(), mean.tolist(), np.round(std, 4).tolist()
        ([2, 1], [2.0, 5.0], [1.4142, 0.0])
        >>> # sum/count would give 0.1000...02
        >>> float(group_mean_std(np.zeros(3, dtype=int), np.full(3, 0.1))[1][0])
        0.1
    """
    num_ids = int(ids.max()) + 1 if num_ids is None and ids.size else (num_ids or 0)
    count = np.bincount(ids, minlength=num_ids)
    safe = np.maximum(count, 1)
    mean = np.bincount(ids, weights=values, minlength=num_ids) / safe
    low = np.full(num_ids, np.inf)
    high = np.full(num_ids, -np.inf)
    np.minimum.at(low, ids, values)
    np.maximum.at(high, ids, values)
    constant = (count > 0) & (low == high)
    mean = np.where(constant, low, mean)
    squares = np.bincount(ids, weights=(values - mean[ids]) ** 2, minlength=num_ids)
    std = np.sqrt(squares / np.maximum(count - 1, 1))
    return count, mean, std


def normalize(values: np.ndarray, mean: np.ndarray, std: np.ndarray, mode: NormMode, epsilon: float
              ) -> np.ndarray:
    """``values − mean`` (``mean_norm``) or ``(values − mean) / (std + epsilon)`` (``mean_std_norm``)."""
    centred = values - mean
    if mode == "mean_norm":
        return centred
    if mode == "mean_std_norm":
        scale = std + epsilon
        # All-equal groups have centred == 0 exactly (see group_mean_std); dividing by 1 there keeps
        # epsilon=0 from making NaNs.
        return centred / np.where(scale > 0, scale, 1.0)
    raise ValueError(f"unknown normalisation mode {mode!r}; use 'mean_norm' or 'mean_std_norm'")


def last_turns(table: TurnTable) -> np.ndarray:
    """Whether each turn is its trajectory's last, shape (num_turns,) (turns are stored contiguously per
    trajectory, in order).

    Example:
        >>> from agentgym.rollout.records import EpisodeGroup, Trajectory, Turn
        >>> runs = [Trajectory([Turn([], [], [], 0.0, "s")] * k, "t", 0) for k in (2, 1)]
        >>> last_turns(TurnTable.from_groups([EpisodeGroup("g", "t", 0, runs)])).tolist()
        [False, True, True]
    """
    return np.r_[table.trajectory[1:] != table.trajectory[:-1], True] if table.num_turns else \
        np.zeros(0, dtype=bool)


def discounted_returns(table: TurnTable, gamma: float) -> np.ndarray:
    """G_t = r_t + γ G_{t+1} within each trajectory, shape (num_turns,), computed exactly.

    The recursion runs backwards over the step index — one vectorised update per step, across all
    trajectories at once — so it costs O(num_turns) arithmetic plus one Python iteration per step of
    the longest trajectory. (Scaling rewards by γ^k and dividing a suffix sum by γ^t cancels
    catastrophically at small γ and long trajectories; this form never divides.)

    Example:
        >>> from agentgym.rollout.records import EpisodeGroup, Trajectory, Turn
        >>> turns = [Turn([], [], [], r, "s") for r in (0.0, 0.0, 1.0)]
        >>> table = TurnTable.from_groups([EpisodeGroup("g", "t", 0, [Trajectory(turns, "t", 0)])])
        >>> discounted_returns(table, 0.5).tolist()
        [0.25, 0.5, 1.0]
    """
    n = table.num_turns
    returns = np.zeros(n)
    if n == 0:
        return returns
    # The next turn of the same trajectory (turns are stored contiguously, in order), or -1.
    following = np.arange(1, n + 1)
    following[last_turns(table)] = -1
    by_step = np.argsort(table.step, kind="stable")
    bounds = np.cumsum(np.bincount(table.step))
    starts = np.r_[0, bounds[:-1]]
    for start, stop in zip(starts[::-1], bounds[::-1], strict=True):
        turns = by_step[start:stop]
        after = following[turns]
        later = np.where(after >= 0, returns[np.maximum(after, 0)], 0.0)
        returns[turns] = table.reward[turns] + gamma * later
    return returns


def episode_advantages(table: TurnTable, invalid_action_penalty: float, mode: NormMode, epsilon: float,
                       baseline: Literal["trajectory", "turn"] = "trajectory") -> np.ndarray:
    """Group-relative episode advantage of every turn, shape (num_turns,).

    ``"trajectory"`` (GRPO / GiGPO paper Eq. 3): the trajectory's return normalised by the mean (and
    std for ``mean_std_norm``) of the group's trajectory returns, minus ``invalid_action_penalty``
    on turns whose own action was invalid. ``"turn"`` (verl-agent's length-weighted variant): each
    turn's score is its trajectory's return minus the penalty, normalised by the statistics of the
    scores of every turn in the group, so a long trajectory counts once per turn. A group with a
    single trajectory has no baseline: its advantage is 0.
    """
    penalty = invalid_action_penalty * table.invalid
    num_groups = int(table.trajectory_group.max()) + 1 if table.trajectory_group.size else 0
    if baseline == "trajectory":
        members, mean, std = group_mean_std(table.trajectory_group, table.trajectory_return, num_groups)
        # The penalty is added after normalising: the statistics are over trajectory returns,
        # which do not contain it, so dividing it by a group's std would blow it up to λ/ε in
        # groups whose returns are all equal (σ = 0).
        returns = table.trajectory_return[table.trajectory]
        advantage = normalize(returns, mean[table.group], std[table.group], mode, epsilon) - penalty
    elif baseline == "turn":
        score = table.trajectory_return[table.trajectory] - penalty
        _, mean, std = group_mean_std(table.group, score, num_groups)
        members = np.bincount(table.trajectory_group, minlength=num_groups)
        advantage = normalize(score, mean[table.group], std[table.group], mode, epsilon)
    else:
        raise ValueError(f"unknown episode baseline {baseline!r}; use 'trajectory' or 'turn'")
    return np.where(members[table.group] > 1, advantage, 0.0)
