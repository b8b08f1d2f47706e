"""Registry: ids, lazy entry points, suggestions, kwargs, plugins."""

from __future__ import annotations

import sys
import types

import pytest

import agentgym
from agentgym.errors import ConfigError, DuplicateEnv, RegistryError, UnknownEnv, VersionNotFound
from agentgym.registry import Registry, parse_env_id


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
    with pytest.raises(RegistryError, match="failed to import"):
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
