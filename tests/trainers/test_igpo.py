"""IGPO: hand-computed rewards and advantages, invariants, loop-vs-vectorised equivalence, the batched
scoring hook on a real policy (locally and over HTTP), the answer staying out of every prompt, and
learning."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from learning import ROOT

import agentgym
from agentgym.backends import TinyModelConfig
from agentgym.backends.tiny import build_tiny_model
from agentgym.backends.transformers_backend import TransformersPolicy
from agentgym.core import Env
from agentgym.envs.registration import register_tool_envs
from agentgym.errors import ConfigError
from agentgym.rollout import Collector, PromptRenderer, SamplingParams
from agentgym.rollout.records import EpisodeGroup, Trajectory, Turn
from agentgym.trainers.igpo import VALUE_KEY, IGPOArgs, IGPOScoring, igpo_advantages
from agentgym.training.api.algorithm import get_algorithm
from agentgym.training.api.plugin_set import PluginSet
from agentgym.training.config.loading import load_config
from agentgym.training.run.loop import train

PRESET = ROOT / "configs" / "search_qa_igpo_tiny.yaml"
EPS = 1e-6


def traj(values: list[float], rewards: list[float], tid: str = "") -> Trajectory:
    """Turns with recorded answer values (nan: none) and env rewards."""
    turns = [Turn([0], [1], [-0.1], r, "s", extras={} if math.isnan(v) else {VALUE_KEY: v})
             for v, r in zip(values, rewards, strict=True)]
    return Trajectory(turns, "task", 0, trajectory_id=tid)


def group(*trajectories: Trajectory, gid: str = "g") -> EpisodeGroup:
    return EpisodeGroup(gid, "task", 0, list(trajectories))


def igpo(groups: list[EpisodeGroup], **args: Any) -> np.ndarray:
    return igpo_advantages(groups, IGPOArgs(**args))


def popstd(values: list[float]) -> float:
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / len(values) + 1e-8)


# --- hand-computed -----------------------------------------------------------------------------------


def test_separate_log_prob_diff_with_discount() -> None:
    # A: 3 turns, values -3 -> -2 -> -0.5, answers right (1). IGs +1, +1.5.
    # B: 2 turns, values -3 -> -4, answers wrong (0). IG -1.
    # C: 1 turn, answers wrong right away (0). No IG.
    a = traj([-3.0, -2.0, -0.5], [0.0, 0.0, 1.0])
    b = traj([-3.0, -4.0], [0.0, 0.0])
    c = traj([-3.0], [0.0])
    adv = igpo([group(a, b, c)], gamma=0.5)
    outcomes, gains = [1.0, 0.0, 0.0], [1.0, 1.5, -1.0]
    mo, so = sum(outcomes) / 3, popstd(outcomes)
    mg, sg = sum(gains) / 3, popstd(gains)
    f = [(o - mo) / (so + EPS) for o in outcomes]
    g = [(x - mg) / (sg + EPS) for x in gains]
    a2 = f[0]
    a1 = g[1] + 0.5 * a2
    a0 = g[0] + 0.5 * a1
    b1 = f[1]
    b0 = g[2] + 0.5 * b1
    np.testing.assert_allclose(adv, [a0, a1, a2, b0, b1, f[2]], rtol=1e-12)


def test_joint_prob_diff_pools_outcomes_and_gains() -> None:
    # prob_diff: IG = exp(v') - exp(v). A: ln .2 -> ln .5 (IG .3), right (1). B: ln .2 -> ln .1 (IG -.1),
    # wrong (0).
    a = traj([math.log(0.2), math.log(0.5)], [0.0, 1.0])
    b = traj([math.log(0.2), math.log(0.1)], [0.0, 0.0])
    adv = igpo([group(a, b)], info_gain_type="prob_diff", norm_mode="joint", gamma=1.0)
    pool = [1.0, 0.0, 0.3, -0.1]
    mean, std = sum(pool) / 4, popstd(pool)
    z = [(x - mean) / (std + EPS) for x in pool]
    np.testing.assert_allclose(adv, [z[2] + z[0], z[0], z[3] + z[1], z[1]], rtol=1e-9)


def test_zero_and_missing_gains_are_left_out_of_the_statistics() -> None:
    # A's IG is exactly 0 (the reference only normalises non-zero IG), B's first turn has no value.
    a = traj([-1.0, -1.0], [0.0, 1.0])
    b = traj([math.nan, -2.0], [0.0, 0.0])
    c = traj([-1.0, -0.5], [0.0, 0.0])  # the only IG: a set of one has mean = itself, σ = 1 → 0
    adv = igpo([group(a, b, c)], gamma=1.0)
    outcomes = [1.0, 0.0, 0.0]
    f = [(o - 1 / 3) / (popstd(outcomes) + EPS) for o in outcomes]
    np.testing.assert_allclose(adv, [f[0], f[0], f[1], f[1], f[2], f[2]], rtol=1e-12)


def test_no_std_subtracts_the_mean_only_and_groups_never_mix() -> None:
    g1 = group(traj([-2.0, -1.0], [0.0, 1.0]), traj([-2.0, -2.5], [0.0, 0.0]), gid="a")
    g2 = group(traj([-9.0], [5.0]), traj([-9.0], [3.0]), gid="b")
    adv = igpo([g1, g2], normalize_std=False, gamma=1.0)
    # g1: outcomes {1, 0} mean .5; gains {+1, -.5} mean .25. g2: outcomes {5, 3} mean 4.
    np.testing.assert_allclose(adv, [0.75 + 0.5, 0.5, -0.75 - 0.5, -0.5, 1.0, -1.0], rtol=1e-12)


# --- invariants --------------------------------------------------------------------------------------


def random_groups(rng: np.random.Generator, num_groups: int = 4) -> list[EpisodeGroup]:
    groups = []
    for g in range(num_groups):
        members = []
        for _ in range(int(rng.integers(1, 5))):
            length = int(rng.integers(1, 5))
            values = list(rng.normal(-2.0, 1.0, length))
            if rng.random() < 0.3:
                values[int(rng.integers(0, length))] = math.nan
            rewards = [0.0] * (length - 1) + [float(rng.integers(0, 2))]
            members.append(traj(values, rewards))
        groups.append(group(*members, gid=f"g{g}"))
    return groups


def loop_reference(groups: list[EpisodeGroup], args: IGPOArgs) -> list[float]:
    """The reference's per-group, per-trajectory loops, written plainly."""
    out: list[float] = []
    for g in groups:
        rows = []  # (trajectory index, reward, kind) per turn; kind: "f", "ig", or None
        for i, t in enumerate(g.trajectories):
            values = [t.extras.get(VALUE_KEY, math.nan) for t in t.turns]
            if args.info_gain_type == "prob_diff":
                values = [math.exp(v) for v in values]
            for k, _turn in enumerate(t.turns):
                if k == len(t.turns) - 1:
                    rows.append((i, sum(x.reward for x in t.turns), "f"))
                else:
                    gain = values[k + 1] - values[k]
                    ok = math.isfinite(gain) and gain != 0
                    rows.append((i, gain if ok else 0.0, "ig" if ok else None))
        normed = []
        for _, r, kind in rows:
            if kind is None:
                normed.append(0.0)
                continue
            pool = [x for _, x, k in rows if k is not None and (args.norm_mode == "joint" or k == kind)]
            mean = sum(pool) / len(pool)
            std = math.sqrt(sum((x - mean) ** 2 for x in pool) / len(pool) + args.variance_floor) \
                if len(pool) > 1 else 1.0
            normed.append((r - mean) / (std + args.epsilon) if args.normalize_std else r - mean)
        start = 0
        for t in g.trajectories:
            mine = normed[start:start + len(t.turns)]
            advantage, backwards = 0.0, []
            for r in reversed(mine):
                advantage = r + args.gamma * advantage
                backwards.append(advantage)
            out += backwards[::-1]
            start += len(t.turns)
    return out


@pytest.mark.parametrize("mode", ["joint", "separate"])
@pytest.mark.parametrize("kind", ["log_prob_diff", "prob_diff"])
def test_vectorised_equals_the_loop(mode: str, kind: str) -> None:
    rng = np.random.default_rng(7)
    for _ in range(20):
        groups = random_groups(rng)
        args = IGPOArgs(norm_mode=mode, info_gain_type=kind, gamma=float(rng.choice([1.0, 0.9, 0.3])),
                        normalize_std=bool(rng.random() < 0.8))
        np.testing.assert_allclose(igpo_advantages(groups, args), loop_reference(groups, args), rtol=1e-9,
                                   atol=1e-12)


def test_invariances() -> None:
    rng = np.random.default_rng(3)
    groups = random_groups(rng, 5)

    def shifted(delta: float, scale: float = 1.0) -> list[EpisodeGroup]:
        return [EpisodeGroup(g.group_id, g.task_id, g.seed, [
            Trajectory([Turn(u.prompt_ids, u.response_ids, u.response_logprobs, u.reward * scale, u.state_key,
                             extras={k: v + delta for k, v in u.extras.items()}) for u in t.turns], "task", 0)
            for t in g.trajectories]) for g in groups]

    base = igpo(groups, epsilon=0.0, variance_floor=0.0)
    # log_prob_diff: a constant shift of every value leaves every gain unchanged.
    np.testing.assert_allclose(igpo(shifted(1.7), epsilon=0.0, variance_floor=0.0), base, atol=1e-9)
    # Scaling the outcome rewards leaves the z-scores unchanged (separate statistics).
    np.testing.assert_allclose(igpo(shifted(0.0, 3.0), epsilon=0.0, variance_floor=0.0), base, atol=1e-9)
    # γ = 0: each turn's advantage is its own normalised reward; separate normalisation centres each
    # set.
    one_step = igpo(groups, gamma=0.0)
    last = np.array([k == len(t.turns) - 1 for g in groups for t in g.trajectories
                     for k in range(len(t.turns))])
    group_of = np.array([i for i, g in enumerate(groups) for t in g.trajectories for _ in t.turns])
    for gi in range(len(groups)):
        assert abs(one_step[(group_of == gi) & last].sum()) < 1e-9
    # Without any recorded value, IGPO is outcome-only: every turn carries its trajectory's z-score.
    bare = [EpisodeGroup(g.group_id, g.task_id, g.seed,
                         [traj([math.nan] * len(t.turns), [u.reward for u in t.turns])
                          for t in g.trajectories])
            for g in groups]
    outcome_only = igpo(bare, gamma=1.0)
    trajectory = np.repeat(np.arange(sum(len(g.trajectories) for g in groups)),
                           [len(t.turns) for g in groups for t in g.trajectories])
    for i in np.unique(trajectory):
        assert np.ptp(outcome_only[trajectory == i]) == 0.0


def test_bad_arguments_name_the_field() -> None:
    algo = get_algorithm("igpo")
    with pytest.raises(ConfigError, match="algorithm.args.norm_mode"):
        algo.make_args({"norm_mode": "pooled"})
    with pytest.raises(ConfigError, match="gamma"):
        algo.make_args({"gamma": 1.5})
    assert algo.needs.answer and algo.needs.scorer


# --- the scoring hook on a real policy ------------------------------------------------------------


@pytest.fixture(scope="module")
def policy() -> TransformersPolicy:
    model, tokenizer = build_tiny_model(TinyModelConfig(hidden_size=32, num_layers=1, intermediate_size=64,
                                                        seed=0))
    return TransformersPolicy(model, tokenizer)


SAMPLING = SamplingParams(max_new_tokens=24, temperature=1.0, seed=5, stop_strings=("</search>", "</answer>"))


def search_env(**kwargs: Any) -> Env:
    register_tool_envs()
    return agentgym.make("search-qa-v0", num_entities=100, max_hops=1, top_k=1, max_turns=3, **kwargs)


def collect(policy: TransformersPolicy, make_env, seeds=(1, 2), group_size: int = 3,
            args: IGPOArgs | None = None) -> tuple[list[EpisodeGroup], IGPOScoring]:
    renderer = PromptRenderer(policy.tokenizer, mode="window", window_turns=0, action_format="raw",
                              include_instructions=False, show_admissible_actions=False)
    collector = Collector(make_env, policy, renderer, action_format="raw")
    hook = IGPOScoring(args or IGPOArgs())
    try:
        groups = collector.collect(list(seeds), group_size, SAMPLING, hooks=hook, iteration=1)
    finally:
        collector.close()
    return groups, hook


def test_scoring_hook_records_the_teacher_forced_answer_value_of_every_prompt(
    policy: TransformersPolicy,
) -> None:
    groups, hook = collect(policy, search_env)
    tokenizer = policy.tokenizer
    prefix = tokenizer.encode("<answer>", add_special_tokens=False)
    turns = 0
    for g in groups:
        for t in g.trajectories:
            answer = tokenizer.encode(t.answer[0], add_special_tokens=False)
            for turn in t.turns:
                [direct] = policy.score([turn.prompt_ids], [prefix + answer])
                assert turn.extras[VALUE_KEY] == pytest.approx(float(np.mean(direct[len(prefix):])), abs=1e-5)
                turns += 1
    metrics = hook.metrics()
    # Group members share their first prompt: it is scored once.
    assert metrics["igpo/scored_contexts"] < turns
    assert metrics["igpo/score_s"] > 0 and metrics["igpo/scored_tokens"] > 0
    igpo_advantages(groups, IGPOArgs())  # the estimator reads the annotation


class SecretAnswer(Env):
    """search-qa with a made-up privileged answer: a string that appears nowhere else."""

    SECRET = "Zyxquv Wombleford"

    def __init__(self) -> None:
        self.inner = search_env()
        self.observation_space, self.action_space = self.inner.observation_space, self.inner.action_space

    def reset(self, *, seed=None, options=None):
        obs, info = self.inner.reset(seed=seed, options=options)
        return obs, {**info, "answer": [self.SECRET]}

    def step(self, action):
        obs, reward, terminated, truncated, info = self.inner.step(action)
        return obs, reward, terminated, truncated, {**info, "answer": [self.SECRET]}

    def close(self):
        self.inner.close()


def test_the_answer_reaches_the_scorer_but_never_a_prompt(policy: TransformersPolicy) -> None:
    groups, _ = collect(policy, SecretAnswer, seeds=(3, 4, 5))
    secret = policy.tokenizer.encode(SecretAnswer.SECRET, add_special_tokens=False)
    for g in groups:
        for t in g.trajectories:
            assert t.answer == [SecretAnswer.SECRET]  # the hook had it
            for turn in t.turns:
                text = policy.tokenizer.decode(turn.prompt_ids)
                assert "Zyxquv" not in text and "Wombleford" not in text
                ids = turn.prompt_ids
                assert not any(ids[i:i + len(secret)] == secret for i in range(len(ids)))
                assert math.isfinite(turn.extras[VALUE_KEY])
    # The same seeds with the real answer: the prompts are token for token the same.
    real, _ = collect(policy, search_env, seeds=(3, 4, 5))
    assert [[u.prompt_ids for t in g.trajectories for u in t.turns] for g in real] == \
        [[u.prompt_ids for t in g.trajectories for u in t.turns] for g in groups]
    assert [u.extras[VALUE_KEY] for g in real for t in g.trajectories for u in t.turns] != \
        [u.extras[VALUE_KEY] for g in groups for t in g.trajectories for u in t.turns]


def test_scoring_over_http_matches_in_process(policy: TransformersPolicy, live_server) -> None:
    from agentgym.http.client import EnvClient, RemoteEnv

    register_tool_envs()
    client = EnvClient(live_server(["search-qa-v0"]).url)  # uvicorn on 127.0.0.1, a random port
    try:
        remote, _ = collect(policy, lambda: RemoteEnv("search-qa-v0", client=client, max_turns=3,
                                                      num_entities=100, max_hops=1, top_k=1))
    finally:
        client.close()
    local, _ = collect(policy, search_env)
    assert [g.to_json() for g in remote] == [g.to_json() for g in local]
    assert all(VALUE_KEY in u.extras for g in remote for t in g.trajectories for u in t.turns)


def test_an_env_without_answers_is_refused_at_start_up(tmp_path: Path) -> None:
    cfg = load_config(None, ["algorithm.name=igpo", "algorithm.args={}"])
    plugins = PluginSet.from_config(cfg)
    model, tokenizer = build_tiny_model(TinyModelConfig(hidden_size=32, num_layers=1, intermediate_size=64))
    env = agentgym.make("maze-v0")
    _, info = env.reset(seed=0)
    with pytest.raises(ConfigError, match="info\\['answer'\\]"):
        plugins.check_needs(TransformersPolicy(model, tokenizer), "maze-v0", info)


# --- learning ------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_regression_pin_igpo_learns_search_qa_seed0(tmp_path: Path) -> None:
    """SFT leaves the tiny model imperfect; IGPO raises held-out success, and the scoring pass is cheap.

    Measured at one torch thread (tests/conftest.py): 31% -> 41% (at 60 iterations 31% -> 27%: on this task
    IGPO's gain is within a seed's noise, 38% -> 42% ± 9% over seeds 0-2 in benchmarks/README.md), so the pin
    asks for half the measured gain.
    """
    register_tool_envs()
    report = train(load_config(PRESET), tmp_path)
    before, after = report["eval"]["before"], report["eval"]["after"]
    assert after["success_rate"] - before["success_rate"] >= 0.05, \
        f"held-out success {before['success_rate']:.0%} -> {after['success_rate']:.0%}"
    assert after["tool_calls_per_episode"] >= 0.9
    history = report["history"]
    assert all(h["igpo/info_gain_turns"] > 0 for h in history)
    score_s = sum(h["igpo/score_s"] for h in history)
    generate_s = sum(h["perf/generate_s"] for h in history)
    assert score_s < generate_s  # measured precisely in benchmarks/algorithms.py
