"""``Aggregation``, where plug-ins written before it moved import it from; it lives in the algorithm API
(``agentgym.training.api.aggregation``), which hands it to policy losses and loss terms."""

from __future__ import annotations

from agentgym.training.api.aggregation import Aggregation, check_same_shape, masked

__all__ = ["Aggregation", "check_same_shape", "masked"]
