"""Python children the project starts import the installed package, whatever their working directory holds:
the env-worker processes of ``serve --workers``, TextWorld's game generator, the serve demo's commands;
and the env image's layout (sources in the working directory, a non-editable install) serves
``--workers 2`` and TextWorld on a cold game cache."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import httpx
import pytest
from test_services import dockerfile_stages

from agentgym.http import demo
from agentgym.service_kit.launcher import free_port, python_command, start_service, stop_service

pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
#: What an ``agentgym/`` folder in the working directory does when a child imports it instead.
SHADOW = ('raise ImportError("imported the agentgym/ folder of the working directory, '
          'not the installed package")\n')
#: Small TextWorld games: generated in a few seconds.
TREASURE = {"challenge": "tw-treasure_hunter", "settings": {"level": 1}, "num_games": 1}


@pytest.fixture
def shadowed(tmp_path: Path) -> Path:
    """A working directory holding an ``agentgym/`` package that breaks any import of it."""
    (tmp_path / "agentgym").mkdir()
    (tmp_path / "agentgym" / "__init__.py").write_text(SHADOW)
    return tmp_path


@pytest.mark.parametrize("safe_path_flag", [True, False], ids=["-P", "bootstrap"])
def test_python_children_ignore_a_source_tree_in_their_working_directory(shadowed: Path,
                                                                         safe_path_flag: bool) -> None:
    def run(*argv: str) -> str:
        done = subprocess.run(python_command(*argv, safe_path_flag=safe_path_flag), cwd=shadowed, check=False,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr[-2000:]
        return done.stdout

    import agentgym

    assert run("-m", "agentgym", "version").strip() == agentgym.__version__
    code = "import sys, agentgym.envs; print(sys.argv[1:], agentgym.envs.__name__, __name__)"
    assert run("-c", code, "a", "--b").split() == ["['a',", "'--b']", "agentgym.envs", "__main__"]


def test_serve_with_workers_starts_from_a_folder_holding_a_source_tree(shadowed: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    service = start_service([str(BIN / "agentgym"), "serve", "maze-v0", "--port", str(port), "--workers", "2",
                             "--log-level", "error"], url, timeout_s=120, cwd=shadowed)
    try:
        with httpx.Client(base_url=url, timeout=30) as http:
            assert [w["ready"] for w in http.get("/health").json()["workers"]] == [True, True]
            sid = http.post("/sessions", json={"env_id": "maze-v0"}).json()["session_id"]
            assert http.post(f"/sessions/{sid}/reset", json={"seed": 0}).status_code == 200
    finally:
        stop_service(service)


def test_textworld_generates_a_game_from_a_folder_holding_a_source_tree(
    shadowed: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    pytest.importorskip("textworld", reason="needs the textworld extra")
    from agentgym.envs.textworld import games as tw

    monkeypatch.chdir(shadowed)  # the generator child starts here; this process imported agentgym already
    game = tw.ensure_game(TREASURE["challenge"], TREASURE["settings"], 7, tmp_path / "cold-cache")
    assert game.is_file() and game.suffix == ".z8"


def test_the_serve_demo_runs_from_a_folder_holding_a_source_tree(shadowed: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(shadowed)
    assert demo.main(("maze-v0",)) == 0


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_env_image_layout_serves_workers_and_textworld_on_a_cold_cache(tmp_path: Path) -> None:
    """The env image without Docker: its base stage's WORKDIR filled by its COPY lines, ``pip install .``
    (non-editable) into a fresh venv, and the stage's ENTRYPOINT run from the WORKDIR."""
    stages = dockerfile_stages()
    workdir = tmp_path / "src"
    workdir.mkdir()
    for line in stages["base"]["lines"]:  # type: ignore[union-attr]
        word, *args = line.split()
        if word != "COPY":
            continue
        *sources, destination = args
        for source in sources:
            target = workdir / (source if destination in ("./", ".") else destination)
            if (ROOT / source).is_dir():
                shutil.copytree(ROOT / source, target, ignore=shutil.ignore_patterns("__pycache__"))
            else:
                shutil.copy2(ROOT / source, target)
    # The project's own python builds the wheel (the build backend pip install . would run), a fresh
    # venv installs it non-editable; the dependencies come from this venv's site-packages through a
    # path entry (not a site dir, so this venv's editable hook of agentgym stays inactive).
    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                    "-w", str(wheels), "."], cwd=workdir, check=True, timeout=600)
    fresh = tmp_path / "venv"
    venv.create(fresh, with_pip=True)
    python = fresh / "bin" / "python"
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--no-deps", "--no-index",
                    *map(str, wheels.glob("*.whl"))], check=True, timeout=600)
    site = Path(subprocess.run([str(python), "-c",
                                "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    (site / "project-dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    where = subprocess.run([str(python), "-c", "import agentgym.envs; print(agentgym.envs.__file__)"],
                           cwd=tmp_path, capture_output=True, text=True, check=True).stdout
    assert where.startswith(str(site)), where  # the installed copy, not this checkout

    port = free_port()
    entrypoint = list(stages["env"]["entrypoint"])  # type: ignore[arg-type]
    argv = ["127.0.0.1" if a == "0.0.0.0" else str(port) if a == "8000" else a for a in entrypoint]
    argv[0] = str(fresh / "bin" / argv[0])
    environ = {**os.environ, "AGENTGYM_CACHE": str(tmp_path / "cold-cache"), "PYTHONUNBUFFERED": "1"}
    url = f"http://127.0.0.1:{port}"
    service = start_service([*argv, "maze-v0", "textworld-v0", "--workers", "2"], url, timeout_s=180,
                            cwd=workdir, env=environ)
    try:
        with httpx.Client(base_url=url, timeout=300) as http:
            assert len(http.get("/health").json()["workers"]) == 2
            created = http.post("/sessions", json={"env_id": "textworld-v0", "kwargs": TREASURE})
            sid = created.json()["session_id"]
            reset = http.post(f"/sessions/{sid}/reset", json={"seed": 0})
            assert reset.status_code == 200, reset.text
            action = reset.json()["info"]["admissible_actions"][0]
            step = http.post(f"/sessions/{sid}/step", json={"action": action})
            assert step.status_code == 200, step.text
    finally:
        stop_service(service)
    assert any((tmp_path / "cold-cache" / "textworld").rglob("game.z8"))  # generated there, by the child
