"""What a user installs: the wheel built from this checkout, and a fresh venv that holds it.

Every test of the shipped product (the doc blocks, the presets, the deploy files, a third-party env package,
each extra alone) runs against these, not against the editable checkout. The wheel is built once per test
process, from a copy of the source: a build writes ``build/`` and ``*.egg-info`` into the tree it builds,
which would race with other builds and leave stale files in the wheel.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: What the checkout holds that a wheel is not built from: local state (venvs, git, build and run output).
NOT_SOURCE = shutil.ignore_patterns(".git", ".venv", "build", "dist", "runs", "artifacts", "*.egg-info",
                                    "__pycache__", ".pytest_cache", ".ruff_cache")

_built: dict[str, Path] = {}


def run_ok(*cmd: str | Path, cwd: Path | None = None, timeout: float = 600) -> str:
    """Run ``cmd``; its stdout, or a failed assertion with the end of both streams."""
    done = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, cwd=cwd, timeout=timeout)
    assert done.returncode == 0, f"{cmd} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The ``agentgym_rl`` wheel of this checkout, built on the first call of the test process."""
    if "wheel" not in _built:
        scratch = tmp_path_factory.mktemp("wheel")
        shutil.copytree(ROOT, scratch / "source", ignore=NOT_SOURCE, symlinks=True)
        run_ok(sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
               "-w", scratch / "dist", scratch / "source")
        [_built["wheel"]] = (scratch / "dist").glob("agentgym_rl-*.whl")
    return _built["wheel"]


def overlay_venv(tmp_path_factory: pytest.TempPathFactory, folder: Path) -> Path:
    """A fresh venv at ``folder`` holding the wheel alone (``--no-deps``); returns ``folder``.

    Its dependencies come from this interpreter's site-packages through a path line in a ``.pth`` file: a
    path line adds that folder to ``sys.path`` without running the ``.pth`` files inside it, so the editable
    install's import hook there stays inert and ``agentgym``, ``agentgym.envs`` and ``agentgym.trainers``
    come from the wheel (asserted). For each extra alone, with its real requirements,
    tests/product/test_extras.py installs the wheel into venvs of their own.
    """
    venv.EnvBuilder(symlinks=True).create(folder)  # no pip of its own: this interpreter's pip installs
    python = folder / "bin" / "python"
    run_ok(sys.executable, "-m", "pip", "--python", python, "install", "--quiet", "--no-deps", "--no-index",
           wheel(tmp_path_factory))
    site = Path(run_ok(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])").strip())
    ours = dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]])
    (site / "agentgym_test_dependencies.pth").write_text("".join(f"{path}\n" for path in ours))
    where = run_ok(python, "-c", "import agentgym, agentgym.envs, agentgym.trainers as t; "
                                 "print(agentgym.__file__, agentgym.envs.__file__, t.__file__)", cwd=folder)
    for module in where.split():
        assert Path(module).is_relative_to(site), f"{module} is not the wheel's (in {site})"
    assert (folder / "bin" / "agentgym").is_file()
    return folder
