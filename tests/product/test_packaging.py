"""A non-editable wheel in a fresh venv imports agentgym.envs and serves without torch; a third-party env
package installed with pip reaches every command through the ``agentgym.envs`` entry point."""

from __future__ import annotations

import json
import sys
import textwrap
import venv
from pathlib import Path

import httpx
import installed
import pytest
from installed import run_ok

from agentgym.service_kit.launcher import free_port, start_service, stop_service

ROOT = Path(__file__).resolve().parents[2]

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
    # Say "heads" to win. An expert_action and nothing else declares the expert.
    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return "Call the coin.", {"state_key": "start"}

    def step(self, action):
        won = action.strip() == "heads"
        return "heads" if won else "tails", float(won), True, False, {"state_key": "end", "success": won}

    def expert_action(self):
        return "heads"

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
assert coin.step("heads")[1] == 1.0 and coin.has_expert
from agentgym.http.server import create_app
create_app(["maze-v0"])
assert "torch" not in sys.modules
print("OK", sorted(s.id for s in agentgym.list_envs()))
"""


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
def test_wheel_installs_into_fresh_venv(tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    wheel = installed.wheel(tmp_path_factory)
    plugin = tmp_path / "plugin"
    plugin.mkdir()
    (plugin / "pyproject.toml").write_text(PLUGIN_SETUP)
    (plugin / "acme_envs.py").write_text(textwrap.dedent(PLUGIN_CODE))
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    run_ok(python, "-m", "pip", "install", "--quiet", f"{wheel}[server]", plugin)
    out = run_ok(python, "-c", SCRIPT, cwd=tmp_path)
    assert "OK" in out and "acme/coin-v0" in out and "maze-v0" in out


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_pip_installed_env_package_works_through_every_command(
        tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    """What docs/envs.md tells a package author: the entry point in pyproject.toml, ``pip install
    ./acme-plugin``, then ``envs``, ``check``, ``serve``, ``train`` and ``eval`` from any folder."""
    env_dir = installed.overlay_venv(tmp_path_factory, tmp_path / "venv")
    python, agentgym = env_dir / "bin" / "python", env_dir / "bin" / "agentgym"
    plugin = tmp_path / "acme-plugin"
    plugin.mkdir()
    (plugin / "pyproject.toml").write_text(PLUGIN_SETUP)
    (plugin / "acme_envs.py").write_text(textwrap.dedent(PLUGIN_CODE))
    # `pip install ./acme-plugin`, non-editable (the build's setuptools is this venv's: no index needed)
    run_ok(sys.executable, "-m", "pip", "--python", python, "install", "--quiet", "--no-deps", "--no-index",
         "--no-build-isolation", plugin)
    empty = tmp_path / "empty"
    empty.mkdir()
    where = run_ok(python, "-c", "import acme_envs, agentgym; print(acme_envs.__file__, agentgym.__file__)",
                 cwd=empty).split()
    assert all(Path(module).is_relative_to(env_dir) for module in where), where  # both installed copies

    listed = run_ok(agentgym, "envs", cwd=empty)
    assert "acme/coin-v0" in listed and "A third-party env" in listed

    checked = " ".join(run_ok(agentgym, "check", "acme/coin-v0", "--episodes", "2", cwd=empty).split())
    assert "acme/coin-v0 honours the env contract" in checked
    assert "gates: 3 passed, 0 failed, 2 skipped (of 5)" in checked  # the expert gates ran (and passed)

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    service = start_service([str(agentgym), "serve", "acme/coin-v0", "--port", str(port)], url, timeout_s=120,
                            cwd=empty)
    try:
        with httpx.Client(base_url=url, timeout=30) as http:
            assert [env["id"] for env in http.get("/envs").json()] == ["acme/coin-v0"]
            sid = http.post("/sessions", json={"env_id": "acme/coin-v0"}).json()["session_id"]
            assert http.post(f"/sessions/{sid}/reset", json={"seed": 0}).status_code == 200
            assert http.post(f"/sessions/{sid}/step", json={"action": "heads"}).json()["reward"] == 1.0
    finally:
        stop_service(service)

    # One short iteration of the embedded quickstart's tiny model on the plugin's env, after SFT on its expert
    run_ok(agentgym, "train", "--set", "env.id=acme/coin-v0", "--set", "env.kwargs={}",
         "--set", "env.max_turns=1", "--set", "iterations=1", "--set", "rollout.num_tasks=2",
         "--set", "rollout.group_size=2", "--set", "sft.num_episodes=2", "--set", "sft.num_epochs=1",
         "--set", "eval.num_episodes=2", "--out", "run", cwd=empty)
    assert (empty / "run" / "report.json").is_file()

    run_ok(agentgym, "eval", "--policy", "random", "--policy", "expert", "--policy", "run", "--envs",
         "acme/coin-v0", "--episodes", "4", "--out", "eval", cwd=empty)
    rows = json.loads((empty / "eval" / "results.json").read_text())["results"]
    success = {row["policy"]: row["success_rate"] for row in rows}
    assert success["expert"] == 1.0 and set(success) == {"random", "expert", "run"}, success
    assert sorted(path.name for path in empty.iterdir()) == ["eval", "run"]
