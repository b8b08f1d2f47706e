"""Every file of benchmarks/results says where its numbers came from: the commit, command and machine that
produced them, or the mark of a result saved before benchmarks recorded those (``provenance.unrecorded``)."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RESULTS = sorted((ROOT / "benchmarks" / "results").glob("*.json"))


@pytest.fixture(scope="module")
def provenance():
    import sys

    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        yield importlib.import_module("provenance")
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))


def test_the_results_folder_holds_results() -> None:
    assert len(RESULTS) >= 20, [p.name for p in RESULTS]


@pytest.mark.parametrize("path", RESULTS, ids=[p.name for p in RESULTS])
def test_every_results_file_carries_its_provenance(provenance, path: Path) -> None:
    missing = provenance.unrecorded(json.loads(path.read_text(encoding="utf-8")))
    assert not missing, (f"{path.name}: no commit, command and machine at {missing[:5]}; record "
                         "provenance.provenance() with the results (see benchmarks/provenance.py)")


def test_a_marked_old_result_names_commits_that_exist(provenance) -> None:
    """The mark of a result saved before provenance names the commits git first and last saw it in."""
    import subprocess

    commits = set()
    for path in RESULTS:
        text = path.read_text(encoding="utf-8")
        if '"recorded_before_provenance"' not in text:
            continue
        for record in _records(json.loads(text)):
            if record.get("recorded_before_provenance"):
                commits |= {record["added_in_commit"], record["last_changed_in_commit"]}
    assert commits
    known = subprocess.run(["git", "cat-file", "--batch-check"], input="\n".join(sorted(commits)) + "\n",
                           cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert "missing" not in known, known


def test_a_result_without_provenance_is_found(provenance) -> None:
    record = {"commit": "abc123", "command": "python benchmarks/envs.py", "machine": {"cpu_cores": 2}}
    assert provenance.unrecorded({"rows": [{"x": 1, "provenance": record}, {"x": 2}]}) == ["rows[1]"]
    assert provenance.unrecorded([{"x": 1}]) == ["[0]"]
    assert provenance.unrecorded({"x": 1, "provenance": {"commit": "abc123"}}) == ["provenance"]
    # the mark without the commits git saw the result in says nothing about where it came from
    bare_mark = {"recorded_before_provenance": True}
    assert provenance.unrecorded({"rows": [{"provenance": bare_mark}]}) == ["rows[0]"]


def _records(data):
    """Every ``provenance`` value anywhere in ``data``, sections' records included."""
    if isinstance(data, dict):
        for key, value in data.items():
            if key == "provenance" and isinstance(value, dict):
                yield value
                yield from (v for v in value.values() if isinstance(v, dict))
            else:
                yield from _records(value)
    elif isinstance(data, list):
        for item in data:
            yield from _records(item)
