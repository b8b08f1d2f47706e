"""Throughput and latency of the env service (``agentgym serve``) on ``maze-v0``.

    python benchmarks/env_server.py [--sessions 1 16 64] [--duration-s 5]
                                    [--out benchmarks/results/env_server.json]

For each number of concurrent sessions it measures steps/s and p50/p99 latency of

* ``single``: one step per HTTP request (``POST /sessions/{id}/step``), one keep-alive connection
  per session, every session stepping as fast as its answers come back;
* ``batch``: every session's step in one ``POST /batch/step`` (steps/s counts items; latency is
  per batch request);
* ``inproc``: ``agentgym.make("maze-v0").step`` in this process, for reference.

HTTP modes run twice: with ``raw``, a minimal asyncio HTTP/1.1 client (hand-built request bytes,
Content-Length framing, keep-alive) that costs a few tens of microseconds per request, so the
numbers measure the server; and with ``httpx`` (``agentgym.http.client.AsyncEnvClient``), what a
user's client gets (httpx's API over ``agentgym.service_kit.transport.LeanAsyncTransport``: about a
hundred microseconds of client CPU per request, where httpx's own transport spent ~1 ms). The
server is a separate process (``python -m agentgym serve``), so it does not share a GIL with the
load generator -- but it does share the machine's cores, which the output states.

Actions are drawn with a seeded RNG from ``info["admissible_actions"]``. An episode ends when the
goal is reached or after 50 turns; its session is then reset (``/reset`` or ``/batch/reset``).
Resets are not counted as steps and their latency is not sampled, but their time is inside the
measured window, so steps/s is net of reset traffic.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from http_load import ENV_ID, HOST, install_uvloop, run_http_cell, run_inproc_cell
from provenance import provenance

from agentgym.service_kit.launcher import free_port, start_service, stop_service

RESULTS = Path(__file__).resolve().parent / "results"


def server_command(port: int, max_sessions: int, workers: int | None, custom: str | None) -> list[str]:
    if custom:  # A/B runs of a modified server: a command line with {port} and {python} in it
        return shlex.split(custom.format(port=port, python=sys.executable))
    command = [sys.executable, "-m", "agentgym", "serve", ENV_ID, "--host", HOST, "--port", str(port),
               "--max-sessions", str(max_sessions), "--log-level", "warning"]
    if workers is not None:
        command += ["--threads", str(workers)]
    return command


def start_server(command: list[str], port: int) -> subprocess.Popen[bytes]:
    """``command`` started, and healthy at ``http://HOST:port``; stop it with ``stop_server``."""
    return start_service(command, f"http://{HOST}:{port}")


stop_server = stop_service


# --- output -------------------------------------------------------------------------------------


def _ms(value: float) -> str:
    return (f"{value:.1f}" if value >= 10 else f"{value:.2f}" if value >= 1
            else f"{value:.3f}" if value >= 0.01 else f"{value:.4f}")


def markdown_table(rows: list[dict[str, Any]]) -> str:
    header = ("| mode | client | sessions | steps/s | p50 ms | p99 ms | server CPU % | client CPU % "
              "| server CPU µs/step |")
    lines = [header,
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        client = r["client"] + (f" x{r['client_procs']}" if r["client_procs"] > 1 else "")
        server = "-" if r["server_cpu_pct"] is None else f"{r['server_cpu_pct']:.0f}"
        per_step = "-" if r["server_cpu_us_per_step"] is None else f"{r['server_cpu_us_per_step']:.0f}"
        lines.append(
            f"| {r['mode']} | {client} | {r['sessions']} | {r['steps_per_s']:,.0f} | {_ms(r['p50_ms'])} | "
            f"{_ms(r['p99_ms'])} | {server} | {r['client_cpu_pct']:.0f} | {per_step} |"
        )
    return "\n".join(lines)


def plot(rows: list[dict[str, Any]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.8))
    series: dict[str, list[tuple[int, float]]] = {}
    for r in rows:
        label = r["mode"] if r["mode"] == "inproc" else f"{r['mode']} / {r['client']}"
        series.setdefault(label, []).append((r["sessions"], r["steps_per_s"]))
    for label, points in series.items():
        points.sort()
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=label)
    ax.axhline(20_000, color="grey", ls="--", lw=0.8)
    ax.axhline(2_500, color="grey", ls=":", lw=0.8)
    ax.text(1, 20_000, " target: batch", va="bottom", fontsize=8, color="grey")
    ax.text(1, 2_500, " target: single @64", va="bottom", fontsize=8, color="grey")
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted({r["sessions"] for r in rows}),
                  [str(n) for n in sorted({r["sessions"] for r in rows})])
    ax.set_yscale("log")
    ax.set_xlabel("concurrent sessions")
    ax.set_ylabel("steps/s")
    ax.set_title(title, fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# --- main ---------------------------------------------------------------------------------------


#: Client CPU (% of one core) above which a raw single-step cell is repeated from two client
#: processes: the client, not the server, may then be the limit.
CLIENT_SATURATED_PCT = 80.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", type=int, nargs="+", default=[1, 16, 64],
                        help="concurrent sessions per cell")
    parser.add_argument("--duration-s", type=float, default=5.0, help="measured seconds per cell")
    parser.add_argument("--warmup-s", type=float, default=1.0, help="unmeasured seconds before each cell")
    parser.add_argument("--modes", nargs="+", default=["single", "batch", "inproc"],
                        choices=["single", "batch", "inproc"])
    parser.add_argument("--clients", nargs="+", default=["raw", "httpx"], choices=["raw", "httpx"])
    parser.add_argument("--raw-procs", default="auto",
                        help="client processes for the raw client in single mode: a number, or auto (1; the "
                             "cell is repeated with 2 when the client used over "
                             f"{CLIENT_SATURATED_PCT:g}%% of a core)")
    parser.add_argument("--server-workers", type=int, default=None,
                        help="--threads of the served app (threads running env code); default: the server's")
    parser.add_argument("--server-cmd", default=None,
                        help="serve with this command instead (A/B runs of a modified server); {port} and "
                             "{python} are filled in, e.g. '{python} my_server.py --port {port}'")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=RESULTS / "env_server.json",
                        help="JSON results; the PNG goes beside it")
    parser.add_argument("--note", default="",
                        help="free text stored with the results (e.g. 'measured under load')")
    parser.add_argument("--scale", nargs="+", default=None, metavar="SECTION",
                        help="run the scale sections instead (benchmarks/env_scale.py): collector, workers, "
                             "fleet, ws, clients; results go to results/env_scale.json")
    parser.add_argument("--episodes", type=int, nargs="+", default=[16, 64, 256],
                        help="--scale collector: episodes per collection")
    parser.add_argument("--heavy-envs", nargs="+", default=["alfworld-v0", "textworld-v0"],
                        help="--scale workers: the envs served with --workers 1 and 2")
    args = parser.parse_args(argv)
    if args.scale:
        from env_scale import run_scale

        return run_scale(args.scale, episodes=args.episodes, duration_s=args.duration_s,
                         out=RESULTS / "env_scale.json", heavy_envs=args.heavy_envs)

    import agentgym

    cores = os.cpu_count() or 1
    uvloop_ok = install_uvloop()
    asyncio.set_event_loop_policy(None)  # the parent runs no loop; forked clients install their own
    shared = (f"client and server share this machine's {cores} CPU cores" if cores <= 4
              else f"{cores} CPU cores")
    print(f"agentgym {agentgym.__version__}, Python {platform.python_version()}, {shared}; "
          f"load average at start {os.getloadavg()[0]:.2f}; "
          f"client loop: {'uvloop' if uvloop_ok else 'asyncio'}", flush=True)

    started = time.monotonic()
    load_start = os.getloadavg()[0]
    rows: list[dict[str, Any]] = []
    http_modes = [m for m in args.modes if m != "inproc"]
    if http_modes:
        port = free_port()
        command = server_command(port, 512, args.server_workers, args.server_cmd)
        server = start_server(command, port)
        try:
            for mode in http_modes:
                for client in args.clients:
                    for n in args.sessions:
                        tries = [1]
                        if client == "raw" and mode == "single":
                            tries = [1, 2] if args.raw_procs == "auto" else [int(args.raw_procs)]
                        for procs in tries:
                            if procs > 1 and args.raw_procs == "auto" and (
                                    n < 2 or rows[-1]["client_cpu_pct"] < CLIENT_SATURATED_PCT):
                                break
                            row = run_http_cell(port, server.pid, mode, client, n, procs,
                                                args.warmup_s, args.duration_s, args.seed)
                            rows.append(row)
                            print(f"  {mode:6} {client:5} x{row['client_procs']} sessions={n:<3} "
                                  f"{row['steps_per_s']:>9,.0f} steps/s  p50 {row['p50_ms']:.3f} ms  "
                                  f"p99 {row['p99_ms']:.3f} ms  server CPU {row['server_cpu_pct']:.0f}%  "
                                  f"client CPU {row['client_cpu_pct']:.0f}%  "
                                  f"server {row['server_cpu_us_per_step'] or 0:.0f} µs CPU/step", flush=True)
        finally:
            stop_server(server)
    if "inproc" in args.modes:
        for n in args.sessions:
            row = run_inproc_cell(n, args.warmup_s, args.duration_s, args.seed)
            rows.append(row)
            print(f"  inproc        sessions={n:<3} {row['steps_per_s']:>9,.0f} steps/s  "
                  f"p50 {row['p50_ms']:.4f} ms  p99 {row['p99_ms']:.4f} ms", flush=True)

    load_end = os.getloadavg()[0]
    meta = {
        "env_id": ENV_ID, "agentgym_version": agentgym.__version__, "python": platform.python_version(),
        "platform": platform.platform(), "cpu_cores": cores,
        "client_loop": "uvloop" if uvloop_ok else "asyncio",
        "server_command": " ".join(server_command(0, 512, args.server_workers, args.server_cmd)).replace(
            "--port 0", "--port <free>") if http_modes else None,
        "duration_s": args.duration_s, "warmup_s": args.warmup_s, "seed": args.seed,
        "load_average_start": load_start, "load_average_end": load_end, "wall_s": time.monotonic() - started,
        "note": args.note, "provenance": provenance(argv, script=__file__),
        "notes": [
            (f"client and server processes share the same {cores} CPU cores" if cores <= 4
             else f"{cores} cores"),
            "steps/s counts steps only; resets (on terminated/truncated) are extra requests inside the "
            "window",
            "batch: latency is per /batch/step request carrying every session's step",
            "raw: minimal asyncio HTTP/1.1 client; httpx: agentgym.http.client.AsyncEnvClient",
            "client_procs > 1: the load came from that many forked processes; latency samples merged",
        ],
    }
    table = markdown_table(rows)
    print()
    print(f"maze-v0 env service, {shared}" + (f" ({args.note})" if args.note else ""))
    print()
    print(table)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"meta": meta, "results": rows}, indent=2) + "\n")
    png = args.out.with_suffix(".png")
    plot(rows, png, f"agentgym serve {ENV_ID}: steps/s ({shared})" + (f"\n{args.note}" if args.note else ""))
    print(f"\nwrote {args.out} and {png} in {meta['wall_s']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
