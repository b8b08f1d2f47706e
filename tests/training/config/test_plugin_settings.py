"""Plug-in settings: each plug-in kind declares its settings type, the schema names no plug-in and no env,
and the YAML a user writes, the errors it gets and the config a run folder holds stay what they were."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path

import pytest

import agentgym
from agentgym.errors import ConfigError, RegistryError
from agentgym.training import TrainConfig, config_from_dict, config_to_dict, load_config
from agentgym.training.api.loss_registry import POLICY_LOSSES, register_policy_loss
from agentgym.training.config import schema
from agentgym.training.config.plugin_settings import (
    PluginSettings,
    plugin_keys,
    register_plugin_settings,
    unregister_plugin_settings,
)

#: The keys the built-in plug-ins declare, by section: what the schema itself declared before.
BUILT_IN_KEYS = {
    "loss": {"cispo_clip_low", "cispo_clip_high", "dppo_tv_low", "dppo_tv_high"},
    "rollout": {"curriculum"},
    "env": {"judge", "harness", "tasks"},
}


def test_the_schema_names_no_env_and_declares_no_plugin_setting() -> None:
    text = Path(schema.__file__).read_text()
    named = [spec.id for spec in agentgym.list_envs() if spec.id in text]
    assert named == [], f"the schema names env ids {named}"
    sections = {"loss": schema.LossConfig, "rollout": schema.RolloutConfig, "env": schema.EnvConfig}
    for section, cls in sections.items():
        own = {f.name for f in dataclasses.fields(cls)}
        assert not own & set(plugin_keys(section)), f"{cls.__name__} declares a plug-in's setting"
        assert BUILT_IN_KEYS[section] <= set(plugin_keys(section))


def test_a_written_config_has_every_setting_as_before() -> None:
    data = config_to_dict(TrainConfig())
    for section, keys in BUILT_IN_KEYS.items():
        assert keys <= set(data[section]), section
    assert "plugins" not in data["loss"] and data["env"]["judge"] is None
    assert data["rollout"]["curriculum"]["pool_size"] == 256 and data["loss"]["cispo_clip_high"] == 0.28


def test_a_config_written_before_plugin_settings_reads_back_the_same() -> None:
    """A run folder's config.json from before: plug-in settings as the schema's own keys."""
    old = config_to_dict(TrainConfig())
    old["rollout"]["task_sampler"] = "curriculum"
    old["rollout"]["curriculum"] = {**old["rollout"]["curriculum"], "pool_size": 64, "epsilon": 0.2}
    old["loss"].update(cispo_clip_low=0.1, dppo_tv_high=0.3)
    cfg = config_from_dict(old)
    assert cfg.rollout.curriculum.pool_size == 64
    assert (cfg.loss.cispo_clip_low, cfg.loss.dppo_tv_high) == (0.1, 0.3)
    assert config_to_dict(cfg) == old


@pytest.mark.parametrize("override, message", [
    ("rollout.curriculum.epsilon=1.5", r"rollout.curriculum.epsilon must be in \[0, 1\], got 1.5"),
    ("rollout.curriculum.pool_sise=4", "unknown config field 'rollout.curriculum.pool_sise'. Did you mean "
                                       "rollout.curriculum.pool_size?"),
    ("loss.cispo_clip_low=1.5", r"loss.cispo_clip_low must be in \[0, 1\]"),
    ("loss.dppo_tv_hgh=0.1", "unknown config field 'loss.dppo_tv_hgh'. Did you mean loss.dppo_tv_high?"),
    ("env.judge.retries=-1", "env.judge.base_url must be an http"),
    ("env.tasks=t.jsonl", "env.harness and env.tasks go together"),
])
def test_bad_plugin_settings_name_the_key_the_user_wrote(override: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(None, [override])


def test_the_harness_settings_decide_the_env() -> None:
    cfg = load_config(None, ["env.harness=agent:run", "env.tasks=tasks.jsonl"])
    assert cfg.env.id == "harness-v0" and cfg.env.harness == "agent:run"
    with pytest.raises(ConfigError, match="env.harness runs on harness-v0, but env.id is 'wordle-v0'"):
        load_config(None, ["env.harness=agent:run", "env.tasks=tasks.jsonl", "env.id=wordle-v0"])


@dataclass(frozen=True)
class TemperedSettings:
    tempered_beta: float = 1.0
    """How hard the doc loss tempers its advantages (> 0)."""

    def __post_init__(self) -> None:
        if not 0 < self.tempered_beta < math.inf:
            raise ConfigError(f"TemperedSettings.tempered_beta must be > 0, got {self.tempered_beta}")


def test_a_third_party_policy_loss_brings_its_settings() -> None:
    @register_policy_loss("doc_tempered", settings=TemperedSettings)
    def tempered(logprobs, old_logprobs, advantages, mask, cfg, agg):  # pragma: no cover - never called
        raise AssertionError

    entry = PluginSettings("loss", TemperedSettings, owner="policy loss 'doc_tempered'")
    try:
        cfg = load_config(None, ["loss.loss_mode=doc_tempered", "loss.tempered_beta=0.5"])
        assert cfg.loss.tempered_beta == 0.5 and config_to_dict(cfg)["loss"]["tempered_beta"] == 0.5
        assert load_config(None, []).loss.tempered_beta == 1.0
        with pytest.raises(ConfigError, match="loss.tempered_beta must be > 0, got -1.0"):
            load_config(None, ["loss.tempered_beta=-1"])
        with pytest.raises(RegistryError, match="config key loss.tempered_beta is already declared by policy "
                                                "loss 'doc_tempered'"):
            register_plugin_settings("loss", dataclasses.make_dataclass("Other", [("tempered_beta", float)]),
                                     owner="another loss")
    finally:
        POLICY_LOSSES.unregister("doc_tempered")
        unregister_plugin_settings(entry)
    assert "tempered_beta" not in plugin_keys("loss")
