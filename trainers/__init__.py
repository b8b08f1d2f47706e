"""Built-in algorithms, loss terms and rollout-hook options, registered by name on import (``agentgym.trainers``)."""

from importlib.util import find_spec

from agentgym.trainers import arpo, dapo, gigpo, grpo, hgpo, igpo, rloo, seeupo  # noqa: F401  (registration side effects)

# The loss terms are torch code: they register where the `train` extra is installed, so an env-only
# install can still import the estimators and hook options (and list them) without torch.
if find_spec("torch") is not None:
    from agentgym.trainers import epo, llds  # noqa: F401
