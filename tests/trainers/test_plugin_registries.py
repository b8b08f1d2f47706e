"""Every named plug-in kind (algorithm, policy loss, loss term, hook option, backend, decoding constraint)
refuses unknown and duplicate names the same way: ``RegistryError``, "Did you mean", "pass override=True"."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

from agentgym.backends import ModelConfig, list_backends, make_policy, register_backend
from agentgym.errors import ERRORS_BY_NAME, ConfigError, RegistryError, UnknownPlugin
from agentgym.rollout import list_constraints, make_constraint, register_constraint
from agentgym.rollout.constraints import TagSpans
from agentgym.training import load_config
from agentgym.training.api.algorithm import ALGORITHMS, get_algorithm, register_algorithm
from agentgym.training.api.options import HOOK_OPTIONS, get_hook_option, register_hook_option
from agentgym.training.api.terms import LOSS_TERMS, get_loss_term, register_loss_term
from agentgym.training.engine.losses import POLICY_LOSSES, get_policy_loss, register_policy_loss


@dataclass(frozen=True)
class NoArgs:
    """A plug-in without settings."""


def _never_built(*args: Any) -> Any:
    raise AssertionError("a refused registration must not replace the registered plug-in")



def _zeros(groups: Any, args: Any) -> np.ndarray:
    return np.zeros(0)


def _no_loss(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("never called")


@dataclass(frozen=True)
class Kind:
    """How one plug-in kind registers, looks up and forgets a name."""

    label: str
    register: Callable[[str, bool], None]
    lookup: Callable[[str], Any]
    forget: Callable[[str], None]
    taken: str  # a built-in name
    typo: str  # a misspelling of ``taken``


def _forget_backend(name: str) -> None:
    from agentgym.backends import builder

    del builder._BACKENDS[name]


def _forget_constraint(name: str) -> None:
    from agentgym.rollout import constraints

    del constraints._CONSTRAINTS[name]


KINDS = [
    Kind("algorithm", lambda n, o: register_algorithm(n, _zeros, NoArgs, override=o), get_algorithm,
         ALGORITHMS.unregister, "gigpo", "gipgo"),
    Kind("policy loss", lambda n, o: register_policy_loss(n, override=o)(_no_loss), get_policy_loss,
         POLICY_LOSSES.unregister, "ppo_clip", "ppo-clip"),
    Kind("loss term", lambda n, o: register_loss_term(n, _never_built, NoArgs, override=o), get_loss_term,
         LOSS_TERMS.unregister, "entropy", "entropi"),
    Kind("hook option", lambda n, o: register_hook_option(n, _never_built, NoArgs, override=o),
         get_hook_option, HOOK_OPTIONS.unregister, "dapo", "dapp"),
    Kind("backend", lambda n, o: register_backend(n, _never_built, override=o),
         lambda n: make_policy(ModelConfig(backend=n)), _forget_backend, "transformers", "transformer"),
    Kind("decoding constraint", lambda n, o: register_constraint(n, _never_built, override=o),
         make_constraint, _forget_constraint, "tag_spans", "tag_span"),
]


@pytest.fixture(params=KINDS, ids=[kind.label for kind in KINDS])
def kind(request: pytest.FixtureRequest) -> Iterator[Kind]:
    yield request.param


def test_an_unknown_name_is_a_registry_error_suggesting_the_nearest(kind: Kind) -> None:
    with pytest.raises(RegistryError, match=f"Did you mean '{kind.taken}'") as info:
        kind.lookup(kind.typo)
    assert "Registered: " in str(info.value) and kind.taken in str(info.value).split("Registered: ")[1]
    assert "\n" not in str(info.value)


def test_a_duplicate_is_refused_unless_override(kind: Kind) -> None:
    before = kind.lookup(kind.taken) if kind.label not in ("backend", "decoding constraint") else None
    with pytest.raises(RegistryError, match=f"'{kind.taken}' is already registered .*pass override=True"):
        kind.register(kind.taken, False)
    if before is not None:
        assert kind.lookup(kind.taken) is before  # the refused registration changed nothing


def test_unknown_backend_and_constraint_are_config_errors_too() -> None:
    """Callers that report bad settings in one line (the config check, the policy server) catch
    ConfigError."""
    with pytest.raises(ConfigError, match="model.backend 'transformer' is not a registered backend. "
                                          "Did you mean 'transformers'"):
        make_policy(ModelConfig(backend="transformer"))
    with pytest.raises(UnknownPlugin, match="Did you mean 'tag_spans'"):
        make_constraint("tag_span:python")
    assert ERRORS_BY_NAME["UnknownPlugin"] is UnknownPlugin  # a remote service's answer maps back to it


def test_a_config_naming_an_unknown_backend_or_constraint_raises_registry_error() -> None:
    with pytest.raises(RegistryError, match="Did you mean 'transformers'"):
        load_config(None, ["model.backend=transformer"])
    with pytest.raises(RegistryError, match="rollout.constraint: no decoding constraint named 'tag_span'. "
                                            "Did you mean 'tag_spans'"):
        load_config(None, ["rollout.constraint=tag_span"])


def test_override_replaces_the_backend_and_the_constraint() -> None:
    built: list[str] = []

    def fake_backend(cfg: ModelConfig, seed: int) -> Any:
        built.append(cfg.backend)
        return "policy"

    register_backend("test_backend", fake_backend)
    register_constraint("test_spans", lambda: TagSpans(("search",)))
    try:
        register_backend("test_backend", fake_backend)  # the same builder again: a no-op
        with pytest.raises(RegistryError, match="pass override=True"):
            register_backend("test_backend", lambda cfg, seed: "other")
        assert make_policy(ModelConfig(backend="test_backend")) == "policy" and built == ["test_backend"]
        register_backend("test_backend", lambda cfg, seed: "other", override=True)
        assert make_policy(ModelConfig(backend="test_backend")) == "other"
        assert "test_backend" in list_backends()

        with pytest.raises(RegistryError, match="pass override=True"):
            register_constraint("test_spans", TagSpans)
        assert make_constraint("test_spans").tags == ("search",)
        register_constraint("test_spans", lambda *tags: TagSpans(tags), override=True)
        assert make_constraint("test_spans:answer").tags == ("answer",)
        assert "test_spans" in list_constraints()
    finally:
        _forget_backend("test_backend")
        _forget_constraint("test_spans")
    assert "test_backend" not in list_backends() and "test_spans" not in list_constraints()

