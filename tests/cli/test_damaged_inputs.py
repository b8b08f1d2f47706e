"""Damaged inputs of `agentgym train` get one line naming the file and what to do, never a traceback: a
binary or non-UTF-8 config, a run folder whose config.json or checkpoint.pt is damaged (--resume), a failed
write (a full disk) during a run."""

from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from agentgym.cli import app
from agentgym.training import load_config
from agentgym.training.run.loop import train

pytestmark = pytest.mark.timeout(600)

#: A small run (seconds per iteration on CPU).
TINY = ["checkpoint_every=0", "rollout.num_tasks=2", "rollout.group_size=2", "eval.num_episodes=2",
        "sft.num_episodes=2", "sft.num_epochs=1", "env.max_turns=3", "iterations=3"]


def error_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith("error:")]


def invoke(*args: str):
    result = CliRunner().invoke(app, list(args), env={"COLUMNS": "80"})
    assert isinstance(result.exception, SystemExit), result.exception  # an exit, not an exception
    assert "Traceback" not in result.output
    return result


@pytest.mark.parametrize("content, said", [
    (bytes(range(256)) * 4, "is not a text config (byte 128 is not UTF-8"),
    ("rollout:\n  system_prompt: café\n".encode("latin-1"), "is not a text config (byte 29 is not UTF-8"),
    (b"rollout:\n  group_size: [4,\n", "is not valid YAML (line 3, column 1:"),
    (b"seed: 1\x00\n", "is not valid YAML (unacceptable character #x0000"),
], ids=["binary", "latin-1", "broken-yaml", "nul-byte"])
def test_a_damaged_config_file_gets_one_line(tmp_path: Path, content: bytes, said: str) -> None:
    config = tmp_path / "config.yaml"
    config.write_bytes(content)
    result = invoke("train", str(config), "--out", str(tmp_path / "run"))
    assert result.exit_code == 2
    [line] = error_lines(result.output)
    assert f"{config} {said}" in line, line
    assert not (tmp_path / "run").exists()


@pytest.fixture(scope="module")
def stopped_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run folder holding the checkpoint of iteration 1 of 3."""
    out = tmp_path_factory.mktemp("stopped") / "run"
    assert train(load_config(None, TINY), out, stop_after=1)["stopped_after"] == 1
    return out


def copy_of(run: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    return copy


def test_the_untouched_run_resumes(stopped_run: Path, tmp_path: Path) -> None:
    # What the damaged copies below are compared with: the same folder, intact, resumes to the end.
    run = copy_of(stopped_run, tmp_path)
    result = CliRunner().invoke(app, ["train", "--resume", str(run)], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert (run / "report.json").is_file()


def test_a_run_saved_before_a_config_field_existed_resumes(stopped_run: Path, tmp_path: Path) -> None:
    # A field added since the run was written (here the task sampler) is absent from its config.json; left
    # at its default it is no change. Set to something else, it is one, and resuming is refused.
    run = copy_of(stopped_run, tmp_path)
    config = json.loads((run / "config.json").read_text())
    del config["rollout"]["task_sampler"]
    (run / "config.json").write_text(json.dumps(config))
    changed = ["train", "--resume", str(run), "--set", "rollout.task_sampler=curriculum"]
    refused = CliRunner().invoke(app, changed, env={"COLUMNS": "400"})
    assert refused.exit_code != 0 and "rollout.task_sampler (None → 'curriculum')" in refused.output
    result = CliRunner().invoke(app, ["train", "--resume", str(run)], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert (run / "report.json").is_file()


@pytest.mark.parametrize("damage, said", [
    (lambda data: b"", "is damaged: the file is empty"),
    (lambda data: b"iteration 3, loss 0.25\n", "is damaged: it is not a PyTorch checkpoint"),
    (lambda data: data[: len(data) // 2], "is damaged: the file is cut short"),
], ids=["empty", "text", "truncated"])
def test_resume_from_a_damaged_checkpoint_gets_one_line(stopped_run: Path, tmp_path: Path, damage,
                                                        said: str) -> None:
    run = copy_of(stopped_run, tmp_path)
    checkpoint = run / "checkpoint.pt"
    checkpoint.write_bytes(damage(checkpoint.read_bytes()))
    result = invoke("train", "--resume", str(run))
    assert result.exit_code == 2
    [line] = error_lines(result.output)
    assert f"{checkpoint} {said}" in line, line
    assert f"agentgym train {run / 'config.json'} --out {run} --overwrite" in line  # what to do


@pytest.mark.parametrize("damage, said", [
    (lambda path: path.write_bytes(b""), "is damaged: the file is empty"),
    (lambda path: path.write_bytes(path.read_bytes()[:100]), "is damaged: the file is cut short"),
    (lambda path: path.unlink(), "cannot read"),
], ids=["empty", "truncated", "deleted"])
def test_resume_with_a_damaged_reference_gets_one_line(stopped_run: Path, tmp_path: Path, damage,
                                                       said: str) -> None:
    """reference.pt holds the post-SFT weights the KL term compares with (the run has a KL term)."""
    run = copy_of(stopped_run, tmp_path)
    reference = run / "reference.pt"
    assert reference.is_file()
    damage(reference)
    result = invoke("train", "--resume", str(run))
    assert result.exit_code == 2
    [line] = error_lines(result.output)
    assert str(reference) in line and said in line, line
    assert f"agentgym train {run / 'config.json'} --out {run} --overwrite" in line  # what to do


@pytest.mark.parametrize("content, said", [
    (b'{"iterations": 3,', "is damaged (not JSON: Expecting property name enclosed in double quotes"),
    (b"\xff\xfe binary", "is damaged (byte 0 is not UTF-8)"),
    (b"[1, 2]", "is damaged (a JSON list, not an object)"),
], ids=["cut-json", "binary", "not-an-object"])
def test_resume_with_a_damaged_config_json_gets_one_line(stopped_run: Path, tmp_path: Path, content: bytes,
                                                         said: str) -> None:
    run = copy_of(stopped_run, tmp_path)
    (run / "config.json").write_bytes(content)
    result = invoke("train", "--resume", str(run))
    assert result.exit_code == 2
    [line] = error_lines(result.output)
    assert f"{run / 'config.json'} {said}" in line, line
    assert "put back" in line


def _file_size_limit(limit: int) -> None:
    """In the child: writes past ``limit`` bytes fail (EFBIG), as they would on a full disk."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the failed write is reported, not a signal
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))


def test_a_failed_write_during_train_gets_one_line(tmp_path: Path) -> None:
    out = tmp_path / "run"
    # config.json fits; the weights saved after the warm start (reference.pt, ~0.5 MB) do not.
    result = subprocess.run([sys.executable, "-m", "agentgym", "train",
                             *[a for s in TINY for a in ("--set", s)], "--out", str(out)],
                            check=False, capture_output=True, text=True, timeout=500,
                            preexec_fn=lambda: _file_size_limit(200_000), env={**os.environ, "COLUMNS": "80"})
    assert result.returncode == 1, result.stdout + result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    [line] = error_lines(result.stderr)
    assert f"writing {out / 'reference.pt'} failed" in line, line
    assert f"start the run again with: agentgym train {out / 'config.json'} --out {out} --overwrite" in line
    assert not (out / "reference.pt.tmp").exists()
