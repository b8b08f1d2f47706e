"""Speed of the evaluation harness and of the OpenAI-compatible policy path.

    python benchmarks/eval.py                       # both parts (about 2-4 minutes on 2 cores)
    python benchmarks/eval.py --part harness --episodes 64 --concurrency 1 32
    python benchmarks/eval.py --part openai --batch 1 16 --new-tokens 64

``harness``: episodes/s of ``agentgym.eval.harness.Evaluation`` with the ``expert`` policy on envs
served by ``agentgym serve`` (a separate process on 127.0.0.1), at each ``--concurrency``: every
episode is a session reset and one HTTP request per expert action and per step, so this is the
harness's own overhead plus the env service's latency. The same episodes in-process are shown for
reference. CPU ms/episode adds the harness process's and the env service's CPU time (what a busy
machine distorts least).

``openai``: the same tiny model (``TinyModelConfig()``, about 0.4 M parameters) generating the same
greedy tokens in-process (``TransformersPolicy.generate``) and through ``agentgym serve-policy`` (a
separate process) with ``OpenAIPolicy`` (one ``/v1/completions`` request per prompt, sent
concurrently; the server batches concurrent requests); both must produce the same token ids. Overhead
per generated token = (HTTP time − in-process time) / generated tokens (best of ``--repeats``), in
wall time and in CPU time (client process plus server process, from ``/proc``; CPU time is what a
busy machine distorts least). Both processes run torch with ``--torch-threads`` threads (default 1:
OpenMP threads spinning on shared cores otherwise make either path many times slower at random).
Client and server share the machine's cores.

Prints markdown tables and writes ``benchmarks/results/eval.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
from provenance import provenance

RESULTS = Path(__file__).resolve().parent / "results"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def serving(args: list[str], health_url: str, timeout_s: float = 120.0,
            env: dict[str, str] | None = None) -> Iterator[subprocess.Popen[str]]:
    """Run ``agentgym ARGS`` as a separate process until it answers ``health_url``; stop it (SIGINT,
    then SIGKILL) on exit, whatever happens."""
    process = subprocess.Popen([sys.executable, "-m", "agentgym", *args], stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True, env={**os.environ, **(env or {})})
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"agentgym {' '.join(args)} exited: {process.stderr.read()[-2000:]}")
            try:
                if httpx.get(health_url, timeout=1.0).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{health_url} did not answer within {timeout_s} s")
            time.sleep(0.2)
        yield process
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


# --- harness over env services ----------------------------------------------------------------------


def bench_harness(env_ids: list[str], episodes: int, concurrencies: list[int]) -> list[dict[str, Any]]:
    from agentgym.eval.harness import EnvEntry, EvalPlan, Evaluation
    from agentgym.eval.policies import parse_policy

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    rows = []
    with serving(["serve", *env_ids, "--port", str(port), "--max-sessions", "512", "--threads", "16"],
                 f"{url}/health") as server:
        for env_id in env_ids:
            for where, concurrency in [("in-process", 1), *(("HTTP", c) for c in concurrencies)]:
                entry = EnvEntry(env_id, url=url if where == "HTTP" else None)
                plan = EvalPlan((parse_policy("expert"),), (entry,), tuple(range(episodes)),
                                concurrency=concurrency)
                with tempfile.TemporaryDirectory() as out:
                    cpu_before = time.process_time() + cpu_s(server.pid)
                    started = time.perf_counter()
                    results = Evaluation(plan, out).run()
                    wall = time.perf_counter() - started
                    cpu = time.process_time() + cpu_s(server.pid) - cpu_before
                row = results["results"][0]
                steps = row["mean_turns"] * row["episodes"]
                rows.append({"env": env_id, "where": where, "concurrency": concurrency,
                             "episodes": row["episodes"], "success": row["success_rate"], "wall_s": wall,
                             "episodes_per_s": row["episodes"] / wall,
                             "steps_per_s": steps / wall, "mean_turns": row["mean_turns"],
                             "cpu_ms_per_episode": 1000 * cpu / row["episodes"]})
                print(f"  {env_id:12s} {where:10s} c={concurrency:<3d} "
                      f"{rows[-1]['episodes_per_s']:8.1f} episodes/s", flush=True)
    return rows


# --- OpenAI-compatible path against the in-process backend ------------------------------------------


def cpu_s(pid: int) -> float:
    """User + system CPU seconds a process has used (Linux ``/proc``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def bench_openai(batches: list[int], new_tokens: int, repeats: int,
                 torch_threads: int) -> list[dict[str, Any]]:
    from agentgym.backends.openai_backend import OpenAIEndpoint, OpenAIPolicy
    from agentgym.backends.tiny import TinyModelConfig, build_tiny_model, save_tiny
    from agentgym.backends.transformers_backend import TransformersPolicy
    from agentgym.rollout.policy import SamplingParams

    rows = []
    with tempfile.TemporaryDirectory() as folder:
        model_dir = save_tiny(*build_tiny_model(TinyModelConfig()), Path(folder) / "tiny")
        import torch

        torch.set_num_threads(torch_threads)
        local = TransformersPolicy.from_pretrained(model_dir, device="cpu")
        port = free_port()
        with serving(["serve-policy", str(model_dir), "--port", str(port), "--device", "cpu",
                      "--name", "tiny"],
                     f"http://127.0.0.1:{port}/health",
                     env={"OMP_NUM_THREADS": str(torch_threads)}) as server:
            remote = OpenAIPolicy(OpenAIEndpoint(f"http://127.0.0.1:{port}/v1", "tiny"), local.tokenizer,
                                  concurrency=max(batches))
            params = SamplingParams(max_new_tokens=new_tokens, temperature=0)
            for batch in batches:
                prompts = [local.tokenizer.encode(f"task {i}: go to the goal", add_special_tokens=False)
                           for i in range(batch)]
                remote.generate(prompts[:1], params)  # warm up both paths
                local.generate(prompts[:1], params)
                timings: dict[str, list[float]] = {"in-process": [], "HTTP": []}
                cpu: dict[str, list[float]] = {"in-process": [], "HTTP": []}
                tokens: dict[str, int] = {}
                for _ in range(repeats):
                    for name, policy in (("in-process", local), ("HTTP", remote)):
                        cpu_before = time.process_time() + (cpu_s(server.pid) if name == "HTTP" else 0.0)
                        started = time.perf_counter()
                        generations = policy.generate(prompts, params)
                        timings[name].append(time.perf_counter() - started)
                        cpu[name].append(time.process_time() + (cpu_s(server.pid) if name == "HTTP" else 0.0)
                                         - cpu_before)
                        tokens[name] = sum(len(g.token_ids) for g in generations)
                if tokens["in-process"] != tokens["HTTP"]:
                    raise RuntimeError(f"the two paths generated different tokens: {tokens}")
                count = tokens["HTTP"]
                best = {name: min(values) for name, values in timings.items()}
                least = {name: min(values) for name, values in cpu.items()}
                rows.append({"batch": batch, "tokens": count, "in_process_s": best["in-process"],
                             "http_s": best["HTTP"],
                             "in_process_ms_per_token": 1000 * best["in-process"] / count,
                             "http_ms_per_token": 1000 * best["HTTP"] / count,
                             "overhead_ms_per_token": 1000 * (best["HTTP"] - best["in-process"]) / count,
                             "in_process_cpu_ms_per_token": 1000 * least["in-process"] / count,
                             "http_cpu_ms_per_token": 1000 * least["HTTP"] / count,
                             "overhead_cpu_ms_per_token":
                                 1000 * (least["HTTP"] - least["in-process"]) / count})
                print(f"  batch {batch:3d}: in-process {rows[-1]['in_process_ms_per_token']:.3f} ms/token, "
                      f"HTTP {rows[-1]['http_ms_per_token']:.3f} ms/token", flush=True)
            remote.close()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--part", choices=["harness", "openai", "both"], default="both")
    parser.add_argument("--envs", nargs="+", default=["maze-v0", "sokoban-v0"])
    parser.add_argument("--episodes", type=int, default=64)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--torch-threads", type=int, default=1,
                        help="torch CPU threads of both processes "
                             "(1: no OpenMP spinning when cores are shared)")
    args = parser.parse_args()
    report: dict[str, Any] = {"platform": platform.platform(), "cpus": os.cpu_count(),
                              "python": sys.version.split()[0],
                              "load_average_before": os.getloadavg(), "provenance": provenance()}
    print(f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} before the run", flush=True)
    if args.part in ("harness", "both"):
        print("harness, expert policy:", flush=True)
        report["harness"] = bench_harness(args.envs, args.episodes, args.concurrency)
        print("\n| env | envs | concurrency | episodes | episodes/s | steps/s | mean turns | CPU ms/episode |"
              "\n|---|---|---|---|---|---|---|---|")
        for r in report["harness"]:
            print(f"| {r['env']} | {r['where']} | {r['concurrency']} | {r['episodes']} | "
                  f"{r['episodes_per_s']:.1f} | {r['steps_per_s']:.0f} | {r['mean_turns']:.1f} | "
                  f"{r['cpu_ms_per_episode']:.1f} |")
    if args.part in ("openai", "both"):
        print(f"\nOpenAI-compatible path, {args.new_tokens} greedy tokens per prompt:", flush=True)
        report["openai"] = bench_openai(args.batch, args.new_tokens, args.repeats, args.torch_threads)
        print("\n| batch | tokens | in-process ms/token | HTTP ms/token | overhead ms/token "
              "| in-process CPU ms/token | HTTP CPU ms/token (client + server) | CPU overhead ms/token |"
              "\n|---|---|---|---|---|---|---|---|")
        for r in report["openai"]:
            print(f"| {r['batch']} | {r['tokens']} | {r['in_process_ms_per_token']:.3f} | "
                  f"{r['http_ms_per_token']:.3f} | "
                  f"{r['overhead_ms_per_token']:.3f} | {r['in_process_cpu_ms_per_token']:.3f} | "
                  f"{r['http_cpu_ms_per_token']:.3f} | {r['overhead_cpu_ms_per_token']:.3f} |")
    report["load_average_after"] = os.getloadavg()
    print(f"load average {os.getloadavg()[0]:.1f} after the run")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "eval.json").write_text(json.dumps(report, indent=2) + "\n")
    print(f"\nwrote {RESULTS / 'eval.json'}")


if __name__ == "__main__":
    main()
