"""Small example envs used in docs and tests: ``EchoEnv`` (the smallest complete text env)."""

from __future__ import annotations

from typing import Any

from agentgym.core import Env


class EchoEnv(Env):
    """Say a word; the episode ends with reward 1 when the agent says ``target``.

    Example:
        >>> env = EchoEnv(target="hi")
        >>> env.reset(seed=0)
        ('Say something.', {'state_key': 'start', 'admissible_actions': ['hi', 'bye']})
        >>> env.step("hi")[1:4]
        (1.0, True, False)
    """

    def __init__(self, target: str = "hi") -> None:
        self.target = target

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        return "Say something.", {"state_key": "start", "admissible_actions": [self.target, "bye"]}

    def step(self, action: str):
        solved = action.strip() == self.target
        info = {"state_key": f"said:{action.strip()}", "success": solved}
        return f"You said {action.strip()!r}.", float(solved), solved, False, info

    def expert_action(self) -> str | None:
        return self.target
