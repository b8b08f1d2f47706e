"""Built-in algorithms, registered by name on import (``agentgym.trainers``)."""

from agentgym.trainers import gigpo, grpo, rloo  # noqa: F401  (registration side effects)
