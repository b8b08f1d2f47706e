"""agentgym's disk cache: atomic, checked entries built once under concurrency; listing and pruning them."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from agentgym.cache import build_entry, entries, entry_complete, prune, remove_entry
from agentgym.cli import app


def test_concurrent_builders_build_an_entry_once_and_keep_it(tmp_path: Path) -> None:
    entry = tmp_path / "game-1"
    calls = []

    def build(tmp: Path) -> tuple[list[str], dict]:
        calls.append(1)
        time.sleep(0.2)  # long enough for every other thread to arrive while this one builds
        (tmp / "game.bin").write_bytes(b"compiled")
        return ["game.bin"], {"seed": 1}

    threads = [threading.Thread(target=build_entry, args=(entry, build)) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(calls) == 1 and entry_complete(entry)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["game-1"]  # no temp folders or lock files left
    (entry / "game.bin").write_bytes(b"corrupt")  # a checksum mismatch makes the entry count as missing
    build_entry(entry, build)
    assert len(calls) == 2 and (entry / "game.bin").read_bytes() == b"compiled"


def converted_from(source: Path) -> tuple[list[str], dict]:
    """What a conversion records: the file it read, and that file's size and modification time."""
    def build(tmp: Path) -> tuple[list[str], dict]:
        (tmp / "weights.bin").write_bytes(b"w" * 100)
        stat = source.stat()
        return ["weights.bin"], {"source": str(source), "source_stat": [stat.st_size, stat.st_mtime_ns]}
    return build


def plain(tmp: Path) -> tuple[list[str], dict]:
    (tmp / "game.bin").write_bytes(b"g" * 10)
    return ["game.bin"], {}


def test_prune_takes_what_no_run_can_use_and_keeps_the_rest(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    kept_source, gone_source, changed_source = (tmp_path / f"{n}.gguf" for n in ("kept", "gone", "changed"))
    for source in (kept_source, gone_source, changed_source):
        source.write_bytes(b"gguf")
        build_entry(root / "models" / source.stem, converted_from(source))
    build_entry(root / "textworld" / "tw-simple" / "seed0", plain)
    inner = root / "textworld" / "tw-simple" / "seed0" / "a-folder"  # a file named meta.json inside an entry
    inner.mkdir()
    (inner / "meta.json").write_text("{}")
    dead_build = root / "models" / ".tmp-other-abcd1234"  # what a killed conversion leaves
    (dead_build / "sub").mkdir(parents=True)
    (dead_build / "sub" / "part.bin").write_bytes(b"x" * 7)
    gone_source.unlink()
    changed_source.write_bytes(b"a newer gguf")

    listed = {e.path.relative_to(root).as_posix(): e for e in entries(root)}
    assert sorted(listed) == ["models/changed", "models/gone", "models/kept", "textworld/tw-simple/seed0"]
    assert listed["textworld/tw-simple/seed0"].kind == "textworld"
    assert listed["models/kept"].size == 100 + (root / "models/kept/meta.json").stat().st_size
    assert listed["textworld/tw-simple/seed0"].size == 10 + 2 + (
        root / "textworld/tw-simple/seed0/meta.json").stat().st_size
    assert listed["models/kept"].unusable is None and listed["textworld/tw-simple/seed0"].unusable is None
    assert "is gone" in listed["models/gone"].unusable and "has changed" in listed["models/changed"].unusable

    planned = prune(root, dry_run=True)
    assert sorted(r.path.name for r in planned) == [".tmp-other-abcd1234", "changed", "gone"]
    assert dead_build.exists() and (root / "models/gone").exists()  # a dry run removes nothing
    assert {r.path.name: r.size for r in planned}[".tmp-other-abcd1234"] == 7
    assert sorted(r.path.name for r in prune(root)) == [".tmp-other-abcd1234", "changed", "gone"]
    assert sorted(p.name for p in (root / "models").iterdir()) == ["kept"]
    assert (root / "textworld/tw-simple/seed0/game.bin").exists()
    assert build_entry(root / "models" / "kept", converted_from(kept_source)) is None  # still found as it was
    assert prune(root) == []


def test_unused_entries_go_only_when_asked_and_a_use_keeps_one(tmp_path: Path) -> None:
    old, used = tmp_path / "textworld" / "old", tmp_path / "textworld" / "used"
    for entry in (old, used):
        build_entry(entry, plain)
        ten_days_ago = time.time() - 10 * 86400
        os.utime(entry, (ten_days_ago, ten_days_ago))
    build_entry(used, lambda tmp: pytest.fail("a complete entry is not built again"))  # a run uses it
    assert prune(tmp_path) == []  # nothing unusable, and no age limit asked for
    removed = prune(tmp_path, unused_days=5)  # the age counts from the last use, not the build
    assert [r.path for r in removed] == [old] and "unused for 10.0 days" in removed[0].reason
    assert [e.path for e in entries(tmp_path)] == [used]
    assert [r.path for r in prune(tmp_path, kind="models", everything=True)] == []
    assert [r.path for r in prune(tmp_path, kind="textworld", everything=True)] == [used]


def test_a_build_under_way_is_never_touched(tmp_path: Path) -> None:
    entry = tmp_path / "models" / "big"
    started, finish = threading.Event(), threading.Event()

    def slow(tmp: Path) -> tuple[list[str], dict]:
        (tmp / "half.bin").write_bytes(b"h")
        started.set()
        finish.wait(30)
        return ["half.bin"], {}

    builder = threading.Thread(target=build_entry, args=(entry, slow))
    builder.start()
    assert started.wait(30)
    assert prune(tmp_path, everything=True) == []  # its temporary folder is a build, not garbage
    assert len(list((tmp_path / "models").glob(".tmp-big-*"))) == 1
    assert remove_entry(entry) is False
    finish.set()
    builder.join()
    assert entry_complete(entry)
    # Another process building it holds the same lock.
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\nfrom agentgym.cache import build_entry\n"
         "def build(tmp):\n    (tmp / 'x').write_bytes(b'x'); print('building', flush=True); time.sleep(60)\n"
         "build_entry(__import__('pathlib').Path(sys.argv[1]), build)", str(tmp_path / "models" / "other")],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "building"
        assert [r.path for r in prune(tmp_path, everything=True)] == [entry]
        assert len(list((tmp_path / "models").glob(".tmp-other-*"))) == 1
    finally:
        holder.kill()
        holder.wait()
    assert [r.reason for r in prune(tmp_path)] == ["an unfinished build"]  # its process is dead now
    assert list((tmp_path / "models").iterdir()) == []


def test_the_cache_commands_list_and_prune(tmp_path: Path) -> None:
    source = tmp_path / "model.gguf"
    source.write_bytes(b"gguf")
    root = tmp_path / "cache"
    build_entry(root / "models" / "model-1", converted_from(source))
    build_entry(root / "textworld" / "tw-simple" / "seed0", plain)
    source.unlink()
    runner = CliRunner()
    summary = runner.invoke(app, ["cache", "list", "--root", str(root)], env={"COLUMNS": "300"})
    assert summary.exit_code == 0, summary.output
    rows = {line.split("│")[1].strip(): [c.strip() for c in line.split("│")[2:-1]]
            for line in summary.output.splitlines() if line.startswith("│")}
    assert rows["models"][0] == "1" and rows["models"][3].startswith("1 (")  # one entry, no run can use it
    assert rows["textworld"][0] == "1" and rows["textworld"][3] == "0"
    assert "2 entries" in summary.output and "1 no run can use" in summary.output
    listed = runner.invoke(app, ["cache", "list", "--root", str(root), "--entries"], env={"COLUMNS": "300"})
    assert "models/model-1" in listed.output and "textworld/tw-simple/seed0" in listed.output
    assert f"no: its source {source} is gone" in listed.output
    models = runner.invoke(app, ["cache", "list", "--root", str(root), "--kind", "models"],
                           env={"COLUMNS": "300"})
    assert "models/model-1" in models.output and "textworld" not in models.output
    dry = runner.invoke(app, ["cache", "prune", "--root", str(root), "--dry-run"])
    assert dry.exit_code == 0 and "would remove models/model-1" in dry.output
    assert (root / "models" / "model-1").exists()
    done = runner.invoke(app, ["cache", "prune", "--root", str(root)])
    assert done.exit_code == 0 and "removed 1 folders" in done.output
    assert not (root / "models" / "model-1").exists() and (root / "textworld/tw-simple/seed0").exists()
    wrong = runner.invoke(app, ["cache", "prune", "--root", str(root), "--kind", "model"])
    assert wrong.exit_code == 2
    assert wrong.output.strip().splitlines() == [
        "error: ConfigError: --kind 'model' is not a kind of cache entry; did you mean 'models'? kinds: "
        "models, textworld, alfworld, warm_starts"]
