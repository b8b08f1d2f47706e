"""agentgym: text and tool environments plus turn-level RL trainers for LLM agents."""

from __future__ import annotations

from agentgym.checker import check_env
from agentgym.core import INFO_KEYS, Env, TaskSplit
from agentgym.errors import (
    AgentGymError,
    CheckFailed,
    ConfigError,
    DuplicateEnv,
    EnvContractError,
    EnvCrashed,
    EpisodeFinished,
    RegistryError,
    RemoteEnvError,
    ResetNeeded,
    SessionCapacityError,
    SessionError,
    UnknownEnv,
    UnknownSession,
    VersionNotFound,
)
from agentgym.guard import EpisodeGuard
from agentgym.registry import list_envs, make, register, spec
from agentgym.spec import EnvSpec

__version__ = "0.1.0"

__all__ = [
    "INFO_KEYS",
    "AgentGymError",
    "CheckFailed",
    "ConfigError",
    "DuplicateEnv",
    "Env",
    "EnvContractError",
    "EnvCrashed",
    "EnvSpec",
    "EpisodeFinished",
    "EpisodeGuard",
    "RegistryError",
    "RemoteEnvError",
    "ResetNeeded",
    "SessionCapacityError",
    "SessionError",
    "TaskSplit",
    "UnknownEnv",
    "UnknownSession",
    "VersionNotFound",
    "__version__",
    "check_env",
    "list_envs",
    "make",
    "register",
    "spec",
]

