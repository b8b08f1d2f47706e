"""Every ```bash and ```python block of README.md and docs/*.md runs as a reader would run it, shortened.

The blocks run against what a user installs, not the checkout: a session fixture builds the wheel, installs
it (no dependencies) into a fresh venv whose other packages come from the development venv, and checks that
``agentgym`` imports from that wheel. Each page's blocks run in order in one empty scratch folder (a later
block uses what an earlier one made, as a reader's later commands do). Shell blocks run in bash with that
venv first on PATH; ``agentgym`` commands that serve (``serve``, ``serve-policy``, ``view``, ``retrieval
serve``, ``sandbox serve``) start in the background on a free port, and every later ``127.0.0.1:PORT`` or
``localhost:PORT`` of that page, in shell and Python blocks alike, is pointed at it; they stop when the page
is done. Training and evaluation lines are shortened by ``shorten``, which may only set the keys of
``SHORTENING_KEYS`` (fewer iterations, episodes, tasks; it asserts so; ``AS_WRITTEN`` lists blocks that
keep some of them as written), and ``curl`` fails on an HTTP error; nothing else is changed.

Blocks that cannot run here are listed in ``SKIPPED_BY_DESIGN`` with the reason; blocks that take
minutes even shortened are in ``SLOW`` and run only under ``-m slow``. Every ``agentgym`` command
line of every block, skipped ones included, is parsed by the CLI's own click objects, so an option
that does not exist fails here.
"""

from __future__ import annotations

import functools
import os
import re
import shlex
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import installed
import pytest
import typer

from agentgym.cli import app
from agentgym.service_kit.launcher import free_port, start_service, stop_service

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

# (page, a string only that block contains) -> why the block does not run here. Its agentgym lines
# are still parsed against the CLI.
SKIPPED_BY_DESIGN: dict[tuple[str, str], str] = {
    ("README.md", "make demo   #"):
        "`make` sets up a venv from scratch and runs the whole suite; the demo's command "
        "(agentgym train --out runs/quickstart) runs here as README's prerequisite",
    ("docs/services.md", "docker compose"):
        "needs a Docker engine; tests/product/test_services.py checks the Dockerfile "
        "and compose file and runs each target's entry point",
    ("docs/services.md", "kubectl create secret"):
        "needs a Kubernetes cluster; tests/product/test_services.py runs the Secret line "
        "(kubectl printing its arguments) and each manifest's container with that Secret's tokens",
    ("docs/training.md", "--out runs/alf\n"): "needs a GPU, vLLM and Qwen2.5-1.5B weights",
    ("docs/training.md", "--num_processes 8"): "needs 8 GPUs (the 2-process CPU line is what "
                                               "tests/training/run/test_distributed.py runs over gloo)",
    ("docs/training.md", "--num_machines 2"): "needs two GPU machines",
    ("docs/training.md", "vllm serve"): "needs vLLM on a GPU and model weights",
    ("docs/evaluation.md", "--judge judge.yaml"):
        "needs a trained run folder (RUN) and a judge endpoint; tests/eval/test_eval_splits.py evaluates "
        "with a judge server",
}

# (page, a string only that block contains) -> why it is slow even shortened. Run with -m slow.
SLOW: dict[tuple[str, str], str] = {
    ("README.md", "agentgym train quickstart_maze_grpo"): "three training runs and a resume",
    ("README.md", "search_qa_arpo_smollm2 --out"): "trains the packaged 135 M model (converting it first)",
    ("README.md", "harness_calculator_grpo_smollm2"):
        "trains and evaluates the packaged 135 M model through the rollout proxy (converting it first)",
    ("README.md", "agentgym serve-policy runs/quickstart"):
        "evaluates a trained model in-process and through serve-policy (needs the prerequisite run)",
    ("docs/training.md", "--out runs/grpo-g4"): "two training runs and a resume",
    ("docs/training.md", "search_qa_grpo_tiny --out"): "two tool-task training runs",
    ("docs/training.md", "--policy smollm2"): "converts the packaged 135 M model, evaluates and trains it",
    ("docs/services.md", "--workers 2 --port 8000"): "alfworld-v0 in two worker processes and a training run",
    ("docs/harness.md", "--out runs/my-agent"): "trains and evaluates the packaged 135 M model through the "
                                                "rollout proxy (README's block runs the same preset)",
    ("docs/baselines.md", "--envs all"): "a training run and every registered env, TextWorld and ALFWorld "
                                         "games included",
    ("docs/baselines.md", "--episodes 64 --out runs/baselines-quickstart"):
        "needs the trained run of the block before it",
}

# (page, a string only that block contains) -> settings of SHORT_SETTINGS its training lines keep as written,
# and why. Shortening less is always allowed; these blocks would otherwise test a run the reader never gets.
AS_WRITTEN: dict[tuple[str, str], tuple[frozenset[str], str]] = {
    ("docs/training.md", "--policy smollm2"): (
        frozenset({"sft.num_episodes"}),
        "after SFT on 2 episodes SmolLM2 makes no search call and the run stops there; the preset's 16 "
        "teach it"),
}

# Commands a page's slow blocks rely on that its reader ran elsewhere: README's run folder comes from
# `make demo`.
PREREQUISITES: dict[str, list[str]] = {
    "README.md": ["agentgym train --out runs/quickstart"],
}

SERVING_COMMANDS = {("serve",), ("serve-policy",), ("view",), ("retrieval", "serve"), ("sandbox", "serve")}
# What a test may change in a documented command: how much work it does, nothing else. Each entry leaves the
# command doing what the reader's does, on fewer iterations, episodes or tasks; a behaviour switch, another
# model or a looser check would test a command nobody runs. `shorten` asserts it changes no other setting.
SHORTENING_KEYS: dict[str, str] = {
    # `agentgym train --set KEY=VALUE`
    "iterations": "fewer RL iterations of the same loop (a resume extends the run by fewer)",
    "sft.num_episodes": "the same SFT warm start on fewer expert episodes",
    "eval.num_episodes": "the same held-out evaluation on fewer episodes",
    "rollout.num_tasks": "fewer tasks per iteration, each played the same way",
    "rollout.group_size": "fewer episodes per task: a smaller group for the same advantage estimator",
    # `agentgym eval` options
    "--episodes": "fewer episodes per env and policy",
    "--samples": "fewer samples per task (pass@k over fewer k)",
    "--seeds": "a shorter seed range from the same first seed",
    "--task-range": "fewer tasks of the split from the same first task",
}
SHORT_SETTINGS = {"iterations": "1", "sft.num_episodes": "2", "eval.num_episodes": "2",
                  "rollout.num_tasks": "2", "rollout.group_size": "2"}
SHORT_RESUME_ITERATIONS = "3"
SHORT_EPISODES = "2"
BLOCK_TIMEOUT_S = 900


@dataclass(frozen=True)
class Block:
    """One fenced block of a page."""

    page: str
    """Path relative to the repository root."""
    index: int
    """Its position among the page's bash and python blocks."""
    language: str
    """``bash`` or ``python``."""
    text: str
    line: int
    """Line of the opening fence."""

    @property
    def label(self) -> str:
        return f"{self.page}:{self.line}"

    def kept_settings(self) -> frozenset[str]:
        """The settings its training lines keep as written (``AS_WRITTEN``)."""
        return next((keep for (page, marker), (keep, _) in AS_WRITTEN.items()
                     if page == self.page and marker in self.text), frozenset())

    def listed_in(self, table: dict[tuple[str, str], Any]) -> str | None:
        return next((why for (page, marker), why in table.items()
                     if page == self.page and marker in self.text), None)


def extract_blocks(path: Path) -> list[Block]:
    """The ```bash and ```python blocks of a Markdown page, in order (fences at the start of a line)."""
    text = path.read_text()
    page = str(path.relative_to(ROOT))
    blocks = []
    for match in re.finditer(r"^```(bash|python)\n(.*?)^```$", text, flags=re.MULTILINE | re.DOTALL):
        line = text.count("\n", 0, match.start()) + 1
        blocks.append(Block(page, len(blocks), match.group(1), match.group(2), line))
    return blocks


BLOCKS = [block for page in PAGES for block in extract_blocks(page)]


def command_lines(script: str) -> list[str]:
    """The shell command lines of a block: continuations joined, comments and blank lines dropped."""
    joined = re.sub(r"\\\n\s*", " ", script)
    lines = []
    for line in joined.splitlines():
        words = shlex.split(line, comments=True)
        if words:
            lines.append(line)
    return lines


def agentgym_argv(line: str) -> list[str] | None:
    """The arguments after ``agentgym`` (or ``-m agentgym``) in a command line, None when it runs no
    agentgym."""
    words = shlex.split(line, comments=True)
    while words and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", words[0]):  # VAR=value prefixes
        words = words[1:]
    if words and words[0] == "agentgym":
        return words[1:]
    for i in range(len(words) - 1):
        if words[i] == "-m" and words[i + 1] == "agentgym":
            return words[i + 2:]
    return None


class CliLineError(Exception):
    """A documented ``agentgym`` command line that the CLI would refuse."""


@functools.cache
def cli_command() -> Any:
    """The CLI's click command tree (built once: typer rebuilds it on every call)."""
    return typer.main.get_command(app)


def resolve_command(argv: list[str]) -> tuple[tuple[str, ...], Any, list[str]]:
    """The command path, its click command and its own arguments.

    Raises:
        CliLineError: a command name the CLI does not have.
    """
    command = cli_command()
    path: list[str] = []
    rest = list(argv)
    while isinstance(getattr(command, "commands", None), dict) and rest and not rest[0].startswith("-"):
        name = rest.pop(0)
        if name not in command.commands:
            raise CliLineError(f"no command {' '.join([*path, name])!r}; known: {sorted(command.commands)}")
        path.append(name)
        command = command.commands[name]
    return tuple(path), command, rest


def check_cli_line(argv: list[str]) -> None:
    """Parse ``argv`` with the CLI's click objects (options, arguments, their types) without running it.

    Raises:
        CliLineError: what the CLI would say about the line (an unknown option, a bad value...).
    """
    path, command, rest = resolve_command(argv)
    try:
        command.make_context(" ".join(["agentgym", *path]), list(rest))  # parsing consumes the list
    except Exception as error:  # click's classes, or those of the click typer vendors (typer >= 0.29)
        if getattr(error, "exit_code", None) == 0:  # --help parses, prints and exits 0
            return
        if callable(getattr(error, "format_message", None)):
            raise CliLineError(error.format_message()) from error
        raise
    if path == ("train",):
        from agentgym.training.config.loading import list_presets

        for config in (word for word in rest if word.endswith((".yaml", ".yml"))):
            if config.startswith("configs/") and not (ROOT / config).is_file():
                raise CliLineError(f"{config} is not a shipped config")
        config = parsed_options(argv).get("config")
        if config and "/" not in config and not config.endswith((".yaml", ".yml")) \
                and config not in list_presets():
            raise CliLineError(f"{config} is not a shipped preset; the presets: {list_presets()}")


# --- shortening -------------------------------------------------------------------------------


def parsed_options(argv: list[str]) -> dict[str, Any]:
    """The values the CLI's click objects give an ``agentgym`` command line, by option (``--episodes``); the
    ``--set KEY=VALUE`` settings each by its key, the last one winning as in the CLI."""
    path, command, rest = resolve_command(argv)
    params = command.make_context(" ".join(["agentgym", *path]), list(rest)).params
    options: dict[str, Any] = {}
    for param in command.params:
        value = params.get(param.name)
        if param.opts == ["--set"]:
            options.update(setting.split("=", 1) for setting in value or ())
        else:
            options[param.opts[0]] = value
    return options


def changed_options(line: str, shortened: str) -> set[str]:
    """The settings and options whose value ``shortened`` changes or adds to ``line``'s agentgym command."""
    before, after = agentgym_argv(line), agentgym_argv(shortened)
    assert before is not None and after is not None and before[:1] == after[:1]
    if before == after:
        return set()
    old, new = parsed_options(before), parsed_options(after)
    return {key for key in old.keys() | new.keys() if old.get(key) != new.get(key)}


def check_shortening(line: str, shortened: str) -> None:
    """Fail unless ``shortened`` is ``line`` with only ``SHORTENING_KEYS`` changed."""
    if agentgym_argv(line) is None:
        return
    others = changed_options(line, shortened) - SHORTENING_KEYS.keys()
    assert not others, (f"shortening `{line}` would change {sorted(others)}, which change what the command "
                        f"does; a test may only shorten it ({sorted(SHORTENING_KEYS)})")


def _at_most(match: re.Match, short: str) -> str:
    """``--option N`` (or ``key=N``) with N lowered to ``short``, never raised."""
    return f"{match.group(1)}{min(int(match.group(2)), int(short))}"


def shorten(line: str, keep: frozenset[str] = frozenset()) -> str:
    """The same command with less work: shortened training and evaluation (but the ``keep`` settings), no
    venv activation (the test's venv is first on PATH already). Asserts it changes nothing but
    ``SHORTENING_KEYS``."""
    argv = agentgym_argv(line)
    if line.strip().startswith((". .venv/bin/activate", "source .venv/bin/activate")):
        return ":"
    if argv is None:
        # An HTTP error must fail the block (curl alone exits 0 on a 404), so a stale route shows.
        return re.sub(r"\bcurl -s ", "curl -s --fail-with-body ", line)
    words = [word for word in argv if not word.startswith("#")]
    code = line.split(" #", 1)[0].rstrip()
    if words[:1] == ["train"] and "--help" not in words:
        if "--resume" in words:
            code = re.sub(r"(iterations=)(\d+)", lambda m: _at_most(m, SHORT_RESUME_ITERATIONS), code)
        else:
            written = parsed_options(argv)
            code += "".join(f" --set {key}={value}" for key, value in SHORT_SETTINGS.items()
                            if key not in keep and not (key in written and int(written[key]) <= int(value)))
    elif words[:1] == ["eval"]:
        code = re.sub(r"(--episodes )(\d+)", lambda m: _at_most(m, SHORT_EPISODES), code)
        code = re.sub(r"(--samples )(\d+)", lambda m: _at_most(m, SHORT_EPISODES), code)
        code = re.sub(r"--seeds (\d+)-(\d+)",
                      lambda m: f"--seeds {m.group(1)}-{min(int(m.group(2)), int(m.group(1)) + 1)}", code)
        code = re.sub(r"--task-range (\d+):(\d+)",
                      lambda m: f"--task-range {m.group(1)}:{min(int(m.group(2)), int(m.group(1)) + 2)}",
                      code)
        if not {"--resume", "--episodes", "--seeds", "--task-range"} & set(words):
            code += f" --episodes {SHORT_EPISODES}"
    check_shortening(line, code)
    return code


# --- a page's session: its scratch folder and the services its blocks started ------------------


@dataclass
class PageSession:
    """The scratch folder one page's blocks run in and the services they started, by the port the page
    names."""

    workdir: Path
    venv: Path
    """The venv the wheel is installed in (``installed_venv``)."""
    services: dict[int, tuple[int, subprocess.Popen]] = field(default_factory=dict)
    logs: list = field(default_factory=list)
    ran: int = 0

    def env(self) -> dict[str, str]:
        # The installed venv as `activate` sets it up; no PYTHONPATH, which could bring in the checkout.
        env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "PYTHONHOME")}
        return {**env, "PATH": f"{self.venv / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
                "VIRTUAL_ENV": str(self.venv), "PYTHONUNBUFFERED": "1"}

    def repoint(self, text: str) -> str:
        """Point every ``127.0.0.1:PORT``/``localhost:PORT`` of a port the page served at the real service."""
        def swap(match: re.Match) -> str:
            port = int(match.group(2))
            return f"{match.group(1)}:{self.services[port][0]}" if port in self.services else match.group(0)

        return re.sub(r"(127\.0\.0\.1|localhost):(\d+)", swap, text)

    def start_service(self, argv: list[str], label: str) -> None:
        path, command, rest = resolve_command(argv)
        port_param = next(p for p in command.params if p.name == "port")
        if "--port" in rest:
            at = rest.index("--port")
            page_port = int(rest[at + 1])
            rest = rest[:at] + rest[at + 2:]
        else:
            page_port = int(port_param.default)
        if page_port in self.services:  # the page starts another service on a port it used before
            stop_service(self.services.pop(page_port)[1])
        port = free_port()
        log = open(self.workdir / f"service-{port}.log", "w")  # noqa: SIM115 - closed in close()
        self.logs.append(log)
        process = start_service([str(self.venv / "bin" / "agentgym"), *path, *rest, "--port", str(port)],
                                f"http://127.0.0.1:{port}", timeout_s=120, cwd=self.workdir, env=self.env(),
                                stdout=log, stderr=subprocess.STDOUT)
        self.services[page_port] = (port, process)

    def run_shell(self, script: str, label: str) -> None:
        done = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", script], cwd=self.workdir,
                              env=self.env(), input=":q\n", capture_output=True, text=True,
                              timeout=BLOCK_TIMEOUT_S)
        if done.returncode != 0:
            raise AssertionError(f"{label}: exit {done.returncode}\n$ {script}\n{done.stdout[-3000:]}\n"
                                 f"{done.stderr[-3000:]}")

    def run_bash(self, block: Block) -> None:
        pending: list[str] = []
        for line in command_lines(block.text):
            argv = agentgym_argv(line)
            if argv is not None and resolve_command(argv)[0] in SERVING_COMMANDS:
                if pending:
                    self.run_shell("\n".join(pending), block.label)
                    pending = []
                self.start_service(argv, block.label)
            else:
                pending.append(self.repoint(shorten(line, block.kept_settings())))
        if pending:
            self.run_shell("\n".join(pending), block.label)

    def run_python(self, block: Block) -> None:
        done = subprocess.run([str(self.venv / "bin" / "python"), "-"], input=self.repoint(block.text),
                              cwd=self.workdir, env=self.env(), capture_output=True, text=True,
                              timeout=BLOCK_TIMEOUT_S)
        if done.returncode != 0:
            raise AssertionError(f"{block.label}: exit {done.returncode}\n"
                                 f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}")

    def open_sessions(self) -> dict[int, float]:
        """Live sessions on each env service the page started (``agentgym_sessions_active``, all workers)."""
        counts = {}
        for page_port, (port, _) in self.services.items():
            text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
            values = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                      if line.startswith("agentgym_sessions_active")]
            if values:
                counts[page_port] = sum(values)
        return counts

    def run(self, block: Block) -> None:
        before = self.open_sessions()
        (self.run_bash if block.language == "bash" else self.run_python)(block)
        after = self.open_sessions()
        # An example that leaves a session open teaches readers to leak them on a shared service.
        left = {port: after[port] - count for port, count in before.items() if after.get(port, 0) > count}
        assert not left, f"{block.label} left sessions open on the env service(s) of port(s) {sorted(left)}"
        self.ran += 1

    def close(self) -> None:
        for _, process in self.services.values():
            stop_service(process)
        self.services.clear()
        for log in self.logs:
            log.close()


STATS = {"blocks": 0, "seconds": 0.0}


@pytest.fixture(scope="module", autouse=True)
def report_count(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    skipped = sum(1 for block in BLOCKS if block.listed_in(SKIPPED_BY_DESIGN))
    message = (f"doc blocks: {STATS['blocks']} of {len(BLOCKS)} run in {STATS['seconds']:.0f} s "
               f"({skipped} skipped by design, {len(SLOW)} marked slow)")
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    if reporter is None or capture is None:
        print(message)
        return
    # The count belongs in the run's output, not a captured section.
    with capture.global_and_fixture_disabled():
        reporter.write_line(message)


@pytest.fixture(scope="session")
def installed_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with the wheel built from this checkout installed, as a user installs it
    (``installed.overlay_venv``: the wheel alone, its dependencies from the development venv)."""
    return installed.overlay_venv(tmp_path_factory, tmp_path_factory.mktemp("installed") / "venv")


def run_page(page: str, workdir: Path, venv_dir: Path, include_slow: bool) -> None:
    """Run a page's blocks in ``workdir``, an empty folder: nothing of the checkout is there."""
    assert not any(workdir.iterdir())
    session = PageSession(workdir, venv_dir)
    started = time.monotonic()
    try:
        for command in PREREQUISITES.get(page, []) if include_slow else []:
            session.run_shell(shorten(command), f"{page} prerequisite")
        for block in (b for b in BLOCKS if b.page == page):
            if block.listed_in(SKIPPED_BY_DESIGN) or (block.listed_in(SLOW) and not include_slow):
                continue
            session.run(block)
    finally:
        session.close()
        STATS["blocks"] += session.ran
        STATS["seconds"] += time.monotonic() - started


PAGE_NAMES = sorted({block.page for block in BLOCKS})


# --- tests -------------------------------------------------------------------------------------


def test_every_page_has_blocks_and_every_table_entry_names_one() -> None:
    assert {"README.md", "docs/training.md", "docs/evaluation.md", "docs/services.md"} <= set(PAGE_NAMES)
    for table in (SKIPPED_BY_DESIGN, SLOW, AS_WRITTEN):
        for page, marker in table:
            matching = [b for b in BLOCKS if b.page == page and marker in b.text]
            assert len(matching) == 1, f"{page}: {marker!r} names {len(matching)} blocks, not one"
    assert not any(b.listed_in(SKIPPED_BY_DESIGN) and b.listed_in(SLOW) for b in BLOCKS)


@pytest.mark.parametrize("block", [b for b in BLOCKS if b.language == "bash"], ids=lambda b: b.label)
def test_agentgym_lines_parse_with_the_real_cli(block: Block) -> None:
    for line in command_lines(block.text):
        argv = agentgym_argv(line)
        if argv is None:
            continue
        try:
            check_cli_line(argv)
        except CliLineError as error:
            pytest.fail(f"{block.label}: `agentgym {' '.join(argv)}`: {error}")


@pytest.mark.parametrize("block", [b for b in BLOCKS if b.language == "python"], ids=lambda b: b.label)
def test_python_blocks_compile(block: Block) -> None:
    compile(block.text, block.label, "exec")


def test_a_wrong_option_is_caught() -> None:
    # The parse check must reject what the CLI rejects, or every line above passes vacuously.
    with pytest.raises(CliLineError, match="--episode"):
        check_cli_line(["eval", "--policy", "random", "--episode", "3"])
    with pytest.raises(CliLineError, match="--port"):
        check_cli_line(["serve", "maze-v0", "--port", "eighty"])
    with pytest.raises(CliLineError, match="retrieval search"):
        check_cli_line(["retrieval", "search", "x"])
    with pytest.raises(CliLineError, match="configs/nope.yaml"):
        check_cli_line(["train", "configs/nope.yaml"])
    with pytest.raises(CliLineError, match="nope_preset is not a shipped preset"):
        check_cli_line(["train", "nope_preset", "--out", "runs/x"])
    check_cli_line(["train", "--help"])


def documented_lines() -> list[str]:
    """Every command line of every bash block, and the prerequisites' commands."""
    return [*(line for block in BLOCKS if block.language == "bash" for line in command_lines(block.text)),
            *(command for commands in PREREQUISITES.values() for command in commands)]


def test_shortening_changes_only_what_the_list_allows() -> None:
    assert SHORT_SETTINGS.keys() <= SHORTENING_KEYS.keys()
    shortened = 0
    for line in documented_lines():
        if shorten(line) != line:  # asserts that only SHORTENING_KEYS change
            shortened += 1
    assert shortened >= 10
    line = "agentgym train quickstart_maze_grpo --set iterations=120 --set seed=1 --out runs/x"
    assert changed_options(line, shorten(line)) == set(SHORT_SETTINGS)
    assert "iterations=120 " in shorten(line) and " --set iterations=1 " in shorten(line)
    assert changed_options(line, shorten(line, frozenset({"sft.num_episodes"}))) == \
        set(SHORT_SETTINGS) - {"sft.num_episodes"}


def test_an_override_that_changes_behaviour_is_refused() -> None:
    # The guard shorten relies on: a setting outside SHORTENING_KEYS fails, whatever its value.
    line = "agentgym train --set env.harness=a:b --out runs/my-agent"
    with pytest.raises(AssertionError, match="rollout.require_tool_calls"):
        check_shortening(line, f"{line} --set iterations=1 --set rollout.require_tool_calls=false")
    with pytest.raises(AssertionError, match="model.path"):
        check_shortening(line, f"{line} --set model.path=tiny")
    with pytest.raises(AssertionError, match="--temperature"):
        check_shortening("agentgym eval --policy random", "agentgym eval --policy random --temperature 0")
    check_shortening(line, f"{line} --set iterations=1 --set rollout.group_size=2")
    check_shortening("agentgym eval --episodes 20", "agentgym eval --episodes 2")


def test_readme_prerequisite_is_what_make_demo_runs() -> None:
    recipe = re.search(r"^demo: setup\n\t(.+)$", (ROOT / "Makefile").read_text(), flags=re.MULTILINE)
    assert PREREQUISITES["README.md"] == [recipe.group(1).removeprefix("$(BIN)/")]


@pytest.mark.parametrize("page", PAGE_NAMES)
def test_page_blocks_run(page: str, tmp_path: Path, installed_venv: Path) -> None:
    run_page(page, tmp_path, installed_venv, include_slow=False)


@pytest.mark.slow
@pytest.mark.timeout(2700)  # a page's slow blocks together: several real-model runs (README, training)
@pytest.mark.parametrize("page", [p for p in PAGE_NAMES
                                  if any(b.page == p and b.listed_in(SLOW) for b in BLOCKS)])
def test_page_blocks_run_with_slow_ones(page: str, tmp_path: Path, installed_venv: Path) -> None:
    run_page(page, tmp_path, installed_venv, include_slow=True)
