"""One run set-up for training and evaluation: the same prompt settings (type and defaults) and the same
env source, so `agentgym eval` plays a run's envs with the prompts the run was trained on."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path
from typing import Any

import agentgym
from agentgym.eval.harness import DEFAULT_SEED_START, Evaluation
from agentgym.eval.plan import EnvEntry, EvalPlan
from agentgym.eval.policies import parse_policy, run_prompt_settings
from agentgym.rollout.prompt import PromptSettings
from agentgym.sources.env_source import HELD_OUT_SEED_START, EnvSource
from agentgym.training import load_config
from agentgym.training.config.schema import EvalConfig, RolloutConfig
from agentgym.training.run.setup import action_format, env_factory, env_source


def prompt_part(settings: Any) -> PromptSettings:
    return PromptSettings(**{f.name: getattr(settings, f.name) for f in fields(PromptSettings)})


def test_training_and_eval_share_prompt_settings_and_their_defaults() -> None:
    assert isinstance(RolloutConfig(), PromptSettings)
    assert prompt_part(RolloutConfig()) == PromptSettings() == parse_policy("random").prompt
    assert EvalConfig().seed_offset == DEFAULT_SEED_START == HELD_OUT_SEED_START


def test_a_run_brings_every_prompt_setting_to_eval_its_constraint_included(tmp_path: Path) -> None:
    cfg = load_config(None, ["rollout.constraint=tag_spans", "rollout.stop_strings=[</answer>]",
                             "rollout.max_new_tokens=12"])
    from agentgym.training.config.schema import config_to_dict

    settings = run_prompt_settings(config_to_dict(cfg))
    assert settings == prompt_part(cfg.rollout)
    plan = EvalPlan((parse_policy("random"),), (EnvEntry("maze-v0"),), (0,), temperature=0.5, sampling_seed=9)
    evaluation = Evaluation(plan, tmp_path)
    spec = parse_policy("random")
    run_spec = type(spec)(**{**spec.__dict__, "prompt": settings})
    # eval samples a run's turns as the run's own held-out evaluations do
    assert evaluation._sampling(run_spec) == cfg.rollout.sampling(0.5, 9)
    assert evaluation._sampling(run_spec).constraint == "tag_spans"


def test_training_and_eval_build_their_envs_from_one_source(live_server: Any, tmp_path: Path) -> None:
    server = live_server(["tools-v0", "maze-v0"])
    cfg = load_config(None, ["env.id=tools-v0", f"env.url={server.url}", "env.kwargs={}"])
    assert env_source(cfg) == EnvSource("tools-v0", {}, cfg.env.max_turns, (server.url,), None,
                                        cfg.env.timeout_s)
    assert action_format(cfg) == agentgym.spec("tools-v0").action_format == "raw"  # asked of the service
    fleet = env_factory(cfg)
    try:
        remote = fleet()  # a fleet is also a factory of stand-alone envs
        local = EnvSource("tools-v0").factory()()
        assert remote.reset(seed=4) == local.reset(seed=4)
        remote.close()
        local.close()
    finally:
        fleet.close()  # type: ignore[union-attr]
    plan = EvalPlan((parse_policy("random"),), (EnvEntry("tools-v0", url=server.url),), (0,))
    evaluation = Evaluation(plan, tmp_path)
    try:
        assert evaluation.probe(plan.envs[0]).action_format == "raw"
    finally:
        for client in evaluation._clients.values():
            client.close()
