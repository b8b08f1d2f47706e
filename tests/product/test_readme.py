"""README's Python examples run as written (the register example is executed); README and docs/envs.md
stay true."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"
ENVS_PAGE = README.parent / "docs" / "envs.md"


def _python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.DOTALL)


def test_register_example_runs_and_passes_check_env() -> None:
    block = next(b for b in _python_blocks() if "agentgym.register(" in b)
    namespace: dict = {}
    exec(compile(block.replace('"mine/guess-v0", Guess,', '"mine/guess-v0", Guess, override=True,'),
                 "README.md", "exec"), namespace)
    env = namespace["env"]
    obs, info = env.reset(seed=4)
    assert obs.startswith("Guess") and info["task_id"].startswith("guess/")
    secret = int(info["task_id"].split("/")[1])
    assert env.step("x")[4]["invalid_action"] is True
    assert env.step(str(secret))[1:3] == (1.0, True)


def makefile_with_defaults() -> str:
    """The Makefile with each ``$(VAR)`` a ``VAR ?= default`` line sets replaced by that default: what runs
    when nothing overrides it, the form README shows."""
    makefile = (README.parent / "Makefile").read_text()
    for name, default in re.findall(r"^([A-Z_]+) \?= (.+)$", makefile, flags=re.MULTILINE):
        makefile = makefile.replace(f"$({name})", default.strip())
    return makefile


def test_readme_names_the_commands_ci_runs() -> None:
    text = README.read_text()
    makefile = makefile_with_defaults()
    ci = (README.parent / ".ci" / "run").read_text()
    assert "make test" in text and "make demo" in text
    assert "make test" in ci
    recipe = re.search(r"^test: setup\n((?:\t.+\n)+)", makefile, flags=re.MULTILINE).group(1).splitlines()
    commands = [line.strip().removeprefix("$(BIN)/").removeprefix("python -m ") for line in recipe]
    assert [c.split()[0] for c in commands] == ["ruff", "pytest"]  # lint, then the tests
    for command in commands:
        assert command in text, f"README does not show what make test runs: {command}"


def test_env_table_lists_every_registered_env() -> None:
    import agentgym

    rows = {line.split("|")[1].strip().strip("`") for line in ENVS_PAGE.read_text().splitlines()
            if line.startswith("| `") and line.count("|") >= 8}
    registered = {spec.id for spec in agentgym.list_envs()
                  if str(spec.entry_point).startswith("agentgym.envs.")}
    assert registered <= rows, f"docs/envs.md's env table lacks {sorted(registered - rows)}"


def test_readme_is_short_and_links_every_manual_page() -> None:
    text = README.read_text()
    assert len(text.splitlines()) <= 250
    pages = sorted(path.name for path in (README.parent / "docs").glob("*.md"))
    assert {"envs.md", "training.md", "evaluation.md", "services.md", "sandbox.md",
            "benchmarks.md"} <= set(pages)
    for page in pages:
        assert f"(docs/{page})" in text, f"README does not link docs/{page}"


def test_readme_mentions_the_slow_step_ci_runs() -> None:
    text = README.read_text()
    makefile = makefile_with_defaults()
    slow_line = re.search(r"^test-slow: setup\n\t(.+)$", makefile, flags=re.MULTILINE).group(1)
    assert "make test-slow" in text
    assert " ".join(slow_line.split("pytest", 1)[1].split()) in " ".join(text.split())


def test_kl_estimators_named_as_the_config_accepts_them() -> None:
    from typing import get_args

    from agentgym.training.config.schema import KlType

    names = "/".join(get_args(KlType))
    for path in [README, *sorted((README.parent / "docs").glob("*.md"))]:
        for mention in re.findall(r"k1/k\d(?:/k\d)*", path.read_text()):
            assert mention == names, f"{path.name} says {mention}; the config accepts {names}"


def _anchors(markdown: str) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation but '-' and '_' dropped, spaces to '-'."""
    headings = re.findall(r"^#+ (.+)$", re.sub(r"^```.*?^```", "", markdown, flags=re.MULTILINE | re.DOTALL),
                          flags=re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-") for heading in headings}


def test_relative_links_reach_a_file_and_heading() -> None:
    for page in [README, *sorted((README.parent / "docs").glob("*.md"))]:
        text = page.read_text()
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+://", target):
                continue
            path_part, _, anchor = target.partition("#")
            linked = (page.parent / path_part).resolve() if path_part else page
            assert linked.exists(), f"{page.name} links {target}: no such file"
            if anchor and linked.suffix == ".md":
                assert anchor in _anchors(linked.read_text()), f"{page.name} links {target}: no such heading"


def test_harness_block_numbers_are_the_presets_and_its_benchmarks() -> None:
    # README's "Train the agent you already have" states what the preset does and what its runs measured.
    import json

    import yaml

    text = " ".join(README.read_text().split())
    assert "agentgym train harness_calculator_grpo_smollm2 " in text
    preset = yaml.safe_load((README.parent / "configs" / "harness_calculator_grpo_smollm2.yaml").read_text())
    assert preset["model"]["path"] == "smollm2" and preset["sft"]["enabled"]
    assert (f"SFT on {preset['sft']['num_episodes']} expert episodes teaches it the tool call, then "
            f"{preset['iterations']} {preset['algorithm']['name'].upper()} iterations") in text
    results = README.parent / "benchmarks" / "results" / "harness_learning.json"
    rows = [row for row in json.loads(results.read_text())["rows"]
            if row["preset"].endswith("harness_calculator_grpo_smollm2.yaml") and not row.get("tag")]
    sft = sorted(round(100 * row["after_sft"]) for row in rows)
    rl = sorted(round(100 * row["after_rl"]) for row in rows)
    seeds = sorted(row["seed"] for row in rows)
    assert (f"held-out success went from {sft[0]}–{sft[-1]}% after SFT to {rl[0]}–{rl[-1]}% "
            f"(seeds {seeds[0]}–{seeds[-1]}); a run alone on 2 cores with one torch thread took "
            f"{round(min(row['wall_s'] for row in rows) / 60)} minutes") in text
