"""benchmarks/algorithms.py's paired table: each variant against the first, per seed, task by task."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def algorithms(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    return importlib.import_module("algorithms")


def row(variant: str, seed: int, outcomes: list[int] | None, eval_seeds: list[int] | None = None) -> dict:
    base = {"task": "webshop", "variant": variant, "seed": seed}
    if outcomes is None:  # a row saved before per-task outcomes were recorded
        return base
    return {**base, "after_by_task": [float(o) for o in outcomes],
            "eval_seeds": eval_seeds if eval_seeds is not None else list(range(1000, 1000 + len(outcomes)))}


def test_paired_rows_by_hand(algorithms) -> None:
    # Ten tasks: GraphGPO alone solves six, GiGPO alone one, both one, neither two.
    graphgpo = [1, 1, 1, 1, 1, 1, 1, 0, 0, 0]
    gigpo = [0, 0, 0, 0, 0, 0, 1, 0, 0, 1]
    runs = [row("graphgpo", 0, graphgpo), row("gigpo", 0, gigpo), row("hgpo", 0, graphgpo),
            row("graphgpo", 1, graphgpo), row("gigpo", 1, None),  # seed 1's GiGPO row has no outcomes
            row("hgpo", 1, gigpo, eval_seeds=list(range(2000, 2010))),  # other tasks: not comparable
            {**row("gigpo", 2, gigpo), "task": "maze"}]  # another task
    lines = algorithms.paired_table(runs, "webshop", ["graphgpo", "gigpo", "hgpo"]).splitlines()
    assert len(lines) == 4  # header, rule, seed 0's two rows
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in lines[2:]]
    # McNemar's exact p with 6 discordant tasks one way and 1 the other: 2 * (1 + 7) / 2**7 = 0.125.
    assert cells[0][:4] == ["0", "gigpo", "graphgpo", "70% → 20%"]
    assert cells[0][4].startswith("-50 points (") and cells[0][5] == "0.12" and cells[0][6] == "1 / 6"
    assert cells[1][:4] == ["0", "hgpo", "graphgpo", "70% → 70%"]
    assert cells[1][4].startswith("+0 points (+0 to +0)") and cells[1][5] == "1" and cells[1][6] == "0 / 0"


def test_no_comparable_rows_give_no_table(algorithms) -> None:
    assert algorithms.paired_table([row("graphgpo", 0, None), row("gigpo", 0, None)], "webshop",
                                   ["graphgpo", "gigpo"]) == ""


def test_seeds_that_reset_to_the_same_task_pair_as_one_task(algorithms) -> None:
    # Four seeds, three tasks: seeds 1000 and 1002 reset to task "x". Per task, GraphGPO 1/2, 0, 1 and
    # GiGPO 1/2, 1, 0: three pairs, one tied, not four.
    ids = ["x", "y", "x", "z"]
    runs = [{**row("graphgpo", 0, [1, 0, 0, 1]), "eval_task_ids": ids},
            {**row("gigpo", 0, [0, 1, 1, 0]), "eval_task_ids": ids},
            row("hgpo", 0, [0, 1, 1, 0])]  # a row saved before task ids were kept: pairs by seed
    lines = algorithms.paired_table(runs, "webshop", ["graphgpo", "gigpo", "hgpo"]).splitlines()
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in lines[2:]]
    assert cells[0][:4] == ["0", "gigpo", "graphgpo", "50% → 50%"] and cells[0][6] == "1 / 1"
    assert cells[1][:4] == ["0", "hgpo", "graphgpo", "50% → 50%"] and cells[1][6] == "2 / 2"
