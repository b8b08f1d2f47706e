"""The collector as the one episode engine: every step's info on its turn (in-process and over HTTP),
the expert and random actors and SFT demos as they played before the engine was shared, and a chat
endpoint that gets one concurrent request per live episode."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
from conftest import LiveServer

import agentgym
from agentgym.backends.openai_backend import OpenAIEndpoint
from agentgym.backends.tiny import TinyModelConfig, build_tiny_model
from agentgym.errors import ConfigError
from agentgym.eval.chat import ChatActor
from agentgym.eval.messages import MessageCodec
from agentgym.http.client import EnvClient, RemoteEnv
from agentgym.rollout.actors import ExpertActor, RandomActor
from agentgym.rollout.collector import Collector
from agentgym.rollout.demos import collect_demos
from agentgym.rollout.policy import SamplingParams
from agentgym.rollout.prompt import PromptRenderer
from agentgym.rollout.records import EpisodeGroup

MAZE = {"size": 2, "max_turns": 6}


def play(make_env: Any, actor: Any, seeds: list[int], **kwargs: Any) -> list[EpisodeGroup]:
    collector = Collector(make_env, actor, None, **kwargs)
    try:
        return collector.collect(seeds, 1, SamplingParams(),
                                 group_ids=[f"maze-v0/{i}" for i in range(len(seeds))])
    finally:
        collector.close()


@pytest.mark.parametrize("where", ["in-process", "http"])
def test_every_step_info_lands_on_its_turn(make_service: Any, where: str) -> None:
    if where == "http":
        client = EnvClient(client=make_service(["maze-v0"]))

        def make_env() -> Any:
            return RemoteEnv("maze-v0", client=client, size=2, max_turns=6)
    else:
        def make_env() -> Any:
            return agentgym.make("maze-v0", **MAZE)
    groups = play(make_env, RandomActor(seed=3), [0, 1, 2])
    for group in groups:
        [trajectory] = group.trajectories
        replay = agentgym.make("maze-v0", **MAZE)
        obs, info = replay.reset(seed=group.seed)
        assert (trajectory.first_observation, trajectory.first_info) == (obs, info)
        for turn in trajectory.turns:  # the env replayed with the same actions gives every info recorded
            assert turn.state_key == info["state_key"]
            obs, reward, _, _, info = replay.step(turn.action)
            assert (turn.observation, turn.reward, turn.info) == (obs, reward, info)
        assert trajectory.turns[-1].info != {}
    assert EpisodeGroup.from_json(groups[0].to_json()) == groups[0]  # infos are plain data too


# Played at the commit before the collector became the only engine (eval.episodes.play), seeds 0-3,
# episode names maze-v0/{task}/0: the expert's shortest paths in the 2x2 maze, random's uniform moves.
OLD_EXPERT = [["left", "left", "down", "down"], ["right", "right", "down", "down"],
              ["down", "down", "left", "left"], ["down", "down", "right", "right", "up", "up"]]
OLD_RANDOM = [["down", "up", "down", "down", "up", "up"], ["right", "left", "down", "down", "up", "down"],
              ["down", "up", "down", "up", "left", "left"], ["down", "down", "right", "left", "up", "up"]]


def test_expert_and_random_play_as_before() -> None:
    expert = play(lambda: agentgym.make("maze-v0", **MAZE), ExpertActor(), [0, 1, 2, 3])
    random_ = play(lambda: agentgym.make("maze-v0", **MAZE), RandomActor(seed=0), [0, 1, 2, 3])
    assert [[t.action for t in g.trajectories[0].turns] for g in expert] == OLD_EXPERT
    assert [[t.action for t in g.trajectories[0].turns] for g in random_] == OLD_RANDOM
    assert all(g.trajectories[0].success and g.trajectories[0].episode_return == 1.0 for g in expert)
    assert not any(g.trajectories[0].success for g in random_)
    assert all(g.trajectories[0].truncated and len(g.trajectories[0].turns) == 6 for g in random_)


def test_expert_without_a_move_ends_the_episode_with_a_note() -> None:
    class Stuck(agentgym.Env):
        has_expert = True

        def reset(self, *, seed=None, options=None):
            return "stuck", {"state_key": "s"}

        def step(self, action):
            return "still", 0.0, False, False, {"state_key": "s"}

        def expert_action(self):
            return None

    [group] = play(Stuck, ExpertActor(), [0])
    assert group.trajectories[0].turns == [] and group.trajectories[0].truncated
    assert group.trajectories[0].note == "the expert has no action here"


def test_the_expert_refuses_a_pool_it_cannot_ask(live_server: Any) -> None:
    from agentgym.http.fleet import EnvFleet

    server = live_server(["maze-v0"])
    with pytest.raises(ConfigError, match="expert needs envs it can ask"):  # fleet slots are batched sessions
        play(EnvFleet([server.url], "maze-v0", kwargs={"size": 2}, max_turns=6), ExpertActor(), [0])


def test_demos_are_the_expert_episodes_rendered_as_rollouts() -> None:
    _, tokenizer = build_tiny_model(TinyModelConfig(num_layers=1))
    renderer = PromptRenderer(tokenizer, mode="full", action_format="tag")

    def make_env() -> Any:
        return agentgym.make("maze-v0", size=3, max_turns=8)

    turns, stats = collect_demos(make_env, renderer, [0, 1, 2, 3, 4], action_format="tag")
    # The same numbers as before the collector played demos: 3 of 5 mazes solved within 8 turns.
    assert stats == {"expert_success_rate": 0.6, "demo_turns": 38.0}
    at = 0
    for seed in range(5):  # replay each episode with the expert and render it turn by turn
        env = make_env()
        obs, info = env.reset(seed=seed)
        conv = renderer.start(obs, info)
        while (action := env.expert_action()) is not None:
            turn = turns[at]
            response = (tokenizer.encode(f"<action>{action}</action>", add_special_tokens=False)
                        + [tokenizer.eos_token_id])
            assert ((turn.prompt_ids, turn.response_ids, turn.action)
                    == (renderer.prompt_ids(conv), response, action))
            obs, reward, terminated, truncated, info = env.step(action)
            assert (turn.reward, turn.observation, turn.info) == (reward, obs, info)
            at += 1
            if terminated or truncated:
                break
            renderer.record(conv, response, action, obs, info)
    assert at == len(turns)


class ConcurrentChat:
    """A small OpenAI-compatible chat app: the first ``expected`` requests are held until that many are
    in flight at once (or a deadline passes), so the peak it records is the concurrency it got."""

    def __init__(self, expected: int, deadline_s: float = 20.0) -> None:
        from fastapi import FastAPI

        self.expected, self.deadline_s = expected, deadline_s
        self.in_flight = self.peak = self.seen = 0
        self.lock = threading.Lock()
        self.app = FastAPI()
        self.app.get("/health")(lambda: {"status": "ok"})
        self.app.get("/v1/models")(lambda: {"object": "list", "data": [
            {"id": "m", "object": "model", "created": 0, "owned_by": "test"}]})
        self.app.post("/v1/chat/completions")(self.chat)

    async def chat(self, body: dict[str, Any]) -> dict[str, Any]:
        with self.lock:
            self.in_flight += 1
            self.seen += 1
            self.peak = max(self.peak, self.in_flight)
            held = self.seen <= self.expected
        try:
            loop = asyncio.get_running_loop()
            until = loop.time() + self.deadline_s
            while held and self.peak < self.expected and loop.time() < until:
                await asyncio.sleep(0.01)  # polls the peak, bounded by the deadline
        finally:
            with self.lock:
                self.in_flight -= 1
        return {"id": "c", "object": "chat.completion", "created": 0, "model": "m",
                "choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": "down"}}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}


def test_a_chat_actor_sends_one_concurrent_request_per_live_episode() -> None:
    chat = ConcurrentChat(expected=4)
    live = LiveServer(chat.app)
    actor = ChatActor(OpenAIEndpoint(f"{live.url}/v1", timeout_s=30), "plain", concurrency=8)
    collector = Collector(lambda: agentgym.make("maze-v0", size=2, max_turns=2), actor,
                          PromptRenderer(MessageCodec()), max_prompt_tokens=None)
    try:
        groups = collector.collect([0, 1], 2, SamplingParams(max_new_tokens=4))
    finally:
        collector.close()
        actor.close()
        live.stop()
    assert chat.peak == 4  # all four live episodes' first turns were in flight together
    turns = [turn for g in groups for t in g.trajectories for turn in t.turns]
    assert chat.seen == len(turns) and all(t.action == "down" and t.info for t in turns)
    assert turns[0].extras["response_text"] == "down" and turns[0].extras["prompt_text"].startswith("[")
