"""Episode-at-a-time evaluation: the ``random``, ``expert`` and chat-endpoint actors and ``play``.

Each episode runs in its own worker thread (``agentgym.eval.harness`` runs many at once), so an
endpoint gets as many concurrent requests as there are live episodes and a slow episode never
holds the others back. Token-level local models go through ``agentgym.eval.local`` instead.
"""

from __future__ import annotations

import json
import random
import threading
import zlib
from dataclasses import dataclass, replace
from typing import Any, Protocol

from agentgym.backends.openai_backend import ContextLengthExceeded
from agentgym.core import Env
from agentgym.eval.messages import MessageCodec, render_messages
from agentgym.rollout.actions import ActionFormat, parse_action
from agentgym.rollout.policy import SamplingParams
from agentgym.rollout.prompt import PromptRenderer
from agentgym.rollout.records import Trajectory, Turn

#: Steps after which an episode of an env without a turn limit is cut (truncated).
MAX_STEPS = 1000


class Interrupted(Exception):
    """The evaluation is stopping; the episode in progress is abandoned (not saved)."""


class EpisodeCut(Exception):
    """An actor cannot go on (the expert has no move, the prompt outgrew the model's context): the
    episode ends there, truncated and unsolved, with the reason as its note."""


@dataclass(frozen=True)
class ActorTurn:
    """What an actor did in one turn."""

    action: str
    """Sent to the env."""
    response: str = ""
    """The policy's text (the action itself for random and expert)."""
    valid: bool = True
    """The response parsed into an action."""
    prompt: str = ""
    """The prompt as text (empty for random and expert)."""
    tokens: int = 0
    """Tokens generated."""
    response_ids: tuple[int, ...] = ()
    """Generated token ids, when the endpoint returned them."""


class Actor(Protocol):
    """Plays episodes: ``begin`` at reset, ``act`` every turn (raising ``EpisodeCut`` when it cannot
    go on), ``observe`` the env's reply when the episode goes on. One actor serves many episodes at once;
    per-episode state lives in the object ``begin`` returns."""

    def begin(self, observation: str, info: dict[str, Any], episode: str) -> Any: ...

    def act(self, state: Any, env: Env) -> ActorTurn: ...

    def observe(self, state: Any, turn: ActorTurn, observation: str, info: dict[str, Any]) -> None: ...


class RandomActor:
    """Uniform over ``info["admissible_actions"]``; where an env lists none, a random word of the
    current observation (almost always invalid: a floor, not a fair opponent). Seeded per episode,
    so a rerun plays the same moves."""

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed

    def begin(self, observation: str, info: dict[str, Any], episode: str) -> Any:
        return {"rng": random.Random(f"{self.seed}:{episode}"), "observation": observation, "info": info}

    def act(self, state: Any, env: Env) -> ActorTurn:
        rng: random.Random = state["rng"]
        choices = list(state["info"].get("admissible_actions") or []) or state["observation"].split() or ["?"]
        action = str(rng.choice(choices))
        return ActorTurn(action, action)

    def observe(self, state: Any, turn: ActorTurn, observation: str, info: dict[str, Any]) -> None:
        state["observation"], state["info"] = observation, info


class ExpertActor:
    """The env's ``expert_action()``; where the expert has no move, the episode stops there."""

    def begin(self, observation: str, info: dict[str, Any], episode: str) -> Any:
        return None

    def act(self, state: Any, env: Env) -> ActorTurn:
        action = env.expert_action()
        if action is None:
            raise EpisodeCut("the expert has no action here")
        return ActorTurn(action, action)

    def observe(self, state: Any, turn: ActorTurn, observation: str, info: dict[str, Any]) -> None:
        return None


class ChatActor:
    """A chat-API endpoint. Prompts are rendered by ``PromptRenderer`` (through ``MessageCodec``), so
    the endpoint sees the messages a local model would; its chat template does the tokenizing.

    Args:
        endpoint: an ``agentgym.backends.openai_backend.OpenAIEndpoint``.
        renderer: a ``PromptRenderer`` built over a ``MessageCodec``.
        action_format: how responses become actions.
        sampling: generation settings; a seeded one gets a distinct seed per episode and turn.
        send_tools: pass tool envs' specs as ``tools=``; otherwise they are written into the system
            message (for servers that refuse ``tools`` without a tool parser).
    """

    def __init__(self, endpoint: Any, renderer: PromptRenderer, action_format: ActionFormat,
                 sampling: SamplingParams, *, send_tools: bool = True) -> None:
        if not isinstance(renderer.tokenizer, MessageCodec):
            raise TypeError("ChatActor needs a PromptRenderer over a MessageCodec")
        self.endpoint = endpoint
        self.renderer = renderer
        self.codec: MessageCodec = renderer.tokenizer
        self.action_format = action_format
        self.sampling = sampling
        self.send_tools = send_tools

    def begin(self, observation: str, info: dict[str, Any], episode: str) -> Any:
        return {"conv": self.renderer.start(observation, info), "episode": episode, "turn": 0}

    def act(self, state: Any, env: Env) -> ActorTurn:
        messages, tools = self.codec.messages(self.renderer.prompt_ids(state["conv"]))
        if tools and not self.send_tools:
            listing = f"Available tools (JSON schema):\n{json.dumps(tools)}"
            if messages and messages[0]["role"] == "system":
                messages[0] = {"role": "system", "content": f"{listing}\n\n{messages[0]['content']}"}
            else:
                messages.insert(0, {"role": "system", "content": listing})
            tools = None
        params = self.sampling
        if params.seed is not None:
            params = replace(params, seed=zlib.crc32(f"{params.seed}:{state['episode']}:{state['turn']}".encode()))
        state["turn"] += 1
        try:
            reply = self.endpoint.chat(messages, params, tools=tools)
        except ContextLengthExceeded:
            # What the collector does for local models: an episode whose prompt no longer fits ends there.
            raise EpisodeCut("the prompt outgrew the model's context") from None
        parsed = parse_action(reply.text, self.action_format)
        tokens = reply.completion_tokens if reply.completion_tokens is not None else len(reply.token_ids or ())
        return ActorTurn(parsed.action, reply.text, parsed.valid, render_messages(messages), int(tokens),
                         tuple(reply.token_ids or ()))

    def observe(self, state: Any, turn: ActorTurn, observation: str, info: dict[str, Any]) -> None:
        self.renderer.record(state["conv"], self.codec.encode(turn.response), turn.action, observation, info)


@dataclass
class PlayedEpisode:
    """One finished episode: the trajectory plus what only the log keeps."""

    trajectory: Trajectory
    observation: str
    """The first observation."""
    info: dict[str, Any]
    """The first info."""
    turn_texts: list[tuple[str, str]]
    """(prompt text, response text) per turn."""
    infos: list[dict[str, Any]]
    """Every step's info."""
    note: str | None = None
    """Why the actor stopped the episode early (``EpisodeCut``), if it did."""


def play(env: Env, actor: Actor, seed: int, episode: str, *, options: dict[str, Any] | None = None,
         stop: threading.Event | None = None) -> PlayedEpisode:
    """Play one episode from ``reset(seed=seed)`` to its end.

    Raises:
        Interrupted: ``stop`` was set (checked before every turn).
        AgentGymError: whatever the env or the actor raised (env crash, endpoint failure).

    Example:
        >>> import agentgym
        >>> done = play(agentgym.make("maze-v0", size=2), ExpertActor(), 3, "maze/3/0")
        >>> done.trajectory.success, len(done.trajectory.turns) == len(done.infos)
        (True, True)
    """
    obs, info = env.reset(seed=seed, options=options)
    first_obs, first_info = obs, info
    state = actor.begin(obs, info, episode)
    turns: list[Turn] = []
    texts: list[tuple[str, str]] = []
    infos: list[dict[str, Any]] = []
    state_key = str(info["state_key"])
    success = truncated = False
    note = None
    while True:
        if stop is not None and stop.is_set():
            raise Interrupted(episode)
        if len(turns) >= MAX_STEPS:
            truncated = True
            break
        try:
            turn = actor.act(state, env)
        except EpisodeCut as cut_short:
            truncated, note = True, str(cut_short)
            break
        obs, reward, terminated, cut, info = env.step(turn.action)
        turns.append(Turn([], list(turn.response_ids), [], float(reward), state_key,
                          (not turn.valid) or bool(info.get("invalid_action")), turn.action, obs,
                          int(info.get("tool_calls", 0) or 0), {"completion_tokens": turn.tokens}))
        texts.append((turn.prompt, turn.response))
        infos.append(info)
        state_key = str(info["state_key"])
        if terminated or cut:
            success, truncated = bool(info.get("success", False)), bool(cut and not terminated)
            break
        actor.observe(state, turn, obs, info)
    task_id = str(first_info.get("task_id", f"seed:{seed}"))
    return PlayedEpisode(Trajectory(turns, task_id, seed, success=success, truncated=truncated, trajectory_id=episode),
                         first_obs, first_info, texts, infos, note)
