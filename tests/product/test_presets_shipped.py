"""The presets ship with the package: each loads by name from any folder, and the wheel holds every preset and
every file one names, so an installed user (no checkout) lists them and runs them by name."""

from __future__ import annotations

import json
import os
import subprocess
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import installed
import pytest
import yaml

from agentgym.training import load_config
from agentgym.training.config.loading import list_presets, presets_dir, resolve_paths

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "configs"
# Run by the wheel's venv from an empty folder: where agentgym comes from, and the preset by name.
LOAD_BY_NAME = """
import json, sys
import agentgym
from agentgym.training import load_config
cfg = load_config("harness_calculator_grpo_smollm2")
print(json.dumps({"agentgym": agentgym.__file__, "tasks": cfg.env.tasks, "algorithm": cfg.algorithm.name}))
"""


def named_files(preset: Path) -> list[Path]:
    """The files and folders a preset names by a relative path, read from its folder (what ``resolve_paths``
    changes)."""
    written = yaml.safe_load(preset.read_text()) or {}
    return [Path(value) for value in _changed(written, resolve_paths(written, preset.parent))]


def _changed(before: dict[str, Any], after: dict[str, Any]) -> Iterator[Any]:
    """The values of ``after`` that differ from ``before``'s, nested mappings walked."""
    for key, value in after.items():
        old = before.get(key)
        if isinstance(value, dict) and isinstance(old, dict):
            yield from _changed(old, value)
        elif value != old:
            yield value


def _words(text: str) -> str:
    """``text`` with rich's line wrapping undone (one space between words)."""
    return " ".join(text.split())


def test_the_presets_are_the_packages_configs_folder() -> None:
    assert presets_dir().resolve() == CONFIGS.resolve()
    assert list_presets() == sorted(p.stem for p in CONFIGS.glob("*.yaml"))


def test_every_preset_loads_by_name_from_a_folder_outside_the_checkout(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    presets = list_presets()
    assert "harness_calculator_grpo_smollm2" in presets
    for name in presets:
        cfg = load_config(name)
        for path in named_files(CONFIGS / f"{name}.yaml"):
            assert path.exists() and CONFIGS in path.parents, f"{name} names {path}, which is not beside it"
        assert cfg.env.tasks is None or Path(cfg.env.tasks).is_file(), (name, cfg.env.tasks)
    # by path from another folder too: the tasks file is read from the preset's folder, not this one
    cfg = load_config(CONFIGS / "harness_calculator_grpo_smollm2.yaml")
    assert cfg.env.tasks == str(CONFIGS / "harness_calculator_tasks.jsonl")


def test_a_missing_config_lists_the_presets_from_any_folder(tmp_path: Path, monkeypatch) -> None:
    from agentgym.errors import ConfigError

    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as caught:
        load_config("quickstart_maze_grp")
    message = str(caught.value)
    assert "(did you mean 'quickstart_maze_grpo'?)" in message
    assert all(name in message for name in list_presets())


def _run(*cmd: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, cwd=cwd, timeout=300,
                          check=False, env={**os.environ, "COLUMNS": "200"})


def _ok(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 0, f"{done.args} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


@pytest.mark.timeout(600)
def test_the_wheel_ships_the_presets_and_runs_them_by_name_from_an_empty_folder(
        tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    wheel = installed.wheel(tmp_path_factory)
    names = set(zipfile.ZipFile(wheel).namelist())
    presets = sorted(CONFIGS.glob("*.yaml"))
    assert presets
    named = {path for preset in presets for path in named_files(preset)}
    assert CONFIGS / "harness_calculator_tasks.jsonl" in named
    shipped = [f"agentgym/configs/{path.relative_to(CONFIGS).as_posix()}" for path in [*presets, *named]]
    assert [name for name in shipped if name not in names] == []

    env = installed.overlay_venv(tmp_path_factory, tmp_path / "venv")
    python = env / "bin" / "python"
    empty = tmp_path / "empty"
    empty.mkdir()
    helped = _ok(_run(env / "bin" / "agentgym", "train", "--help", cwd=empty))
    assert "Shipped presets" in helped
    assert [preset.stem for preset in presets if preset.stem not in _words(helped)] == []
    loaded = json.loads(_ok(_run(python, "-c", LOAD_BY_NAME, cwd=empty)).strip().splitlines()[-1])
    venv_dir = env.resolve()
    assert venv_dir in Path(loaded["agentgym"]).resolve().parents, loaded["agentgym"]
    tasks = Path(loaded["tasks"]).resolve()
    assert venv_dir in tasks.parents and tasks.is_file() and loaded["algorithm"] == "grpo"
    missing = _run(env / "bin" / "agentgym", "train", "quickstart_maze_grp", cwd=empty)
    assert missing.returncode != 0
    assert "did you mean 'quickstart_maze_grpo'?" in _words(missing.stderr)
    assert list(empty.iterdir()) == []  # nothing was written where the user stood
