"""The embedded quickstart where the run's callers find it: ``QUICKSTART`` is a preset, so it lives with
the config (``agentgym.training.config.quickstart``), which loads it for ``agentgym train`` with no config."""

from __future__ import annotations

from agentgym.training.config.quickstart import QUICKSTART

__all__ = ["QUICKSTART"]
