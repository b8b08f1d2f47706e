"""Doctests of the plug-in packages, run under their installed names (``agentgym.envs.*``,
``agentgym.trainers.*``).

``pytest --doctest-modules envs trainers`` would import each file a second time as ``envs.x`` /
``trainers.x``: every built-in would register twice, and registries rightly refuse a second,
different registration of a name. So these modules' doctests run from here instead.
"""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import agentgym.envs
import agentgym.trainers


def _modules(package: object) -> list[str]:
    return sorted(info.name for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."))  # type: ignore[attr-defined]


MODULES = [agentgym.envs.__name__, agentgym.trainers.__name__, *_modules(agentgym.envs),
           *_modules(agentgym.trainers)]


@pytest.mark.parametrize("name", MODULES)
def test_doctests(name: str) -> None:
    module = importlib.import_module(name)
    failures, _ = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE,
                                  raise_on_error=False, report=True, verbose=False)
    assert failures == 0, f"{failures} doctest(s) failed in {name} (see the output above)"


def test_every_plugin_module_is_collected() -> None:
    assert "agentgym.trainers.gigpo" in MODULES and "agentgym.envs.games.maze" in MODULES
