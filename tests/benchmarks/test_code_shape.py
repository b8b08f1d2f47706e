"""benchmarks/code_shape.py counts what its docstring says on a small tree written here, and measures this
checkout and a commit of it."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

LOOP = '''
class Trainer:
    def __init__(self, cfg):
        self.cfg = cfg
        self.setup(cfg, cfg.rollout)
        self.weights = Weights(cfg.rollout.max_staleness) if cfg.rollout.max_staleness else None

    def run(self, resume):
        if resume:
            self.restore()
        while self.dist.world_size > 1 and self.weights:
            self.sync()
        return [x for x in range(3) if x]

    def plain(self):
        if self.cfg.iterations:
            return 1
'''


def write(root: Path, path: str, text: str) -> None:
    (root / path).parent.mkdir(parents=True, exist_ok=True)
    (root / path).write_text(text)


@pytest.fixture(scope="module")
def shape():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        yield importlib.import_module("code_shape")
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    subpackages = [f"agentgym/training/{sub}" for sub in ("config", "api", "engine", "run")]
    for package in ["agentgym", "agentgym/rollout", "agentgym/eval", "agentgym/training", *subpackages,
                    "envs", "trainers"]:
        write(tmp_path, f"{package}/__init__.py", "")
    write(tmp_path, "agentgym/training/run/loop.py", LOOP)
    # where Turn is defined, building one does not count
    write(tmp_path, "agentgym/rollout/records.py",
          "class Turn:\n    pass\n\n\ndef make():\n    return Turn()")
    # a lazy import back up counts: config <-> run is a two-way pair; api -> config alone is not
    write(tmp_path, "agentgym/training/config/schema.py",
          "def load():\n    from agentgym.training.run import loop\n    return loop\n")
    write(tmp_path, "agentgym/training/run/setup.py", "from ..config import schema\n")
    write(tmp_path, "agentgym/training/api/plan.py", "from agentgym.training import config\n")
    write(tmp_path, "agentgym/eval/episodes.py", '''import json
from agentgym.rollout.records import Turn


class EpisodeLog:
    def append(self, fh, lines):
        fh.write("".join(json.dumps(r) + "\\n" for r in lines))

    def read(self, text):
        return [Turn(**json.loads(line)) for line in text.splitlines()]
''')
    write(tmp_path, "tests/test_a.py", "")
    write(tmp_path, "tests/eval/test_b.py", "")
    write(tmp_path, "README.md", "Steps at 1.74× the rate; 27% after SFT to 58% after RL.\n")
    write(tmp_path, "docs/training.md", "1.74× as fast ([numbers](../benchmarks/README.md)).\n")
    write(tmp_path, "benchmarks/README.md", "| a | 27% | 58% |\n")
    return tmp_path


def test_it_counts_what_its_docstring_says(shape, tree: Path) -> None:
    measured = shape.measure(tree)
    loop = measured["loop"]
    assert (loop["lines"], loop["methods"]) == (len(LOOP.splitlines()), 3)
    # the conditional expression (max_staleness), `if resume` and the while (processes and async); not
    # `if self.cfg.iterations` nor the comprehension's `if x`
    assert loop["mode_branches"] == 3 and loop["mode_branches_by_kind"] == {"async": 2, "processes": 1,
                                                                          "resume": 1}
    assert loop["mode_branches_by_method"] == {"Trainer.__init__": 1, "Trainer.run": 2}
    # setup(cfg, cfg.rollout) and Weights(cfg.rollout.max_staleness); a test is not an argument
    assert (loop["cfg_passed_whole"], loop["cfg_passed_parts"]) == (1, 2)
    assert measured["packages"]["pairs"] == ["training.config <-> training.run"]
    assert measured["turn"]["places"] == ["agentgym/eval/episodes.py:10 EpisodeLog.read"]
    assert measured["episode_io"]["episode_writers"] == ["agentgym/eval/episodes.py EpisodeLog.append"]
    assert measured["episode_io"]["episode_readers"] == ["agentgym/eval/episodes.py EpisodeLog.read"]
    assert measured["test_files"] == {"root": 1, "in_folders": 1}
    assert measured["doc_numbers"]["duplicates"] == {
        "1.74×": {"README.md": [1], "docs/training.md": [1]},
        "27% -> 58%": {"README.md": [1], "benchmarks/README.md": [1]}}
    longest = measured["longest_functions"][0]
    # 1 + the `if`, the `while`, its `and` and the comprehension (its `if` clause is part of it)
    assert longest == {"function": "agentgym/training/run/loop.py:Trainer.run", "lines": 6, "complexity": 5}


def test_it_measures_a_commit_and_compares_it(shape, tmp_path: Path) -> None:
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                          check=True).stdout.strip()
    out = tmp_path / "shape.json"
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "code_shape.py"), "--commit", head,
                           "--json", str(out)], cwd=ROOT, capture_output=True, text=True, check=True)
    assert "loop.py lines" in done.stdout
    saved = json.loads(out.read_text())
    assert saved["provenance"]["measured_commit"] == head and saved["loop"]["lines"] > 0
    table = shape.compared(saved, saved).splitlines()
    assert table[0] == f"| measure | before ({head[:7]}) | after ({head[:7]}) |"
    assert all(row.count("|") == 4 for row in table)


def test_a_commit_that_does_not_exist_is_named(shape) -> None:
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "code_shape.py"), "--commit",
                           "no-such-rev"], cwd=ROOT, capture_output=True, text=True, check=False)
    assert done.returncode != 0 and "--commit 'no-such-rev' is not a commit" in done.stderr
