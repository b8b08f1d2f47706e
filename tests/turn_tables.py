"""Hand-built ``TurnTable``s for update-plan tests: the plan columns in any row order, neutral estimator
columns."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from agentgym.training.api.turn_table import TurnTable


def plan_table(trajectory_id: Sequence[str], step: Sequence[int], group: Sequence[int] | None = None,
               copied: Sequence[bool] | None = None) -> TurnTable:
    """A table whose rows are the given (trajectory id, step) pairs in the given order (``from_groups``
    always answers group → trajectory → turn order; plans must not depend on it)."""
    ids = np.array(list(trajectory_id), dtype=object)
    num = ids.shape[0]
    group_of = np.zeros(num, dtype=np.int64) if group is None else np.asarray(group, dtype=np.int64)
    names, trajectory = np.unique(ids.astype(str), return_inverse=True)
    trajectory = trajectory.reshape(-1).astype(np.int64)
    trajectory_group = np.zeros(names.shape[0], dtype=np.int64)
    trajectory_group[trajectory] = group_of
    return TurnTable(group=group_of, trajectory=trajectory, step=np.asarray(step, dtype=np.int64),
                     reward=np.zeros(num), invalid=np.zeros(num, dtype=bool),
                     state=np.arange(num, dtype=np.int64), trajectory_group=trajectory_group,
                     trajectory_return=np.zeros(names.shape[0]), trajectory_id=ids,
                     copied=np.zeros(num, dtype=bool) if copied is None else np.asarray(copied, dtype=bool))
