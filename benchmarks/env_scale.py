"""The scale measurements of ``env_server.py --scale ...``: the trainer's collector path, env-worker
processes, a fleet with a service killed mid-run, WebSocket steps, and our client against a lean one.

    python benchmarks/env_server.py --scale collector workers fleet ws clients

Every section starts its own services on 127.0.0.1 (stopped at the end, whatever happens) and
returns rows for a markdown table. Each table carries the machine's load average when it ran:
on a shared machine compare the ratios within a table (measured in the same minute), not the
absolute numbers across runs.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import agentgym
from agentgym.http.launcher import free_port, start_service, stop_service
from agentgym.rollout.collector import Collector
from agentgym.rollout.policy import Generation, SamplingParams
from agentgym.rollout.prompt import PromptRenderer

HOST = "127.0.0.1"
BIN = Path(sys.executable).parent
MOVES = ("up", "down", "left", "right")


# --- an instant policy --------------------------------------------------------------------------


class ByteChatTokenizer:
    """UTF-8 bytes as ids; messages joined as ``role: content`` lines (costs microseconds)."""

    eos_token_id = 0
    pad_token_id = 0

    def apply_chat_template(self, conversation: list[dict[str, str]], *, tokenize: bool = True,
                            add_generation_prompt: bool = False, **kwargs: Any) -> Any:
        text = "\n".join(f"{m['role']}: {m['content']}" for m in conversation)
        return list(text.encode()) if tokenize else text

    def decode(self, token_ids: Sequence[int], *, skip_special_tokens: bool = False) -> str:
        return bytes(t for t in token_ids if t).decode(errors="replace")


class InstantPolicy:
    """Answers at once with a maze move chosen by a hash of the prompt: only envs and transport count."""

    def __init__(self) -> None:
        self.tokenizer = ByteChatTokenizer()

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Generation]:
        out = []
        for index, prompt in enumerate(prompts):
            digest = hashlib.blake2b(f"{params.seed}|{index}".encode() + bytes(prompt[-200:]), digest_size=2).digest()
            ids = [*MOVES[digest[0] % 4].encode(), 0]
            out.append(Generation(ids, [0.0] * len(ids), "stop"))
        return out

    def sync_weights(self, state_dict: Any) -> None:
        pass


def _collector(make_env: Any) -> Collector:
    policy = InstantPolicy()
    renderer = PromptRenderer(policy.tokenizer, mode="current", include_instructions=False,
                              show_admissible_actions=False)
    return Collector(make_env, policy, renderer)


def serve(env_ids: Sequence[str], *extra: str, port: int | None = None) -> tuple[subprocess.Popen[bytes], str]:
    port = port or free_port()
    command = [str(BIN / "agentgym"), "serve", *env_ids, "--host", HOST, "--port", str(port),
               "--max-sessions", "4096", "--log-level", "error", *extra]
    url = f"http://{HOST}:{port}"
    return start_service(command, url, timeout_s=120, stdout=subprocess.DEVNULL), url


def load() -> float:
    return round(os.getloadavg()[0], 2)


# --- 1. the collector path ----------------------------------------------------------------------


def _time_collects(collector: Collector, episodes: int, duration_s: float, seed: int) -> dict[str, float]:
    """Collect ``episodes`` maze episodes (groups of 8) again and again for ``duration_s``; steps/s."""
    groups = max(1, episodes // 8)
    sampling = SamplingParams(max_new_tokens=8, seed=seed)
    collector.collect(list(range(groups)), episodes // groups, sampling)  # opens the sessions, warms up
    steps = env_s = total_s = 0.0
    rounds = 0
    started = time.perf_counter()
    while time.perf_counter() - started < duration_s or rounds < 2:
        collector.collect([seed * 1000 + rounds * groups + g for g in range(groups)], episodes // groups, sampling)
        stats = collector.last_stats
        steps += stats.turns
        env_s += stats.env_s
        total_s += stats.total_s
        rounds += 1
    return {"steps": steps, "env_steps_per_s": steps / env_s, "steps_per_s": steps / total_s, "rounds": rounds}


def collector_path(episode_counts: Sequence[int], duration_s: float) -> list[dict[str, Any]]:
    """Per episode count: in-process envs, today's per-session RemoteEnv path, the EnvFleet path."""
    from agentgym.http.client import EnvClient, RemoteEnv
    from agentgym.http.fleet import EnvFleet

    rows = []
    process, url = serve(["maze-v0"])
    try:
        capacity = batch_capacity(url, process.pid, 64, duration_s)
        for n in episode_counts:
            client = EnvClient(url, retries=0)
            paths = {
                "in-process": lambda: agentgym.make("maze-v0"),
                "per-session RemoteEnv (before)": lambda: RemoteEnv("maze-v0", client=client),
                "EnvFleet batched (now)": EnvFleet([url], "maze-v0"),
            }
            row: dict[str, Any] = {"episodes": n, "load": load(), "batch_route_steps_per_s": capacity}
            for name, make_env in paths.items():
                collector = _collector(make_env)
                try:
                    row[name] = _time_collects(collector, n, duration_s, seed=n)
                finally:
                    collector.close()
            client.close()
            before, now = row["per-session RemoteEnv (before)"], row["EnvFleet batched (now)"]
            row["speedup_env_path"] = now["env_steps_per_s"] / before["env_steps_per_s"]
            row["fleet_vs_batch_route"] = now["env_steps_per_s"] / capacity
            rows.append(row)
            print(f"  collector {n:>4} episodes: before {before['env_steps_per_s']:>8,.0f}  now "
                  f"{now['env_steps_per_s']:>8,.0f} env steps/s (x{row['speedup_env_path']:.1f}; "
                  f"{100 * row['fleet_vs_batch_route']:.0f}% of the batch route's {capacity:,.0f})", flush=True)
    finally:
        stop_service(process)
    return rows


def batch_capacity(url: str, pid: int, sessions: int, duration_s: float) -> float:
    """Steps/s of ``/batch/step`` with ``sessions`` sessions from the raw client of env_server.py."""
    from env_server import run_http_cell

    port = int(url.rsplit(":", 1)[1])
    return run_http_cell(port, pid, "batch", "raw", sessions, 1, 0.5, duration_s, 0)["steps_per_s"]


def collector_table(rows: list[dict[str, Any]]) -> str:
    lines = ["| episodes | in-process env steps/s | per-session RemoteEnv (before) | EnvFleet batched (now) | now ÷ before "
             "| now ÷ batch route | batch route steps/s (64 sessions, raw client) | load avg |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(
            f"| {r['episodes']} | {r['in-process']['env_steps_per_s']:,.0f} | "
            f"{r['per-session RemoteEnv (before)']['env_steps_per_s']:,.0f} | "
            f"{r['EnvFleet batched (now)']['env_steps_per_s']:,.0f} | {r['speedup_env_path']:.1f}× | "
            f"{100 * r['fleet_vs_batch_route']:.0f}% | {r['batch_route_steps_per_s']:,.0f} | {r['load']} |")
    return "\n".join(lines)


# --- entry point --------------------------------------------------------------------------------

SECTIONS = ("collector",)


def run_scale(sections: Sequence[str], *, episodes: Sequence[int], duration_s: float, out: Path) -> int:
    """Run the named sections, print their tables, write ``out`` (JSON)."""
    import json

    results: dict[str, Any] = {"cpu_cores": os.cpu_count(), "load_average_start": load()}
    tables = []
    if "collector" in sections:
        rows = collector_path(episodes, duration_s)
        results["collector"] = rows
        tables.append(("The trainer's collector path, maze-v0, instant policy (env steps/s = turns ÷ time in env "
                       "calls)", collector_table(rows)))
    results["load_average_end"] = load()
    for title, table in tables:
        print(f"\n{title}; {os.cpu_count()} cores shared by clients and services\n\n{table}")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"\nwrote {out}")
    return 0
