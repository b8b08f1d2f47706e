"""The evaluation folder never loses an episode: a cut last line, an empty timing.json, a line outside the
plan and a full disk (a real small tmpfs where this machine lets us mount one) all resume to the whole
plan."""

from __future__ import annotations

import errno
import json
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from agentgym.cli import app
from agentgym.cli.evaluation import say_missing
from agentgym.eval.harness import Evaluation
from agentgym.eval.plan import EnvEntry, EvalPlan
from agentgym.eval.policies import parse_policy
from agentgym.eval.report import build_results, markdown_report
from agentgym.eval.store import EvalFolderError, EvalStore
from agentgym.rollout import episode_log

ENV = "maze-v0"
TASKS = 40


def _plan() -> EvalPlan:
    return EvalPlan((parse_policy("expert"),), (EnvEntry(ENV, {"size": 2}),), tuple(range(TASKS)),
                    concurrency=4)


def _evaluate(out: Path, *, resume: bool = False, notes: list[str] | None = None) -> dict[str, Any]:
    evaluation = Evaluation(_plan(), out, resume=resume)
    if notes is not None:
        evaluation.store.on_notice = notes.append
    return evaluation.run()


def _log(out: Path) -> Path:
    return out / "trajectories" / ENV / "expert.jsonl"


def _seeds(out: Path) -> list[int]:
    """The seed of every line of the log; a line that is not JSON fails the test."""
    return sorted(json.loads(line)["seed"] for line in _log(out).read_text().splitlines())


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished evaluation of 40 tasks; tests damage copies of it."""
    out = tmp_path_factory.mktemp("finished") / "eval"
    _evaluate(out)
    return out


def _copy(finished: Path, tmp_path: Path) -> Path:
    import shutil

    out = tmp_path / "eval"
    shutil.copytree(finished, out)
    (out / "results.json").unlink()
    return out


def test_a_cut_last_line_is_set_aside_and_its_episode_played_again(finished: Path, tmp_path: Path) -> None:
    out = _copy(finished, tmp_path)
    data = _log(out).read_bytes()
    last = data.rstrip(b"\n").rfind(b"\n") + 1
    _log(out).write_bytes(data[:last + 60])  # a crash 60 bytes into the last episode's line

    notes: list[str] = []
    results = _evaluate(out, resume=True, notes=notes)
    assert _seeds(out) == list(range(TASKS))  # the replayed episode did not land on the cut line
    assert results["results"][0]["episodes"] == TASKS and results["results"][0]["complete"]
    assert _log(out).with_name("expert.jsonl.cut").read_bytes() == data[last:last + 60] + b"\n"
    assert len(notes) == 1 and "cut short" in notes[0] and "expert.jsonl.cut" in notes[0]


def test_a_last_episode_lacking_only_its_line_end_is_kept(finished: Path, tmp_path: Path) -> None:
    out = _copy(finished, tmp_path)
    lines = _log(out).read_text().splitlines()
    _log(out).write_text("\n".join(lines[1:]))  # task 0 still to play; the last line has no line end

    notes: list[str] = []
    _evaluate(out, resume=True, notes=notes)
    after = _log(out).read_text().splitlines()
    assert after[:-1] == lines[1:] and json.loads(after[-1])["seed"] == 0  # kept, not played again
    assert _seeds(out) == list(range(TASKS))
    assert len(notes) == 1 and "completed" in notes[0]


def test_an_empty_timing_file_only_resets_wall_times(finished: Path, tmp_path: Path) -> None:
    out = _copy(finished, tmp_path)
    (out / "timing.json").write_text("")
    lines = _log(out).read_text().splitlines()
    _log(out).write_text("\n".join(lines[:-1]) + "\n")

    notes: list[str] = []
    results = _evaluate(out, resume=True, notes=notes)
    assert _seeds(out) == list(range(TASKS)) and results["results"][0]["episodes"] == TASKS
    assert any("timing.json is unreadable" in n for n in notes)
    assert json.loads((out / "timing.json").read_text())[f"{ENV}\texpert"] > 0


def test_lines_outside_the_plan_never_stand_in_for_planned_episodes(finished: Path, tmp_path: Path) -> None:
    out = _copy(finished, tmp_path)
    lines = [json.loads(line) for line in _log(out).read_text().splitlines()]
    stray_index = {**lines[-1], "task_index": 99}  # a task the plan does not have
    wrong_seed = {**lines[-2], "seed": 12345}  # the plan's task 38 is seed 38
    kept = [line for line in lines if line["task_index"] < TASKS - 2]
    _log(out).write_text("".join(json.dumps(r) + "\n" for r in [*kept, stray_index, wrong_seed]))

    results = _evaluate(out, resume=True)
    assert results["results"][0]["episodes"] == TASKS and results["results"][0]["complete"]
    planned = EvalStore(out).records(ENV, "expert")
    assert [(r["task_index"], r["seed"]) for r in planned] == [(i, i) for i in range(TASKS)]


def test_results_say_exactly_which_episodes_are_missing(finished: Path, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    out = _copy(finished, tmp_path)
    lines = _log(out).read_text().splitlines()
    _log(out).write_text("".join(line + "\n" for line in lines if json.loads(line)["task_index"] != 7))

    results = build_results(_plan(), EvalStore(out), {})
    row = results["results"][0]
    assert row["episodes"] == TASKS - 1 and not row["complete"]
    assert row["missing"] == [{"task_index": 7, "seed": 7, "sample": 0}]
    assert "lacks 1 of 40 episodes (task seeds 7)" in markdown_report(results)
    assert say_missing(results, out)
    said = " ".join(capsys.readouterr().err.split())
    assert (f"incomplete: {ENV} × expert: 1 of 40 episodes missing, task seeds 7; "
            f"`agentgym eval --out {out} --resume`") in said
    assert not say_missing(build_results(_plan(), EvalStore(finished), {}), finished)


# --- a full disk ------------------------------------------------------------------------------------


@pytest.fixture
def small_disk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Path, Callable[[], None]]]:
    """A folder on a 48 KiB disk (room for about 16 of the 40 episodes) and a function that frees space.

    A real tmpfs when ``mount`` works here (as root); otherwise the episode log's one write primitive takes
    48 KiB in all, then fails with ENOSPC part-way through a write, as a full disk does.
    """
    mount_point = tmp_path / "disk"
    mount_point.mkdir()
    try:
        mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=48k", "tmpfs", str(mount_point)],
                                 capture_output=True, check=False).returncode == 0
    except OSError:  # no mount command
        mounted = False
    if mounted:
        try:
            yield mount_point, lambda: subprocess.run(["mount", "-o", "remount,size=4m", str(mount_point)],
                                                      check=True)
        finally:
            subprocess.run(["umount", str(mount_point)], check=False)
        return
    room = [48 * 1024]
    real_write_all = episode_log._write_all

    def write_all(fh: Any, data: bytes) -> None:
        taken = min(room[0], len(data))
        room[0] -= taken
        real_write_all(fh, data[:taken])
        if taken < len(data):
            raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(episode_log, "_write_all", write_all)
    yield mount_point, lambda: monkeypatch.setattr(episode_log, "_write_all", real_write_all)


def test_a_full_disk_stops_with_one_line_and_keeps_every_finished_episode(
        small_disk: tuple[Path, Callable[[], None]]) -> None:
    disk, free_space = small_disk
    out = disk / "eval"
    runner = CliRunner()
    args = ["eval", "--policy", "expert", "--envs", ENV, "--env-arg", f"{ENV}:size=2",
            "--seeds", f"0-{TASKS - 1}", "--concurrency", "4", "--out", str(out)]
    stopped = runner.invoke(app, args)
    assert stopped.exit_code == 1, stopped.output  # a runtime failure, not a usage error
    errors = [line for line in stopped.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in stopped.output, stopped.output
    assert f"no space left on the device of {out}" in errors[0] and "--resume" in errors[0]
    kept = _seeds(out)  # every line whole: a write the disk cut short was undone
    assert 0 < len(kept) < TASKS and len(set(kept)) == len(kept)
    for small in ("plan.json", "timing.json"):  # replaced atomically: absent or whole, never cut
        assert not (out / small).exists() or json.loads((out / small).read_text())

    free_space()
    resumed = runner.invoke(app, ["eval", "--out", str(out), "--resume"])
    assert resumed.exit_code == 0, resumed.output
    assert _seeds(out) == list(range(TASKS))
    assert json.loads((out / "results.json").read_text())["results"][0]["episodes"] == TASKS


def test_a_folder_file_is_replaced_whole_or_not_at_all(small_disk: tuple[Path, Callable[[], None]]) -> None:
    disk, _ = small_disk
    store = EvalStore(disk / "eval")
    store.write_file("report.md", "# first\n")
    with pytest.raises(EvalFolderError,
                       match=f"no space left on the device of {disk / 'eval'} \\(writing report.md\\)"):
        store.write_file("report.md", "x" * 100_000)  # twice the disk
    assert (disk / "eval" / "report.md").read_text() == "# first\n"
    assert sorted(p.name for p in (disk / "eval").iterdir()) == ["report.md"]  # no temporary file left behind
