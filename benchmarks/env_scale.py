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
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from provenance import provenance

import agentgym
from agentgym.rollout.collector import Collector
from agentgym.rollout.hooks import RolloutHooks
from agentgym.rollout.policy import Generation, SamplingParams
from agentgym.rollout.prompt import PromptRenderer
from agentgym.service_kit.launcher import free_port, start_service, stop_service

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
            digest = hashlib.blake2b(f"{params.seed}|{index}".encode() + bytes(prompt[-200:]),
                                     digest_size=2).digest()
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


def serve(env_ids: Sequence[str], *extra: str,
          port: int | None = None) -> tuple[subprocess.Popen[bytes], str]:
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
        collector.collect([seed * 1000 + rounds * groups + g for g in range(groups)], episodes // groups,
                          sampling)
        stats = collector.last_stats
        steps += stats.turns
        env_s += stats.env_s
        total_s += stats.total_s
        rounds += 1
    return {"steps": steps, "env_steps_per_s": steps / env_s, "steps_per_s": steps / total_s,
            "rounds": rounds}


def collector_path(episode_counts: Sequence[int], duration_s: float) -> list[dict[str, Any]]:
    """Per episode count: in-process envs, today's per-session RemoteEnv path, the EnvFleet path."""
    from agentgym.http.client import EnvClient, RemoteEnv
    from agentgym.http.fleet import EnvFleet

    rows = []
    process, url = serve(["maze-v0"])
    try:
        for n in episode_counts:
            # The batch route's capacity in the same minute as the row.
            capacity = batch_capacity(url, process.pid, 64, min(duration_s, 3.0))
            client = EnvClient(url, retries=0)
            paths = {
                "in-process": lambda: agentgym.make("maze-v0"),
                "per-session RemoteEnv (before)": lambda client=client: RemoteEnv("maze-v0", client=client),
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
            # The capacity again, after the paths: their mean brackets the paths in time.
            capacity = row["batch_route_steps_per_s"] = (capacity + batch_capacity(
                url, process.pid, 64, min(duration_s, 3.0))) / 2
            before, now = row["per-session RemoteEnv (before)"], row["EnvFleet batched (now)"]
            row["speedup_env_path"] = now["env_steps_per_s"] / before["env_steps_per_s"]
            row["fleet_vs_batch_route"] = now["env_steps_per_s"] / capacity
            rows.append(row)
            print(f"  collector {n:>4} episodes: before {before['env_steps_per_s']:>8,.0f}  now "
                  f"{now['env_steps_per_s']:>8,.0f} env steps/s (x{row['speedup_env_path']:.1f}; "
                  f"{100 * row['fleet_vs_batch_route']:.0f}% of the batch route's {capacity:,.0f})",
                  flush=True)
    finally:
        stop_service(process)
    return rows


def batch_capacity(url: str, pid: int, sessions: int, duration_s: float) -> float:
    """Steps/s of ``/batch/step`` with ``sessions`` sessions from the raw client of env_server.py."""
    from http_load import run_http_cell

    port = int(url.rsplit(":", 1)[1])
    return run_http_cell(port, pid, "batch", "raw", sessions, 1, 0.5, duration_s, 0)["steps_per_s"]


def collector_table(rows: list[dict[str, Any]]) -> str:
    lines = [("| episodes | in-process env steps/s | per-session RemoteEnv (before) | EnvFleet batched (now) "
              "| now ÷ before | now ÷ batch route | batch route steps/s (64 sessions, raw client) "
              "| load avg |"),
             "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(
            f"| {r['episodes']} | {r['in-process']['env_steps_per_s']:,.0f} | "
            f"{r['per-session RemoteEnv (before)']['env_steps_per_s']:,.0f} | "
            f"{r['EnvFleet batched (now)']['env_steps_per_s']:,.0f} | {r['speedup_env_path']:.1f}× | "
            f"{100 * r['fleet_vs_batch_route']:.0f}% | {r['batch_route_steps_per_s']:,.0f} | {r['load']} |")
    return "\n".join(lines)


# --- 2. env-worker processes for a heavy env ----------------------------------------------------


def _drive_batches(url: str, env_id: str, sessions: int, duration_s: float,
                   seeds: int = 4) -> dict[str, float]:
    """Step ``sessions`` sessions through ``/batch/step`` (random admissible actions) for ``duration_s``."""
    import random

    from agentgym.http.client import EnvClient

    rng = random.Random(0)
    with EnvClient(url, timeout_s=600, retries=0) as client:
        ids = [client.request("POST", "/sessions", {"env_id": env_id})["session_id"] for _ in range(sessions)]
        resets = client.batch_reset([(sid, i % seeds, None) for i, sid in enumerate(ids)])
        actions = [r["info"].get("admissible_actions") or ["look"] for r in resets]
        steps = resets_done = 0
        started = time.perf_counter()
        while time.perf_counter() - started < duration_s:
            results = client.batch_step([(sid, rng.choice(acts))
                                         for sid, acts in zip(ids, actions, strict=True)])
            steps += len(results)
            done = [i for i, r in enumerate(results) if r["terminated"] or r["truncated"]]
            for i, r in enumerate(results):
                actions[i] = r["info"].get("admissible_actions") or ["look"]
            if done:
                again = client.batch_reset([(ids[i], rng.randrange(seeds), None) for i in done])
                for i, r in zip(done, again, strict=True):
                    actions[i] = r["info"].get("admissible_actions") or ["look"]
                resets_done += len(done)
        elapsed = time.perf_counter() - started
        for sid in ids:
            client.request("DELETE", f"/sessions/{sid}")
    return {"steps_per_s": steps / elapsed, "steps": steps, "resets": resets_done}


def tree_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) of ``pid`` and its children, from /proc (Linux)."""
    total = 0.0
    tick = os.sysconf("SC_CLK_TCK")
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(entry) == pid or int(fields[1]) == pid:
            total += (int(fields[11]) + int(fields[12])) / tick
    return total


def workers_curve(env_ids: Sequence[str], worker_counts: Sequence[int], sessions: int,
                  duration_s: float) -> list[dict[str, Any]]:
    """Steps/s of heavy envs served by 1, 2, ... env-worker processes."""
    rows = []
    for env_id in env_ids:
        base = None
        for workers in worker_counts:
            process, url = serve([env_id], "--workers", str(workers))
            try:
                _drive_batches(url, env_id, sessions, min(duration_s, 5.0))  # generates and loads the games
                cpu_before = tree_cpu_s(process.pid)
                row = {"env_id": env_id, "workers": workers, "sessions": sessions, "load": load(),
                       **_drive_batches(url, env_id, sessions, duration_s)}
                row["service_cpu_ms_per_step"] = 1e3 * (tree_cpu_s(process.pid) - cpu_before) / row["steps"]
            finally:
                stop_service(process)
            base = base or row["steps_per_s"]
            row["speedup"] = row["steps_per_s"] / base
            rows.append(row)
            print(f"  {env_id} workers={workers}: {row['steps_per_s']:,.1f} steps/s (x{row['speedup']:.2f})",
                  flush=True)
    return rows


def workers_table(rows: list[dict[str, Any]]) -> str:
    lines = ["| env | worker processes | sessions | steps/s | vs 1 worker | service CPU ms/step | load avg |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['env_id']} | {r['workers']} | {r['sessions']} | {r['steps_per_s']:,.1f} | "
              f"{r['speedup']:.2f}× | {r['service_cpu_ms_per_step']:.1f} | {r['load']} |" for r in rows]
    return "\n".join(lines)


# --- 3. a fleet of 2 services, one killed mid-run -----------------------------------------------


class _KillAt(RolloutHooks):
    def __init__(self, turn: int, pid: int | None) -> None:
        self.turn, self.pid, self.seen, self.killed_at = turn, pid, 0, None

    def after_turn(self, episodes: Any, context: Any) -> list[Any]:
        self.seen += 1
        if self.seen == self.turn and self.pid is not None:
            os.kill(self.pid, signal.SIGKILL)
            self.killed_at = time.perf_counter()
        return []


def fleet_kill(episodes: int, kill_turn: int = 5) -> list[dict[str, Any]]:
    """Collect ``episodes`` maze episodes on a fleet of 2 services, with and without killing one mid-run."""
    from agentgym.http.fleet import EnvFleet

    groups = episodes // 8
    seeds = list(range(groups))
    sampling = SamplingParams(max_new_tokens=8, seed=1)
    local = _collector(lambda: agentgym.make("maze-v0"))
    expected = [g.to_json() for g in local.collect(seeds, 8, sampling)]
    local.close()
    rows = []
    for kill in (False, True):
        services = [serve(["maze-v0"]), serve(["maze-v0"])]
        try:
            fleet = EnvFleet([url for _, url in services], "maze-v0", timeout_s=10, health_interval_s=600)
            hook = _KillAt(kill_turn, services[1][0].pid if kill else None)
            collector = _collector(fleet)
            started = time.perf_counter()
            got = [g.to_json() for g in collector.collect(seeds, 8, sampling, hooks=hook)]
            wall = time.perf_counter() - started
            recovered, replayed = fleet.recovered, fleet.replayed_steps
            collector.close()
        finally:
            for process, _ in services:
                stop_service(process)
        trajectories = sum(len(g["trajectories"]) for g in got)
        rows.append({"killed": kill, "episodes": episodes, "episodes_back": trajectories,
                     "lost": episodes - trajectories, "identical_to_local": got == expected,
                     "wall_s": wall, "moved": recovered, "replayed_steps": replayed, "load": load()})
        print(f"  fleet kill={kill}: {trajectories}/{episodes} episodes back, identical={got == expected}, "
              f"{wall:.2f} s, moved {recovered}", flush=True)
    return rows


def fleet_table(rows: list[dict[str, Any]]) -> str:
    lines = [("| run | episodes back | lost | identical to in-process | time to finish | episodes moved "
              "| steps replayed | load avg |"), "|---|---:|---:|---|---:|---:|---:|---:|"]
    for r in rows:
        run = "one service SIGKILLed after turn 5" if r["killed"] else "both services up"
        lines.append(f"| {run} | {r['episodes_back']}/{r['episodes']} | {r['lost']} | "
                     f"{r['identical_to_local']} | {r['wall_s']:.2f} s | {r['moved']} | "
                     f"{r['replayed_steps']} | {r['load']} |")
    return "\n".join(lines)


# --- entry point --------------------------------------------------------------------------------

SECTIONS = ("collector", "workers", "fleet", "ws", "clients")


def run_scale(sections: Sequence[str], *, episodes: Sequence[int], duration_s: float, out: Path,
              heavy_envs: Sequence[str] = ("alfworld-v0", "textworld-v0"),
              worker_counts: Sequence[int] = (1, 2), heavy_sessions: int = 8) -> int:
    """Run the named sections, print their tables, update ``out`` (JSON) with their results."""
    import json

    # Other sections' results stay.
    results: dict[str, Any] = json.loads(out.read_text()) if out.is_file() else {}
    results.update({"cpu_cores": os.cpu_count(), "load_average_start": load()})
    record = provenance()
    ran = [s for s in SECTIONS if s in sections]
    results["provenance"] = {**results.get("provenance", {}), **{section: record for section in ran}}
    tables = []
    if "collector" in sections:
        rows = collector_path(episodes, duration_s)
        results["collector"] = rows
        tables.append((("The trainer's collector path, maze-v0, instant policy (env steps/s = turns ÷ time "
                        "in env calls)"), collector_table(rows)))
    if "workers" in sections:
        rows = workers_curve(heavy_envs, worker_counts, heavy_sessions, duration_s)
        results["workers"] = rows
        tables.append((f"Heavy envs over --workers N ({heavy_sessions} sessions, one /batch/step each round)",
                       workers_table(rows)))
    if "fleet" in sections:
        rows = fleet_kill(64)
        results["fleet"] = rows
        tables.append(("A fleet of 2 maze-v0 services, the collector's path, one service killed mid-run",
                       fleet_table(rows)))
    if "ws" in sections or "clients" in sections:
        from env_scale_sockets import clients_table, compare_clients, compare_ws, ws_table

        if "ws" in sections:
            rows = compare_ws((16, 64), duration_s)
            results["ws"] = rows
            tables.append(("WebSocket, one step per message (server pinned to core 0, lean client on core 1)",
                           ws_table(rows)))
        if "clients" in sections:
            rows = compare_clients(64, duration_s)
            results["clients"] = rows
            tables.append((("Clients at 64 sessions, one step per request or message, against one agentgym "
                           "service"), clients_table(rows)))
    results["load_average_end"] = load()
    for title, table in tables:
        print(f"\n{title}; {os.cpu_count()} cores shared by clients and services\n\n{table}")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"\nwrote {out}")
    return 0
