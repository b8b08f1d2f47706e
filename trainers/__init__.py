"""Built-in algorithms, loss terms and rollout-hook options, registered by name on import
(``agentgym.trainers``)."""

# Importing registers them. Every module imports without torch (the loss terms import it where they
# compute), so an env-only install can list every plug-in and check any config.
from agentgym.trainers import (  # noqa: F401
    arpo,
    dapo,
    epo,
    gigpo,
    graphgpo,
    grpo,
    hgpo,
    igpo,
    llds,
    ppo,
    rloo,
    seeupo,
)
