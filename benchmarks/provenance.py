"""Where a benchmark result came from: the commit, the command line and the machine (``provenance``).

Every script that writes ``benchmarks/results/*.json`` records ``provenance()`` with its results (per
run, and on each row or section it merges into rows kept from earlier runs), so a number can be traced
to the code and hardware that produced it.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def commit() -> str:
    """``git rev-parse HEAD`` of the checkout, with ``+dirty`` when tracked files have changes; ``unknown``
    outside git."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True,
                              timeout=30, check=True).stdout.strip()
        changes = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                                 capture_output=True, text=True, timeout=30, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head + ("+dirty" if changes else "")


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _ram_gib() -> float | None:
    try:
        return round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (ValueError, OSError, AttributeError):
        return None


def _torch() -> tuple[str | None, list[str]]:
    """torch's version and the GPUs it sees; (None, []) where torch is not installed (env-only benchmarks)."""
    try:
        import torch
    except ImportError:
        return None, []
    gpus = ([torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
            if torch.cuda.is_available() else [])
    return torch.__version__, gpus


def machine() -> dict[str, Any]:
    """Cores, CPU model, RAM, GPUs, Python and torch versions of this machine."""
    torch_version, gpus = _torch()
    return {"cpu_cores": os.cpu_count(), "cpu_model": _cpu_model(), "ram_gib": _ram_gib(), "gpus": gpus,
            "python": platform.python_version(), "torch": torch_version, "platform": platform.platform()}


def provenance(args: list[str] | None = None, *, script: str | None = None) -> dict[str, Any]:
    """The commit, the exact command line and the machine, with the time (UTC).

    Args:
        args: the script's arguments (a ``main(argv)`` called with a list); None: ``sys.argv[1:]``.
        script: the script's path; None: ``sys.argv[0]``.

    Example:
        >>> record = provenance(["--episodes", "2"], script="benchmarks/envs.py")
        >>> record["command"].endswith("benchmarks/envs.py --episodes 2"), sorted(record)
        (True, ['command', 'commit', 'machine', 'recorded_at'])
    """
    command = [sys.executable, script or sys.argv[0], *(sys.argv[1:] if args is None else args)]
    return {"commit": commit(), "command": shlex.join(command), "machine": machine(),
            "recorded_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}


#: What a record of a result saved before provenance existed holds instead of commit, command and machine.
BEFORE_PROVENANCE = ("recorded_before_provenance", "added_in_commit", "last_changed_in_commit")


def is_record(record: Any) -> bool:
    """Whether ``record`` says where a result came from: commit, command and machine, or the mark of a
    result recorded before provenance existed (``BEFORE_PROVENANCE``: the commits where git first and last
    saw it)."""
    if not isinstance(record, dict):
        return False
    if all(record.get(key) for key in ("commit", "command", "machine")):
        return True
    return record.get("recorded_before_provenance") is True and all(record.get(k) for k in BEFORE_PROVENANCE)


def unrecorded(results: Any) -> list[str]:
    """Where a results file's data lacks provenance (empty: every result carries it).

    A file is traced when its top-level ``provenance`` (or ``meta.provenance``) is a record, or a dict of one
    record per section it holds (``env_scale.py``, ``tools.py``); otherwise each row of its row list (the
    file itself, ``rows``, ``runs`` or ``services``) must carry one.

    Example:
        >>> record = {"commit": "abc", "command": "python benchmarks/envs.py", "machine": {"cpu_cores": 2}}
        >>> unrecorded({"rows": [{"x": 1, "provenance": record}]}), unrecorded({"provenance": record})
        ([], [])
        >>> unrecorded({"rows": [{"x": 1}], "note": "no provenance"})
        ['rows[0]']
        >>> unrecorded({"fleet": [1], "ws": [2], "provenance": {"fleet": record}})
        ['provenance.ws']
    """
    if isinstance(results, dict):
        meta = results.get("meta") if isinstance(results.get("meta"), dict) else {}
        top = results.get("provenance", meta.get("provenance"))
        if is_record(top):
            return []
        if isinstance(top, dict) and top and all(isinstance(v, dict) for v in top.values()):
            # one record per section; every section of the results needs one
            sections = {k for k, v in results.items()
                        if isinstance(v, (list, dict)) and k not in ("provenance", "meta")}
            return [f"provenance.{part}" for part in sorted({*top, *sections})
                    if not is_record(top.get(part))]
        for name in ("rows", "runs", "services"):
            if isinstance(results.get(name), list):
                return [f"{name}[{i}]" for i, row in enumerate(results[name])
                        if not (isinstance(row, dict) and is_record(row.get("provenance")))]
        return ["provenance"]
    if isinstance(results, list):
        return [f"[{i}]" for i, row in enumerate(results)
                if not (isinstance(row, dict) and is_record(row.get("provenance")))]
    return ["(not a JSON object or list)"]


def stamp(rows: list[dict[str, Any]], record: dict[str, Any]) -> list[dict[str, Any]]:
    """``rows`` each carrying ``record`` under ``provenance`` (for files that keep rows of earlier runs)."""
    return [{**row, "provenance": record} for row in rows]


def child_run(parser: Any, argv: list[str] | None, run_one: Any) -> Any:
    """Parse ``argv`` with ``parser`` (which gains the hidden ``--run-one SPEC``). In a child started by
    ``run_child``, run ``run_one(SPEC)``, print its JSON and return None; otherwise return the arguments."""
    parser.add_argument("--run-one", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.run_one:
        print(json.dumps(run_one(json.loads(args.run_one))))
        return None
    return args


def run_child(script: str | Path, spec: dict[str, Any], *, omp_threads: str | None = None) -> dict[str, Any]:
    """``python SCRIPT --run-one SPEC`` in a child process (its own torch, threads and memory accounting),
    from the repository root; returns the JSON of its last line of output.

    Args:
        omp_threads: ``OMP_NUM_THREADS`` for the child: a number, ``""`` to leave it unset, None to inherit.

    Raises:
        RuntimeError: the child failed (with the end of its stderr).
    """
    env = dict(os.environ)
    if omp_threads == "":
        env.pop("OMP_NUM_THREADS", None)
    elif omp_threads is not None:
        env["OMP_NUM_THREADS"] = omp_threads
    done = subprocess.run([sys.executable, str(script), "--run-one", json.dumps(spec)], capture_output=True,
                          text=True, cwd=REPO, check=False, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"run {spec} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def timed_training(config: str | Path, overrides: list[str], keys: list[str]) -> dict[str, float]:
    """Train ``config`` with ``overrides`` in a temporary run folder (in this process); the mean of each
    metric in ``keys`` over the iterations after the first, which warms up, keyed by the name after its
    ``/`` (``perf/update_s`` -> ``update_s``; a metric an iteration lacks counts as 0)."""
    from agentgym.training.config.loading import load_config
    from agentgym.training.run.loop import train

    cfg = load_config(REPO / config, overrides)
    with tempfile.TemporaryDirectory() as out:
        history = train(cfg, out)["history"][1:]
    return {key.split("/", 1)[1]: statistics.mean(h.get(key, 0.0) for h in history) for key in keys}


def measured_child(script: str | Path, spec: dict[str, Any], *, omp_threads: str | None,
                   note: str) -> dict[str, Any]:
    """``run_child`` of ``spec`` as one benchmark row: the spec, its timings, the load average before it,
    its wall time and ``note`` (what else ran on the machine)."""
    load = os.getloadavg()[0]
    started = time.perf_counter()
    timings = run_child(script, spec, omp_threads=omp_threads)
    return {**spec, **timings, "load_before": round(load, 2),
            "run_s": round(time.perf_counter() - started, 1), "note": note}
