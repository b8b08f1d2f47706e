"""Actors: what plays the policy's side of the ``Collector``'s episodes (``Actor``, ``TokenActor``,
``ExpertActor``, ``RandomActor``) and what they see and answer each turn (``TurnRequest``, ``ActorTurn``).

The collector alone plays episodes: it resets and steps the envs, renders the prompts, records the
turns (with every step's ``info``) and runs the rollout hooks. Each turn it hands the requests of all
live episodes to its actor in one call, and the actor answers one ``ActorTurn`` per request: a batched
token policy generates for all of them at once (``TokenActor``), a chat endpoint sends their requests
concurrently (``agentgym.eval.chat.ChatActor``), the env's expert or a random player picks moves. A
new source of episodes is a new actor, never another loop.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from agentgym.core import Env
from agentgym.errors import ConfigError
from agentgym.rollout.actions import ActionFormat, parse_action
from agentgym.rollout.policy import ChatTokenizer, Policy, SamplingParams


@dataclass(frozen=True)
class TurnRequest:
    """What an actor sees of one live episode when the collector asks it for a turn."""

    trajectory_id: str
    """The episode's id: ``{group_id}-t{member}``."""
    group_id: str
    """The id of the episode's group."""
    member: int
    """The episode's index in its group (forks count on from the group size)."""
    turn: int
    """Turns the episode has had so far (a fork's copied prefix included)."""
    prompt_ids: list[int]
    """The prompt rendered by the collector's renderer (empty when the collector has none)."""
    observation: str
    """The env's latest observation."""
    info: Mapping[str, Any]
    """The env's latest ``info``. Privileged keys (``answer``) are here too: an actor that stands for
    a policy must not read them."""
    env: Env | None
    """The episode's env when the collector's pool hands out envs (a factory's ``LocalEnvPool``),
    else None; the expert asks it for ``expert_action()``."""
    memory: dict[str, Any] = field(default_factory=dict)
    """The actor's own per-episode state: empty at the reset, kept by the collector for the episode's
    lifetime (a fork gets a copy)."""


@dataclass(frozen=True)
class ActorTurn:
    """An actor's answer for one episode: the action to step the env with, or a reason to stop."""

    action: str = ""
    """Sent to the env."""
    response_ids: list[int] = field(default_factory=list)
    """The response ids the turn records (generated ids, never re-tokenized)."""
    response_logprobs: list[float] = field(default_factory=list)
    """Sampler log-probs of ``response_ids`` (empty where the actor has none)."""
    valid: bool = True
    """The response parsed into an action."""
    extras: dict[str, Any] = field(default_factory=dict)
    """Goes to ``Turn.extras`` (JSON-safe values only)."""
    history_ids: list[int] | None = None
    """What the conversation records as the reply when it differs from ``response_ids`` (a chat
    endpoint: the reply's text in the renderer's ids, while ``response_ids`` are the server's)."""
    prompt_ids: list[int] | None = None
    """What the turn records as its prompt when it differs from the rendered one (a chat endpoint
    tokenizes the messages itself: no ids)."""
    cut: str | None = None
    """Set when the actor cannot go on (the expert has no move, the prompt outgrew the model's
    context): the episode ends here, truncated, with this as its ``Trajectory.note``; no step is made."""


@runtime_checkable
class Actor(Protocol):
    """The plug point between the collector and whatever chooses actions.

    Contract: ``act(requests, sampling)`` returns one ``ActorTurn`` per request, in order. It is
    called once per turn with every live episode, so an actor batches or parallelises across them;
    ``sampling`` is the collection's sampling with the turn's seed (``seed + turn``). An exception
    fails the whole collection (the collector releases its envs); an episode that cannot go on
    answers ``ActorTurn(cut=reason)`` instead. Per-episode state belongs in ``TurnRequest.memory``.
    """

    def act(self, requests: Sequence[TurnRequest], sampling: SamplingParams) -> list[ActorTurn]: ...


def format_action(action: str, fmt: ActionFormat) -> str:
    """The response text a policy should produce for ``action`` in the given format.

    Example:
        >>> format_action("up", "tag"), format_action("up", "plain")
        ('<action>up</action>', 'up')
    """
    return f"<action>{action}</action>" if fmt == "tag" else action


class TokenActor:
    """A token-level ``Policy``: one batched ``generate`` over all live episodes' prompts per turn.

    Args:
        policy: the generation backend.
        action_format: how responses are parsed into actions.
    """

    def __init__(self, policy: Policy, action_format: ActionFormat = "plain") -> None:
        self.policy = policy
        self.action_format = action_format

    def act(self, requests: Sequence[TurnRequest], sampling: SamplingParams) -> list[ActorTurn]:
        generations = self.policy.generate([r.prompt_ids for r in requests], sampling)
        turns = []
        for generation in generations:
            text = self.policy.tokenizer.decode(generation.token_ids, skip_special_tokens=True)
            parsed = parse_action(text, self.action_format)
            extras: dict[str, Any] = {"finish_reason": generation.finish_reason}
            if generation.entropies is not None:
                extras["entropies"] = generation.entropies
            if generation.top_logprobs is not None:
                extras["top_logprobs"] = [[list(pair) for pair in position]
                                          for position in generation.top_logprobs]
            if "forced_positions" in generation.extras:
                extras["forced_positions"] = list(generation.extras["forced_positions"])
            if "policy_version" in generation.extras:  # asynchronous rollouts: which weights sampled it
                extras["policy_version"] = int(generation.extras["policy_version"])
            turns.append(ActorTurn(parsed.action, list(generation.token_ids), list(generation.logprobs),
                                   parsed.valid, extras))
        return turns


class ExpertActor:
    """The env's ``expert_action()``; where the expert has no move, the episode stops there.

    Args:
        tokenizer: for SFT demonstrations: the response ids become the formatted action followed by
            the end-of-turn token (so the policy learns to stop); None records no ids (a baseline).
        action_format: how the action is written in the response (``<action>`` tags or plain).

    Raises (from ``act``):
        ConfigError: the collector's envs are not envs the actor can ask (an env pool's slots).
    """

    def __init__(self, tokenizer: ChatTokenizer | None = None, action_format: ActionFormat = "plain") -> None:
        self.tokenizer = tokenizer
        self.action_format = action_format

    def act(self, requests: Sequence[TurnRequest], sampling: SamplingParams) -> list[ActorTurn]:
        return [self._turn(request) for request in requests]

    def _turn(self, request: TurnRequest) -> ActorTurn:
        if request.env is None:
            raise ConfigError("the expert needs envs it can ask for expert_action(): give the collector an "
                              "env factory (agentgym.make, RemoteEnv), not an env pool")
        action = request.env.expert_action()
        if action is None:
            return ActorTurn(cut="the expert has no action here")
        if self.tokenizer is None:
            return ActorTurn(action)
        text = format_action(action, self.action_format)
        eos = self.tokenizer.eos_token_id
        response = list(self.tokenizer.encode(text, add_special_tokens=False))  # type: ignore[attr-defined]
        response += [] if eos is None else [eos]
        return ActorTurn(action, response, [0.0] * len(response))


class RandomActor:
    """Uniform over ``info["admissible_actions"]``; where an env lists none, a random word of the
    current observation (almost always invalid: a floor, not a fair opponent). Seeded per episode
    (by ``seed``, the group id and the member index), so a rerun plays the same moves.

    Example:
        >>> request = TurnRequest("g0-t0", "g0", 0, 0, [], "a room", {"admissible_actions": ["up", "down"]},
        ...                       None)
        >>> [turn] = RandomActor(seed=1).act([request], SamplingParams())
        >>> turn.action in ("up", "down")
        True
    """

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed

    def act(self, requests: Sequence[TurnRequest], sampling: SamplingParams) -> list[ActorTurn]:
        turns = []
        for request in requests:
            rng = request.memory.get("rng")
            if rng is None:
                rng = request.memory["rng"] = random.Random(
                    f"{self.seed}:{request.group_id}/{request.member}")
            choices = (list(request.info.get("admissible_actions") or []) or request.observation.split()
                       or ["?"])
            turns.append(ActorTurn(str(rng.choice(choices))))
        return turns
