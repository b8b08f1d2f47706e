"""Rollout records: ``Turn``, ``Trajectory``, ``EpisodeGroup`` — plain, JSON-serialisable data.

A *turn* is one policy action plus the env's reply, as stored for training; a *trajectory* is one
episode's turns; a *group* holds the trajectories that started from the same task and seed.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any


@dataclass(frozen=True)
class Turn:
    """One policy action and the env's reply."""

    prompt_ids: list[int]
    """Token ids of the prompt the policy saw (chat template applied), shape (prompt_len,)."""
    response_ids: list[int]
    """Token ids the policy generated, never re-tokenized, shape (response_len,)."""
    response_logprobs: list[float]
    """Sampler log-probs of ``response_ids``, shape (response_len,)."""
    reward: float
    """Env reward of this step."""
    state_key: str
    """``info["state_key"]`` of the state the action was taken in (GiGPO anchor)."""
    invalid: bool = False
    """The env flagged the action invalid (or it could not be parsed)."""
    action: str = ""
    """The action sent to the env (parsed from the response)."""
    observation: str = ""
    """The env's reply to the action."""
    tool_calls: int = 0
    """Tool calls the env executed for this action (``info["tool_calls"]``; 0 for envs without tools)."""
    extras: dict[str, Any] = field(default_factory=dict)
    """Algorithm data: entropies, top-k log-probs, IGPO scores... (JSON-safe values only)."""
    info: dict[str, Any] = field(default_factory=dict)
    """The env's ``info`` of this step, privileged keys included (the policy never sees it).

    Changed in v0.1: added, because evaluation logs and hooks need every step's info and the
    collector is the only place that sees it."""

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Turn:
        """A turn from its stored form (``asdict``'s, or a turn of an episode-log line): the one place a
        stored turn becomes a ``Turn``. Keys that are no field (an evaluation's texts) are ignored; a
        missing ``extras`` or ``info`` is empty.

        Example:
            >>> Turn.from_json({"prompt_ids": [1], "response_ids": [2], "response_logprobs": [-0.1],
            ...                 "reward": 1, "state_key": "s", "prompt": "text", "info": None})
            Turn(prompt_ids=[1], response_ids=[2], response_logprobs=[-0.1], reward=1.0, state_key='s', \
invalid=False, action='', observation='', tool_calls=0, extras={}, info={})
        """
        known = {f.name for f in fields(cls)}
        stored = {k: v for k, v in data.items() if k in known}
        return cls(**{**stored, "prompt_ids": [int(i) for i in data["prompt_ids"]],
                      "response_ids": [int(i) for i in data["response_ids"]],
                      "response_logprobs": [float(x) for x in data["response_logprobs"]],
                      "reward": float(data["reward"]), "state_key": str(data["state_key"]),
                      "extras": dict(data.get("extras") or {}), "info": dict(data.get("info") or {})})


@dataclass(frozen=True)
class Trajectory:
    """One episode."""

    turns: list[Turn]
    """The turns in order."""
    task_id: str
    """``info["task_id"]`` of the episode (or the seed as text when the env names none)."""
    seed: int
    """The reset seed."""
    success: bool = False
    """``info["success"]`` at the end."""
    truncated: bool = False
    """The episode hit its turn budget (or the env truncated it)."""
    trajectory_id: str = ""
    """Unique within a batch."""
    parent_id: str | None = None
    """For forked trajectories (ARPO branches): the trajectory it was forked from."""
    fork_turn: int | None = None
    """For forked trajectories: how many turns were shared with the parent."""
    answer: str | list[str] | None = None
    """The env's privileged ground truth (``info["answer"]``), for trainers that read it (IGPO);
    never shown to the policy."""
    first_observation: str = ""
    """The observation of the reset."""
    first_info: dict[str, Any] = field(default_factory=dict)
    """The ``info`` of the reset."""
    note: str | None = None
    """Why the episode ended before the env ended it, when it did: the prompt outgrew the budget or
    the model's context, the expert had no move."""

    @property
    def episode_return(self) -> float:
        """Sum of the turn rewards."""
        return float(sum(t.reward for t in self.turns))


@dataclass(frozen=True)
class EpisodeGroup:
    """The trajectories of one task: G resets with the same seed and options (plus any forks)."""

    group_id: str
    """Unique within a batch."""
    task_id: str
    """The shared task."""
    seed: int
    """The shared reset seed."""
    trajectories: list[Trajectory]
    """Group members."""

    def to_json(self) -> dict[str, Any]:
        """A dict that survives ``json.dumps``."""
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> EpisodeGroup:
        """Inverse of ``to_json`` (an episode log's lines are read by ``agentgym.rollout.episode_log``).

        Example:
            >>> import json
            >>> turn = Turn([1, 2], [3], [-0.5], 1.0, "s0")
            >>> group = EpisodeGroup("g", "t", 0, [Trajectory([turn], "t", 0, success=True)])
            >>> EpisodeGroup.from_json(json.loads(json.dumps(group.to_json()))) == group
            True
        """
        trajectories = [
            Trajectory(**{**t, "turns": [Turn.from_json(turn) for turn in t["turns"]]})
            for t in data["trajectories"]
        ]
        return cls(**{**data, "trajectories": trajectories})
