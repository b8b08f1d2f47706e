"""Registry: ids, lazy entry points, suggestions, kwargs, plugins."""

from __future__ import annotations

import dataclasses
import sys
import types
from collections.abc import Callable
from typing import Any

import pytest

import agentgym
from agentgym.errors import ConfigError, DuplicateEnv, RegistryError, UnknownEnv, VersionNotFound
from agentgym.examples import EchoEnv
from agentgym.guard import EpisodeGuard
from agentgym.registry import Registry, RegistrySpec, load_env_creator
from agentgym.spec import ACTION_FORMATS, EnvSpec, parse_env_id

TOOL_ENVS = ("search-qa-v0", "code-math-v0", "code-tests-v0", "tools-v0", "mcp-v0")


def test_parse_env_id() -> None:
    assert parse_env_id("maze-v0") == (None, "maze", 0)
    assert parse_env_id("acme/big-maze-v12") == ("acme", "big-maze", 12)
    assert parse_env_id("maze") == (None, "maze", None)
    with pytest.raises(RegistryError, match="malformed env id"):
        parse_env_id("bad id with spaces")


def test_builtins_are_registered() -> None:
    ids = [s.id for s in agentgym.list_envs()]
    assert "maze-v0" in ids and "sokoban-v0" in ids
    assert ids == sorted(ids)


def test_unknown_id_suggests_nearest() -> None:
    with pytest.raises(UnknownEnv, match="Did you mean 'maze-v0'"):
        agentgym.make("mzae-v0")
    with pytest.raises(UnknownEnv) as info:
        agentgym.make("QUANTUMTELEPORTATIONCHAMBER")
    assert "Did you mean" not in str(info.value) and "agentgym envs" in str(info.value)


def test_version_errors_list_versions() -> None:
    with pytest.raises(VersionNotFound, match="registered: maze-v0"):
        agentgym.spec("maze-v7")
    with pytest.raises(VersionNotFound, match="did you mean 'maze-v0'"):
        agentgym.spec("maze")


def test_lazy_entry_point_imports_only_on_make() -> None:
    reg = Registry()
    reg._plugins_loaded = True  # isolate from built-ins
    module = types.ModuleType("lazy_env_module_for_test")
    sys.modules.pop(module.__name__, None)
    reg.register("lazy/thing-v0", "lazy_env_module_for_test:Thing")
    assert "lazy_env_module_for_test" not in sys.modules
    with pytest.raises(RegistryError, match="module .lazy_env_module_for_test. cannot be imported"):
        reg.make("lazy/thing-v0")


def test_entry_point_errors_are_clear() -> None:
    reg = Registry()
    reg._plugins_loaded = True
    reg.register("bad/noattr-v0", "agentgym.examples:NoSuchEnv")
    with pytest.raises(RegistryError, match="has no attribute 'NoSuchEnv'"):
        reg.make("bad/noattr-v0")
    reg.register("bad/notenv-v0", lambda: object())
    with pytest.raises(RegistryError, match="not an agentgym.Env"):
        reg.make("bad/notenv-v0")


def test_duplicate_and_override() -> None:
    reg = Registry()
    reg._plugins_loaded = True
    reg.register("x/echo-v0", "agentgym.examples:EchoEnv")
    reg.register("x/echo-v0", "agentgym.examples:EchoEnv")  # identical: a re-import, not a conflict
    with pytest.raises(DuplicateEnv, match="override=True"):
        reg.register("x/echo-v0", "agentgym.examples:EchoEnv", max_turns=4)
    reg.register("x/echo-v0", "agentgym.examples:EchoEnv", kwargs={"target": "yo"}, override=True)
    env = reg.make("x/echo-v0")
    env.reset(seed=0)
    assert env.step("yo")[2] is True


def test_register_requires_version_and_valid_max_turns() -> None:
    reg = Registry()
    with pytest.raises(RegistryError, match="has no version"):
        reg.register("noversion", "agentgym.examples:EchoEnv")
    with pytest.raises(ConfigError, match="max_turns"):
        reg.register("x/e-v0", "agentgym.examples:EchoEnv", max_turns=0)


def test_kwargs_override_and_bad_kwargs_name_the_choices() -> None:
    agentgym.register("test/echo-v0", "agentgym.examples:EchoEnv", kwargs={"target": "a"}, override=True)
    env = agentgym.make("test/echo-v0", target="b")
    env.reset(seed=0)
    assert env.step("b")[1] == 1.0
    with pytest.raises(ConfigError, match="It accepts: target"):
        agentgym.make("test/echo-v0", colour="red")


def test_max_turns_from_spec_and_override() -> None:
    agentgym.register("test/echo3-v0", "agentgym.examples:EchoEnv", max_turns=3, override=True)
    assert agentgym.make("test/echo3-v0").max_turns == 3
    assert agentgym.make("test/echo3-v0", max_turns=1).max_turns == 1
    with pytest.raises(ConfigError, match="max_turns"):
        agentgym.make("test/echo3-v0", max_turns=-2)


def test_broken_plugin_warns_but_builtins_survive(monkeypatch: pytest.MonkeyPatch) -> None:
    class BrokenEntryPoint:
        name, value = "broken", "broken_plugin:register"

        def load(self) -> None:
            raise ImportError("no module named broken_plugin")

    class GoodEntryPoint:
        name, value = "good", "good_plugin:register"

        def load(self):
            return lambda: reg.register("plugin/echo-v0", "agentgym.examples:EchoEnv")

    reg = Registry()
    monkeypatch.setattr(
        "agentgym.plugins.metadata.entry_points", lambda group: [BrokenEntryPoint(), GoodEntryPoint()]
    )
    with pytest.warns(RuntimeWarning, match="broken"):
        ids = [s.id for s in reg.list_envs()]
    assert "plugin/echo-v0" in ids


# --- EnvSpec is data; the registry builds ----------------------------------------------------------


def test_env_spec_is_plain_validated_data() -> None:
    assert agentgym.EnvSpec is EnvSpec
    fields = [f.name for f in dataclasses.fields(EnvSpec)]
    assert fields == ["id", "entry_point", "description", "max_turns", "kwargs", "action_format"]
    spec = EnvSpec("acme/echo-v2", "agentgym.examples:EchoEnv")
    assert not hasattr(spec, "make") and not hasattr(spec, "load_creator")
    assert spec.action_format is None and ACTION_FORMATS == ("plain", "tag", "raw")
    with pytest.raises(RegistryError, match="malformed env id"):
        EnvSpec("bad id", "agentgym.examples:EchoEnv")
    with pytest.raises(ConfigError, match="max_turns of 'acme/echo-v2'"):
        EnvSpec("acme/echo-v2", "agentgym.examples:EchoEnv", max_turns=0)
    with pytest.raises(ConfigError, match="max_turns"):
        EnvSpec("acme/echo-v2", "agentgym.examples:EchoEnv", max_turns=True)
    with pytest.raises(ConfigError, match="'plain', 'tag', 'raw'"):
        EnvSpec("acme/echo-v2", "agentgym.examples:EchoEnv", action_format="json")


def test_tool_envs_take_raw_replies_and_the_others_keep_the_default() -> None:
    for spec in agentgym.list_envs():
        if spec.id in TOOL_ENVS:
            assert spec.action_format == "raw", spec.id
        elif str(spec.entry_point).startswith("agentgym.envs."):
            assert spec.action_format is None, spec.id
    assert agentgym.spec("tools-v0").to_json()["action_format"] == "raw"
    assert agentgym.spec("maze-v0").to_json()["action_format"] is None


def test_action_format_is_registered_and_served(make_service: Callable[..., Any]) -> None:
    agentgym.register("test/tagged-echo-v0", "agentgym.examples:EchoEnv", action_format="tag", override=True)
    assert agentgym.spec("test/tagged-echo-v0").action_format == "tag"
    with pytest.raises(ConfigError, match="action_format"):
        agentgym.register("test/bad-format-v0", "agentgym.examples:EchoEnv", action_format="xml")
    client = make_service(["test/tagged-echo-v0", "code-math-v0"])
    assert client.get("/envs/test/tagged-echo-v0").json()["action_format"] == "tag"
    assert client.get("/envs/code-math-v0").json()["action_format"] == "raw"


def test_make_takes_an_unregistered_spec_and_attaches_a_spec_that_can_make() -> None:
    spec = EnvSpec("user/echo-v0", EchoEnv, max_turns=2, kwargs={"target": "a"})
    env = agentgym.make(spec, target="b")
    assert isinstance(env, EpisodeGuard) and env.max_turns == 2
    env.reset(seed=0)
    assert env.step("b")[1] == 1.0  # make's kwargs override the spec's
    assert isinstance(env.spec, RegistrySpec) and isinstance(env.spec, EnvSpec)
    assert env.unwrapped.spec is env.spec and env.spec.id == "user/echo-v0"
    sibling = env.spec.make()  # Gymnasium's checker builds envs this way
    sibling.reset(seed=0)
    assert sibling.step("a")[1] == 1.0  # the spec's own kwargs
    with pytest.raises(UnknownEnv):
        agentgym.spec("user/echo-v0")  # making a spec does not register it
    with pytest.raises(ConfigError, match="an env id or an EnvSpec"):
        agentgym.make(42)  # type: ignore[arg-type]


def test_registered_specs_make_and_load_like_the_module_functions() -> None:
    spec = agentgym.register("test/made-echo-v0", "agentgym.examples:EchoEnv", kwargs={"target": "yo"},
                             override=True)
    assert isinstance(spec, RegistrySpec) and agentgym.spec("test/made-echo-v0") is spec
    assert load_env_creator(spec) is EchoEnv
    env = spec.make(max_turns=1)
    env.reset(seed=0)
    assert env.max_turns == 1 and env.step("no")[3] is True


def test_render_mode_is_checked_against_the_env_metadata() -> None:
    env = agentgym.make("maze-v0", render_mode="ansi")
    assert env.render_mode == env.unwrapped.render_mode == "ansi"
    env.reset(seed=0)
    assert isinstance(env.render(), str)
    assert agentgym.make("maze-v0").render_mode is None
    with pytest.raises(ConfigError, match=r"renders in modes \['ansi'\]; got render_mode='rgb_array'"):
        agentgym.make("maze-v0", render_mode="rgb_array")


def test_an_env_argument_named_env_passes_through_make() -> None:
    class Wrapping(EchoEnv):
        def __init__(self, env: str = "x") -> None:
            super().__init__(target=env)

    env = agentgym.make(EnvSpec("user/wrapping-v0", Wrapping), env="inner")
    env.reset(seed=0)
    assert env.step("inner")[1] == 1.0
