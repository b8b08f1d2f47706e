"""A non-editable wheel in a fresh venv imports agentgym.envs and serves without torch."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

PLUGIN_SETUP = """
[build-system]
requires = ["setuptools>=68"]
build-backend = "setuptools.build_meta"

[project]
name = "acme-agentgym-plugin"
version = "0.0.1"

[project.entry-points."agentgym.envs"]
acme = "acme_envs:register_envs"
"""

PLUGIN_CODE = """
import agentgym
from agentgym.core import Env

class Coin(Env):
    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return "flip", {"state_key": "start"}

    def step(self, action):
        return "done", 1.0, True, False, {"state_key": "end", "success": True}

def register_envs():
    agentgym.register("acme/coin-v0", "acme_envs:Coin", description="A third-party env", max_turns=1)
"""

SCRIPT = """
import sys, pkgutil
import agentgym, agentgym.envs, agentgym.trainers
assert "site-packages" in agentgym.envs.__file__, agentgym.envs.__file__
for mod in pkgutil.walk_packages(agentgym.envs.__path__, "agentgym.envs."):
    __import__(mod.name)
env = agentgym.make("maze-v0")
obs, info = env.reset(seed=0)
assert info["state_key"]
coin = agentgym.make("acme/coin-v0")
coin.reset(seed=0)
assert coin.step("x")[1] == 1.0
from agentgym.http.server import create_app
create_app(["maze-v0"])
assert "torch" not in sys.modules
print("OK", sorted(s.id for s in agentgym.list_envs()))
"""


def _run(*cmd: str | Path, cwd: Path | None = None) -> str:
    result = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, cwd=cwd, timeout=600)
    assert result.returncode == 0, f"{cmd} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result.stdout


def test_every_subpackage_is_listed_in_pyproject() -> None:
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    for folder, prefix in ((ROOT / "envs", "agentgym.envs"), (ROOT / "trainers", "agentgym.trainers"),
                           (ROOT / "configs", "agentgym.configs"), (ROOT / "agentgym", "agentgym")):
        # The folders themselves, not pkgutil.walk_packages: walking from a bare path imports each nested
        # package by its short name, which finds the installed textworld/alfworld instead of envs/textworld.
        found = {".".join([prefix, *init.parent.relative_to(folder).parts])
                 for init in folder.rglob("__init__.py")}
        assert found <= listed, (
            f"add {sorted(found - listed)} to [tool.setuptools] packages in pyproject.toml")


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_wheel_installs_into_fresh_venv(tmp_path: Path) -> None:
    _run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", tmp_path / "dist",
         ROOT)
    wheel = next((tmp_path / "dist").glob("agentgym_rl-*.whl"))
    plugin = tmp_path / "plugin"
    plugin.mkdir()
    (plugin / "pyproject.toml").write_text(PLUGIN_SETUP)
    (plugin / "acme_envs.py").write_text(textwrap.dedent(PLUGIN_CODE))
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    _run(python, "-m", "pip", "install", "--quiet", f"{wheel}[server]", plugin)
    out = _run(python, "-c", SCRIPT, cwd=tmp_path)
    assert "OK" in out and "acme/coin-v0" in out and "maze-v0" in out
