"""Built-in algorithms, loss terms and rollout-hook options, registered by name on import (``agentgym.trainers``)."""

from agentgym.trainers import arpo, dapo, epo, gigpo, grpo, hgpo, igpo, llds, rloo, seeupo  # noqa: F401  (registration side effects)
