"""Built-in algorithms, registered by name on import (``agentgym.trainers``)."""
