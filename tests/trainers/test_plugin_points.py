"""The six plug-in points, used from outside the package: rollout hooks (forks, filters, sampling),
update plans, loss terms, policy losses, needs and group sizes — and a toy algorithm that trains."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pytest
import torch
from learning import small

import agentgym
from agentgym.backends import TinyModelConfig
from agentgym.backends.tiny import build_tiny_model
from agentgym.backends.transformers_backend import TransformersPolicy
from agentgym.errors import ConfigError, RegistryError
from agentgym.rollout import Collector, Fork, PromptRenderer, RolloutHooks, SamplingParams
from agentgym.training import (
    Phase,
    TurnTable,
    UpdatePlan,
    episode_advantages,
    get_algorithm,
    load_config,
    register_algorithm,
    register_hook_option,
)
from agentgym.training.api.algorithm import ALGORITHMS, AlgorithmNeeds
from agentgym.training.api.options import HOOK_OPTIONS
from agentgym.training.api.terms import LOSS_TERMS, LossTerm, register_loss_term
from agentgym.training.run.loop import Trainer, train

SMALL = small("iterations=3", "rollout.group_size=3", "eval.num_episodes=2")


@pytest.fixture(scope="module")
def policy() -> TransformersPolicy:
    model, tokenizer = build_tiny_model(TinyModelConfig(hidden_size=32, num_layers=1, intermediate_size=64,
                                                        seed=0))
    return TransformersPolicy(model, tokenizer)


def collector_for(policy: TransformersPolicy, make_env=None) -> Collector:
    renderer = PromptRenderer(policy.tokenizer, mode="current", include_instructions=False,
                              show_admissible_actions=False)
    return Collector(make_env or (lambda: agentgym.make("maze-v0", size=2, observation="local", max_turns=4)),
                     policy, renderer)


SAMPLING = SamplingParams(max_new_tokens=4, temperature=1.0, seed=3)


# --- rollout hooks: forks ---------------------------------------------------------------------------


class ForkFirstAfterTurnOne(RolloutHooks):
    """Forks trajectory t0 of every group after its first turn, and starts one fresh episode in group 0."""

    def before_collect(self, num_groups: int) -> None:
        self.done: set[int] = set()

    def after_turn(self, episodes, context):
        forks = []
        for view in episodes:
            if view.trajectory_id.endswith("-t0") and len(view.turns) == 1 and not view.over \
                    and view.group_index not in self.done:
                self.done.add(view.group_index)
                forks.append(Fork(view.group_index, view.trajectory_id))
                if view.group_index == 0:
                    forks.append(Fork(0))  # a fresh episode of the task (a top-up)
        return forks


def test_collector_performs_forks_and_top_ups(policy: TransformersPolicy) -> None:
    collector = collector_for(policy)
    try:
        groups = collector.collect([11, 12], 2, SAMPLING, hooks=ForkFirstAfterTurnOne())
    finally:
        collector.close()
    assert collector.last_stats.forks > 0
    checked = 0
    for g, group in enumerate(groups):
        by_id = {t.trajectory_id: t for t in group.trajectories}
        forks = [t for t in group.trajectories if t.parent_id is not None]
        parent = by_id[f"g{g}-t0"]
        if len(parent.turns) < 2 and not forks:
            continue  # the parent ended on its first turn: nothing to fork
        assert len(forks) == 1
        fork = forks[0]
        assert fork.parent_id == parent.trajectory_id and fork.fork_turn == 1
        assert fork.turns[0] == parent.turns[0]  # the copied prefix
        assert fork.seed == parent.seed and fork.task_id == parent.task_id
        # The branch continues from the parent's state after turn 1: its second turn starts there.
        assert fork.turns[1].state_key == parent.turns[1].state_key
        assert fork.turns[1].prompt_ids == parent.turns[1].prompt_ids
        checked += 1
    assert checked > 0
    fresh = [t for t in groups[0].trajectories
             if t.parent_id is None and t.trajectory_id not in ("g0-t0", "g0-t1")]
    assert len(fresh) == 1 and fresh[0].turns[0].state_key == groups[0].trajectories[0].turns[0].state_key


def test_forked_branch_equals_replaying_its_actions(policy: TransformersPolicy) -> None:
    """A branch's observations are exactly what a fresh env gives for the same seed and actions."""
    collector = collector_for(policy)
    try:
        groups = collector.collect([21, 22, 23], 2, SAMPLING, hooks=ForkFirstAfterTurnOne())
    finally:
        collector.close()
    checked = 0
    for group in groups:
        for trajectory in group.trajectories:
            if trajectory.parent_id is None:
                continue
            env = agentgym.make("maze-v0", size=2, observation="local", max_turns=4)
            env.reset(seed=trajectory.seed)
            for turn in trajectory.turns:
                obs, reward, *_ = env.step(turn.action)
                assert (obs, reward) == (turn.observation, turn.reward)
            checked += 1
    assert checked > 0


def test_forks_over_http_use_the_service(policy: TransformersPolicy, make_service) -> None:
    from agentgym.http.client import EnvClient, RemoteEnv

    client = EnvClient(client=make_service(["maze-v0"]))
    collector = collector_for(policy, lambda: RemoteEnv("maze-v0", client=client, max_turns=4, size=2,
                                                        observation="local"))
    local = collector_for(policy)
    try:
        remote_groups = collector.collect([31, 32], 2, SAMPLING, hooks=ForkFirstAfterTurnOne())
        local_groups = local.collect([31, 32], 2, SAMPLING, hooks=ForkFirstAfterTurnOne())
    finally:
        collector.close()
        local.close()
        client.close()
    assert [g.to_json() for g in remote_groups] == [g.to_json() for g in local_groups]
    assert any(t.parent_id for g in remote_groups for t in g.trajectories)


def test_a_fork_of_an_unknown_or_ended_episode_is_a_clear_error(policy: TransformersPolicy) -> None:
    class BadFork(RolloutHooks):
        def after_turn(self, episodes, context):
            return [Fork(0, "no-such-trajectory")]

    collector = collector_for(policy)
    try:
        with pytest.raises(ConfigError, match="no-such-trajectory.*unknown"):
            collector.collect([1], 2, SAMPLING, hooks=BadFork())
    finally:
        collector.close()


# --- rollout hooks: sampling and filtering ----------------------------------------------------------


class AskForEntropiesAndTopK(RolloutHooks):
    def sampling(self, params):
        return replace(params, return_entropy=True, num_top_logprobs=3)


def test_sampling_hook_reaches_the_backend_and_the_records(policy: TransformersPolicy) -> None:
    collector = collector_for(policy)
    try:
        [group] = collector.collect([5], 2, SAMPLING, hooks=AskForEntropiesAndTopK())
    finally:
        collector.close()
    turn = group.trajectories[0].turns[0]
    assert len(turn.extras["entropies"]) == len(turn.response_ids)
    assert len(turn.extras["top_logprobs"]) == len(turn.response_ids)
    assert all(1 <= len(position) <= 3 for position in turn.extras["top_logprobs"])
    json.dumps(group.to_json())  # records stay JSON-safe


@dataclass(frozen=True)
class DropEarlyArgs:
    max_extra_rounds: int = 3
    """Extra collection rounds allowed."""
    drop_collections: int = 2
    """Collections whose groups are all dropped."""


class DropEarly(RolloutHooks):
    """A filter with a known outcome: drops every group of the first collections, keeps the rest."""

    def __init__(self, args: DropEarlyArgs) -> None:
        self.max_extra_rounds = args.max_extra_rounds
        self.drop_collections = args.drop_collections
        self.collections = 0
        self.dropped = 0

    def after_collect(self, groups, context):
        self.collections += 1
        self.dropped = len(groups) if self.collections <= self.drop_collections else 0
        return [] if self.dropped else groups

    def metrics(self):
        return {"toy/dropped_groups": float(self.dropped)}


@pytest.mark.parametrize("drop, rounds, kept", [(2, 4, 3), (0, 4, 3), (9, 2, 0)])
def test_filter_option_refills_the_batch_with_extra_rounds(tmp_path: Path, drop: int, rounds: int,
                                                           kept: int) -> None:
    register_hook_option("test_drop_early", DropEarly, DropEarlyArgs, override=True)
    try:
        cfg = load_config(None, [*SMALL, "sft.enabled=false", "rollout.num_tasks=3",
                                 f"algorithm.hooks={{test_drop_early: {{max_extra_rounds: {rounds}, "
                                 f"drop_collections: {drop}}}}}"])
        trainer = Trainer(cfg, tmp_path)
        try:
            groups, stats, metrics = trainer.collect(1)
        finally:
            trainer.close()
        assert len(groups) == kept == metrics["rollout/groups"]
        # More rounds only while groups were missing.
        assert metrics["rollout/extra_rounds"] == min(drop, rounds)
        assert len({g.group_id for g in groups}) == len(groups)  # rounds never reuse group ids
        with pytest.raises(ConfigError,
                           match="algorithm.hooks.test_drop_early.max_extra_rounds must be an integer"):
            load_config(None, ["algorithm.hooks={test_drop_early: {max_extra_rounds: lots}}"])
    finally:
        HOOK_OPTIONS.unregister("test_drop_early")


# --- a toy third-party algorithm: estimator + hook + update plan + loss term --------------------------


@dataclass(frozen=True)
class ToyArgs:
    penalty: float = 0.0
    """Unused: an argument to validate."""


def toy_advantages(groups, args):
    return episode_advantages(TurnTable.from_groups(groups), args.penalty, "mean_norm", 0.0)


class ToyHooks(RolloutHooks):
    """Asks for entropies, forks one episode per collection and counts its calls."""

    def __init__(self) -> None:
        self.collections = 0
        self.forked = False

    def sampling(self, params):
        return replace(params, return_entropy=True)

    def before_collect(self, num_groups):
        self.collections += 1
        self.forked = False

    def after_turn(self, episodes, context):
        for view in episodes:
            if not view.over and not self.forked:
                self.forked = True
                return [Fork(view.group_index, view.trajectory_id)]
        return []

    def metrics(self):
        return {"toy/collections": float(self.collections)}

    def state_dict(self):
        return {"collections": self.collections}

    def load_state_dict(self, state):
        self.collections = state.get("collections", 0)


class LastTurnFirst(UpdatePlan):
    """One phase per turn index, last first; records the phases and the mean ratio after each."""

    wants_logprobs_after = True

    def __init__(self) -> None:
        self.ratios: dict[str, float] = {}
        self.order: list[str] = []

    def phases(self, index):
        return [Phase(f"step{k}", np.flatnonzero(index.step == k)) for k in sorted(set(index.step.tolist()),
                                                                                     reverse=True)]

    def advantages(self, phase, index, advantages):
        self.order.append(phase.name)
        return advantages

    def after_phase(self, phase, index, old_logprobs, new_logprobs):
        for row, before, after in zip(phase.rows, old_logprobs, new_logprobs, strict=True):
            self.ratios[index.trajectory_id[row]] = float(np.exp(np.mean(after - before)))
        ratios = [np.exp(np.mean(a - b)) for a, b in zip(new_logprobs, old_logprobs, strict=True)]
        return {"toy/phase_ratio": float(np.mean(ratios))}


@dataclass(frozen=True)
class L2Args:
    coef: float = 0.01
    """Weight of the squared log-prob penalty."""


class L2Term(LossTerm):
    """coef·mean(logπ²) over response tokens; counts iterations in its state."""

    def __init__(self, args: L2Args) -> None:
        self.coef = args.coef
        self.iterations = 0

    def __call__(self, batch, outputs, cfg):
        value = outputs.agg.reduce(outputs.logprobs.square(), batch.response_mask)  # the run's aggregation
        return self.coef * value, {"loss/toy_l2": value.item()}

    def end_iteration(self):
        self.iterations += 1
        return {"toy/term_iterations": float(self.iterations)}

    def state_dict(self):
        return {"iterations": self.iterations}

    def load_state_dict(self, state):
        self.iterations = state.get("iterations", 0)


@pytest.fixture()
def toy_algorithm():
    register_loss_term("test_toy_l2", L2Term, L2Args, override=True)
    register_algorithm("test_toy", toy_advantages, ToyArgs, hooks=lambda args: ToyHooks(),
                       update_plan=lambda args: LastTurnFirst(), loss_terms={"test_toy_l2": {"coef": 0.05}},
                       policy_loss="gspo", override=True)
    yield
    ALGORITHMS.unregister("test_toy")
    LOSS_TERMS.unregister("test_toy_l2")


def test_a_third_party_algorithm_trains_with_its_hook_plan_and_loss_term(tmp_path: Path,
                                                                         toy_algorithm) -> None:
    overrides = [*SMALL, "algorithm.name=test_toy", "algorithm.args={}", "loss.clip_ratio_low=0.0003",
                 "loss.clip_ratio_high=0.0004"]
    cfg = load_config(None, overrides)
    before = {n: p.detach().clone() for n, p in build_tiny_model(replace(cfg.model.tiny, seed=cfg.seed))[0]
              .named_parameters()}
    report = train(cfg, tmp_path)
    history = report["history"]
    assert [h["toy/collections"] for h in history] == [1.0, 2.0, 3.0]  # the hook's state advanced
    assert all(h["perf/update_phases"] >= 2 for h in history)  # one phase per turn index
    assert all("loss/toy_l2" in h and h["toy/term_iterations"] == i + 1 for i, h in enumerate(history))
    assert all(h["rollout/forks"] == 1 for h in history)
    assert all("toy/phase_ratio" in h for h in history)
    episodes = [json.loads(line) for line in (tmp_path / "trajectories" / "iter_00001.jsonl").open()]
    forked = [t for t in episodes if t["parent_id"]]  # one line per episode
    assert len(forked) == 1 and forked[0]["turns"][0]["extras"]["entropies"]
    state = torch.load(tmp_path / "checkpoint.pt", weights_only=False)["plugins"]
    assert state["terms"]["test_toy_l2"] == {"iterations": 3}
    assert state["hooks"] == {"0": {"collections": 3}}
    after = torch.load(tmp_path / "checkpoint.pt", weights_only=False)["model"]
    assert any(not torch.equal(before[n], after[n]) for n in before)  # it trained


def test_policy_loss_is_selectable_from_config(toy_algorithm) -> None:
    from agentgym.training.api.plugin_set import PluginSet

    toy = load_config(None, ["algorithm.name=test_toy", "algorithm.args={}"])
    assert PluginSet.from_config(toy).policy_loss_name == "gspo"  # the algorithm's default
    assert PluginSet.from_config(load_config(None, ["algorithm.name=test_toy", "algorithm.args={}",
                                                 "loss.loss_mode=ppo_clip"])).policy_loss_name == "ppo_clip"
    plugins = PluginSet.from_config(load_config(None, ["loss.kl_type=k2", "loss.loss_agg_norm_tokens=64"]))
    assert plugins.terms["kl"].args.kl_type == "k2"


# --- needs and group sizes fail at start-up -----------------------------------------------------------


def test_needs_are_checked_before_anything_is_created(tmp_path: Path) -> None:
    register_algorithm("test_needs_answer", toy_advantages, ToyArgs, needs=AlgorithmNeeds(answer=True),
                       override=True)
    register_algorithm("test_singleton", toy_advantages, ToyArgs, min_group_size=4, override=True)
    try:
        run_dir = tmp_path / "run"
        with pytest.raises(ConfigError, match="needs the env's privileged info\\['answer'\\].*maze-v0"):
            Trainer(load_config(None, [*SMALL, "algorithm.name=test_needs_answer", "algorithm.args={}"]),
                    run_dir)
        assert not run_dir.exists()
        with pytest.raises(ConfigError, match="rollout.group_size must be >= 4 for 'test_singleton'"):
            load_config(None, [*SMALL, "algorithm.name=test_singleton", "algorithm.args={}"])
    finally:
        ALGORITHMS.unregister("test_needs_answer")
        ALGORITHMS.unregister("test_singleton")


def test_a_scorer_need_is_checked_against_the_backend() -> None:
    from agentgym.rollout.policy import Scorer
    from agentgym.training.api.plugin_set import PluginSet

    register_algorithm("test_needs_scorer", toy_advantages, ToyArgs, needs=AlgorithmNeeds(scorer=True),
                       override=True)
    try:
        plugins = PluginSet.from_config(load_config(None, ["algorithm.name=test_needs_scorer",
                                                           "algorithm.args={}"]))

        class GenerateOnly:
            tokenizer = None

            def generate(self, prompts, params):
                return []

            def sync_weights(self, state_dict):
                pass

        assert not isinstance(GenerateOnly(), Scorer)
        with pytest.raises(ConfigError, match="needs teacher-forced scoring"):
            plugins.check_needs(GenerateOnly(), "maze-v0", {})
    finally:
        ALGORITHMS.unregister("test_needs_scorer")


def test_duplicate_registrations_need_override() -> None:
    """A third-party module defining its own ``gigpo_advantages`` must not replace the built-in silently."""
    builtin = get_algorithm("gigpo")

    def gigpo_advantages(groups, args):  # same name as the built-in's estimator, different function
        return np.zeros(0)

    with pytest.raises(RegistryError, match="'gigpo' is already registered"):
        register_algorithm("gigpo", gigpo_advantages, builtin.args_type)
    assert get_algorithm("gigpo") is builtin
    # Registering the identical definition again is harmless.
    again = register_algorithm("gigpo", builtin.estimator, builtin.args_type, description=builtin.description)
    assert again is builtin
