"""Each documented result is stated once, on the page that measured it, and linked from the others: no
claim (a distinctive number such as ``1.74×``, or a pair of neighbouring common ones such as ``27% -> 58%``)
appears in two of README.md, docs/*.md and benchmarks/README.md (the rule: ``claims`` in
``benchmarks/code_shape.py``)."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def shape():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        yield importlib.import_module("code_shape")
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))


def test_no_result_is_stated_on_two_pages(shape) -> None:
    repeated = shape.repeated_claims(ROOT)
    shown = "; ".join(f"{claim} in " + ", ".join(f"{page}:{lines[0]}" for page, lines in pages.items())
                      for claim, pages in list(repeated.items())[:10])
    assert not repeated, (f"{len(repeated)} results stated on more than one page ({shown}); keep each "
                          "where its command measured it and link there from the others "
                          "([the numbers](page#section))")


def test_the_pages_state_results(shape) -> None:
    """The rule reads every page and finds their results (an empty reading would pass the test above)."""
    pages = {p.relative_to(ROOT).as_posix() for p in shape.doc_files(ROOT)}
    assert {"README.md", "docs/training.md", "docs/benchmarks.md", "benchmarks/README.md"} <= pages
    claimed = {page for where in shape.doc_claims(ROOT).values() for page in where}
    assert {"README.md", "docs/training.md", "benchmarks/README.md"} <= claimed


def test_a_result_restated_elsewhere_is_found(shape, tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "benchmarks" / "README.md").write_text(
        "| collector | 43,490 ÷ 1,540 = 28.2× |\n\nGiGPO went from 27% after SFT to 58% after RL.\n")
    (tmp_path / "docs" / "training.md").write_text(
        "The collector is 28.2× faster ([numbers](../benchmarks/README.md#x)); GiGPO: 27% → 58%.\n"
        "```bash\npython benchmarks/x.py  # 28.2× here is a command's comment, not a claim\n```\n")
    (tmp_path / "README.md").write_text("[GiGPO: 58% from 27%](benchmarks/README.md#x), 95% intervals.\n")
    repeated = shape.repeated_claims(tmp_path)
    assert repeated == {"28.2×": {"benchmarks/README.md": [1], "docs/training.md": [1]},
                        "27% -> 58%": {"benchmarks/README.md": [3], "docs/training.md": [1]}}


def test_common_numbers_count_only_with_their_neighbour(shape) -> None:
    assert shape.claims("16% of turns; 72% held out") == ["16% -> 72%"]
    assert shape.claims("72% after RL") == []  # alone, a common integer recurs by chance
    assert shape.claims("95% intervals over 75–78% and 46% ± 37%") == ["75–78%", "46% ± 37%"]
    assert shape.claims("| model | 79.7 | 9.6 | 70.1 |") == ["79.7 -> 70.1"]
