"""SeeUPO: sequence-level sequential update policy optimisation (``seeupo``; arXiv 2602.06554).

A T-turn episode is treated as T agents acting in sequence, one per turn index, sharing weights.
One iteration's rollouts are split into per-turn datasets aligned by trajectory, and the turns are
updated one at a time in reverse order (last turn first), HAML-style: each turn's advantages are
multiplied by how much the already-updated later turns' policies changed on the same trajectory.

- ``seeupo_advantages`` (the estimator): group-relative advantage without std (GRAE) among the
  trajectories of a group that have a turn at that index, then re-normalised over the whole batch
  of that turn index and clamped to ±3 (the reference's "special norm"; its launcher comment says
  group-std normalisation does not converge).
- ``SequentialTurnPlan`` (the update plan): one phase per turn index, last first; after each phase
  the clipped sequence ratio ρ_i = clip(exp(mean_t(logπ_new − logπ_old)), 1 ± 0.2) of each
  trajectory's turn is multiplied into that trajectory's cumulative ratio (clipped again to 1 ± 0.2),
  which scales the advantages of its earlier turns. Ratios are keyed by trajectory id, never by row
  position (the reference indexes them by row while its batch balancer reorders rows).
- The loss is GSPO's sequence-level ratio (``policy_loss="gspo"``).

Cost against ``grpo``: P phases (P = the longest trajectory's turns), each with its own old-log-prob
pass, ``optim.num_minibatches`` optimiser steps and one more no-grad pass for the ratios, so P × (2 +
num_minibatches) forward passes over smaller batches instead of 1 + num_minibatches over one batch
(``perf/update_phases`` logs P; ``benchmarks/algorithms.py --update-cost`` measures it). It also takes
P times as many optimiser steps, so it wants a smaller learning rate or fewer minibatches per phase
than GRPO (the quickstart preset: one step per phase at a third of GRPO's learning rate).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from agentgym.errors import ConfigError
from agentgym.rollout.records import EpisodeGroup
from agentgym.training.api import Phase, TurnTable, UpdatePlan, group_mean_std, register_algorithm


@dataclass(frozen=True)
class SeeUPOArgs:
    """Arguments of ``seeupo`` (defaults: the reference's ``qwen3-seeupo-appworld.yaml``)."""

    advantage_clip: float = 3.0
    """After batch re-normalisation, advantages are clamped to ±this."""
    std_floor: float = 1e-6
    """The batch re-normalisation divides by the std only when it exceeds this."""
    ratio_clip: float = 0.2
    """Each phase's sequence ratio is clipped to [1 − c, 1 + c] (``adv_clip_ratio_low/high``)."""
    cumulative_ratio_clip: float = 0.2
    """The running product of ratios is clipped again to [1 − c, 1 + c]."""
    invalid_action_penalty: float = 0.0
    """Subtracted from the advantage of a turn whose action was invalid, after the clamp."""

    def __post_init__(self) -> None:
        if not self.advantage_clip > 0:
            raise ConfigError(f"SeeUPOArgs.advantage_clip must be > 0, got {self.advantage_clip}")
        for name in ("ratio_clip", "cumulative_ratio_clip"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ConfigError(f"SeeUPOArgs.{name} must be in [0, 1), got {getattr(self, name)}")
        if self.std_floor < 0:
            raise ConfigError(f"SeeUPOArgs.std_floor must be >= 0, got {self.std_floor}")


def seeupo_advantages(groups: Sequence[EpisodeGroup], args: SeeUPOArgs) -> np.ndarray:
    """Per-turn advantages of the turn-index datasets, shape (num_turns,), order group → trajectory → turn.

    For the dataset of turn index k (the turns at step k): A_i = R_i − mean of R over the trajectories
    of i's group that have a turn k; then (A − mean)/std over the whole dataset (std unbiased; no
    division when std ≤ ``std_floor``), clamped to ±``advantage_clip``. R is the trajectory's return.

    Example (one group: returns 1, 0, 0, the winner took 2 turns, the others 1; at index 0 the GRAE
    advantages are 2/3, −1/3, −1/3, with std 0.5774, re-normalised to 1.1547, −0.5774, −0.5774; at
    index 1 the winner is alone, so 0):
        >>> from agentgym.rollout.records import Trajectory, Turn
        >>> def traj(*rewards): return Trajectory([Turn([], [], [], r, "s") for r in rewards], "t", 0)
        >>> group = EpisodeGroup("g", "t", 0, [traj(0.0, 1.0), traj(0.0), traj(0.0)])
        >>> np.round(seeupo_advantages([group], SeeUPOArgs()), 4).tolist()
        [1.1547, 0.0, -0.5774, -0.5774]
    """
    table = TurnTable.of(groups)
    if table.num_turns == 0:
        return np.zeros(0)
    outcome = table.trajectory_return[table.trajectory]
    width = int(table.step.max()) + 1
    # Group-relative advantage within (group, turn index): only trajectories that reached index k count.
    _, cell = np.unique(table.group * width + table.step, return_inverse=True)
    cell = cell.reshape(-1)
    _, cell_mean, _ = group_mean_std(cell, outcome)
    grae = outcome - cell_mean[cell]
    # Batch re-normalisation per turn index (the reference's per-turn-dataset "special norm").
    _, step_mean, step_std = group_mean_std(table.step, grae, width)
    centred = grae - step_mean[table.step]
    std = step_std[table.step]
    scaled = np.where(std > args.std_floor, centred / np.where(std > 0, std, 1.0), centred)
    clamped = np.clip(scaled, -args.advantage_clip, args.advantage_clip)
    return clamped - args.invalid_action_penalty * table.invalid


class SequentialTurnPlan(UpdatePlan):
    """One update phase per turn index, last first; later turns' clipped ratios scale earlier turns.

    Ratios live within one iteration: ``phases`` starts every trajectory at 1. ``state_dict`` keeps
    the last iteration's final cumulative ratio per trajectory id, for inspection in checkpoints.

    Example:
        >>> plan = SequentialTurnPlan(SeeUPOArgs())
        >>> from agentgym.rollout.records import Trajectory, Turn
        >>> turn = Turn([1], [2], [-0.1], 0.0, "s")
        >>> group = EpisodeGroup("g", "t", 0, [Trajectory([turn, turn], "t", 0, trajectory_id="a"),
        ...                                    Trajectory([turn], "t", 0, trajectory_id="b")])
        >>> table = TurnTable.from_groups([group])
        >>> [(p.name, p.rows.tolist()) for p in plan.phases(table)]
        [('turn1', [1]), ('turn0', [0, 2])]
        >>> last, first = plan.phases(table)
        >>> round(plan.after_phase(last, table, [np.zeros(2)], [np.full(2, 0.1)])["seeupo/ratio_mean"], 4)
        1.1052
        >>> plan.advantages(first, table, np.array([1.0, 1.0])).round(4).tolist()  # "a" scaled, "b" not
        [1.1052, 1.0]
    """

    wants_logprobs_after = True

    def __init__(self, args: SeeUPOArgs) -> None:
        self.args = args
        self._ids = np.zeros(0, dtype=object)
        self._code = np.zeros(0, dtype=np.int64)
        self._ratios = np.ones(0)

    def phases(self, table: TurnTable) -> list[Phase]:
        # Integer codes of the trajectory ids: every per-trajectory lookup goes through the id.
        ids, code = np.unique(table.trajectory_id.astype(str), return_inverse=True)
        self._ids, self._code, self._ratios = ids.astype(object), code.reshape(-1), np.ones(ids.shape[0])
        order = np.argsort(-table.step, kind="stable")
        steps, starts = np.unique(-table.step[order], return_index=True)
        bounds = np.r_[starts[1:], order.shape[0]]
        return [Phase(f"turn{-step}", np.sort(order[start:stop]))
                for step, start, stop in zip(steps, starts, bounds, strict=True)]

    def advantages(self, phase: Phase, table: TurnTable, advantages: np.ndarray) -> np.ndarray:
        return advantages * self._ratios[self._code[phase.rows]]

    def after_phase(self, phase: Phase, table: TurnTable, old_logprobs: list[np.ndarray],
                    new_logprobs: list[np.ndarray]) -> dict[str, float]:
        c, cc = self.args.ratio_clip, self.args.cumulative_ratio_clip
        log_ratio = np.array([float(np.mean(new - old)) if new.size else 0.0
                              for old, new in zip(old_logprobs, new_logprobs, strict=True)])
        raw = np.exp(np.minimum(log_ratio, 20.0))
        ratio = np.clip(raw, 1.0 - c, 1.0 + c)
        codes = self._code[phase.rows]
        self._ratios[codes] = np.clip(self._ratios[codes] * ratio, 1.0 - cc, 1.0 + cc)
        return {"seeupo/ratio_mean": float(raw.mean()),
                "seeupo/ratio_clipfrac": float(np.mean(raw != ratio)),
                "seeupo/cumulative_ratio_mean": float(self._ratios[codes].mean())}

    def state_dict(self) -> dict[str, Any]:
        return {"ratios": {str(i): float(r) for i, r in zip(self._ids, self._ratios, strict=True)}}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        ratios = dict(state.get("ratios", {}))
        self._ids = np.array(list(ratios), dtype=object)
        self._ratios = np.array([float(r) for r in ratios.values()])
        self._code = np.zeros(0, dtype=np.int64)


register_algorithm("seeupo", seeupo_advantages, SeeUPOArgs, update_plan=SequentialTurnPlan,
                   policy_loss="gspo",
                   description="SeeUPO: turn-by-turn updates, last turn first, ratio-weighted GRAE, "
                               "GSPO loss")
