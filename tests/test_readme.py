"""README's Python examples run as written (the register example is executed)."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


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


def test_readme_names_the_commands_ci_runs() -> None:
    text = README.read_text()
    makefile = (README.parent / "Makefile").read_text()
    ci = (README.parent / ".ci" / "run").read_text()
    assert "make test" in text and "make demo" in text
    assert "make test" in ci
    test_line = re.search(r"^test: setup\n\t(.+)$", makefile, flags=re.MULTILINE).group(1)
    assert "pytest" in test_line and test_line.split("pytest", 1)[1].strip() in text


def test_env_table_lists_every_registered_env() -> None:
    import agentgym

    rows = {line.split("|")[1].strip().strip("`") for line in README.read_text().splitlines()
            if line.startswith("| `") and line.count("|") >= 8}
    registered = {spec.id for spec in agentgym.list_envs() if str(spec.entry_point).startswith("agentgym.envs.")}
    assert registered <= rows, f"README's env table lacks {sorted(registered - rows)}"
