"""Property-based fuzzing of the services' OpenAPI contracts with schemathesis.

    python benchmarks/fuzz.py [--max-examples 100] [--max-time-s 120]
                              [--services env sandbox retrieval viewer policy]

For each service it starts the real thing as a separate process on 127.0.0.1 and a random port
(``agentgym serve`` with the built-in envs, ``agentgym sandbox serve`` on bwrap, else the
subprocess backend, ``agentgym retrieval serve`` over a small synthetic index, ``agentgym
view`` over a small evaluation of maze-v0, and ``agentgym serve-policy`` over a tiny model built
from its config), then runs
``schemathesis run URL/openapi.json --checks all`` (examples, coverage, fuzzing and stateful
phases) bounded by ``--max-examples`` per operation and ``--max-time-s`` per service. Every check
is on: no 5xx, status codes / content types / headers / bodies as the schema declares, invalid
data rejected, valid data accepted, ``Allow`` on 405, and so on.

One configuration differs from schemathesis's defaults: 413 counts as rejecting invalid data (a
body over the service's size limit is refused before it is parsed). It prints one row per service
(cases generated, unique failures and their kinds) and writes ``benchmarks/results/fuzz.json``
(the rows of services not run this time are kept from the previous file).
Needs the ``dev`` extra (schemathesis).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from provenance import provenance, stamp

from agentgym.service_kit.launcher import free_port, start_service, stop_service

HOST = "127.0.0.1"
RESULTS = Path(__file__).resolve().parent / "results"
AGENTGYM = [sys.executable, "-m", "agentgym"]


def service_commands(workdir: Path) -> dict[str, list[str]]:
    """The command line of each service (the port is appended)."""
    from agentgym.sandbox import BwrapBackend

    subprocess.run([*AGENTGYM, "retrieval", "synthetic", str(workdir / "corpus"), "--entities", "100"],
                   check=True, capture_output=True)
    subprocess.run([*AGENTGYM, "retrieval", "index", str(workdir / "corpus" / "corpus.jsonl"), "--out",
                    str(workdir / "index")], check=True, capture_output=True)
    backend = "bwrap" if BwrapBackend.available() else "subprocess"
    return {
        "env": [*AGENTGYM, "serve", "maze-v0", "wordle-v0", "--step-timeout-s", "10", "--host", HOST],
        "sandbox": [*AGENTGYM, "sandbox", "serve", "--backend", backend, "--pool-size", "2",
                    "--max-concurrency", "8", "--host", HOST],
        "retrieval": [*AGENTGYM, "retrieval", "serve", str(workdir / "index"), "--host", HOST],
        "viewer": viewer_command(workdir),
        "policy": policy_command(workdir),
    }


def viewer_command(workdir: Path) -> list[str]:
    """``agentgym view`` over a small real evaluation (random and expert on maze-v0, four tasks)."""
    subprocess.run([*AGENTGYM, "eval", "--policy", "random", "--policy", "expert", "--envs", "maze-v0",
                    "--episodes", "4", "--out", str(workdir / "eval")], check=True, capture_output=True)
    return [*AGENTGYM, "view", str(workdir / "eval"), "--host", HOST]


def policy_command(workdir: Path) -> list[str]:
    """``agentgym serve-policy`` over a one-layer tiny model (built from its config, no download), on CPU,
    answering at most 8 new tokens per request so that thousands of generated requests stay quick."""
    from agentgym.backends.tiny import TinyModelConfig, build_tiny_model, save_tiny

    save_tiny(*build_tiny_model(TinyModelConfig(num_layers=1, hidden_size=32, intermediate_size=64)),
              workdir / "model")
    return [*AGENTGYM, "serve-policy", str(workdir / "model"), "--device", "cpu", "--max-new-tokens", "8",
            "--host", HOST]


#: Schemathesis's configuration: a body over the service's size limit is rejected with 413, which
#: its negative-data check does not count as a rejection by default.
CONFIG = """
[checks.negative_data_rejection]
expected-statuses = ["400", "401", "403", "404", "405", "406", "409", "413", "415", "422", "428", "429",
                     "5xx"]
"""


def parse_summary(text: str) -> dict[str, Any]:
    """Cases generated and the failures (``ST201 Schema-violating request accepted: 1``...) from the
    summary."""
    plain = re.sub(r"\x1b\[[0-9;]*m", "", text)
    counts: dict[str, Any] = {"generated": 0, "failed": 0}
    match = re.search(r"Test cases:\s*\n\s*(.+)", plain)
    if match:
        line = match.group(1)
        generated = re.search(r"(\d+) generated", line)
        counts["generated"] = int(generated.group(1)) if generated else 0
        found = re.search(r"found (\d+) unique failure", line)
        counts["failed"] = int(found.group(1)) if found else 0
    section = re.search(r"Failures:[ \t]*\n((?:[ \t]+\S.*\n)+)", plain)
    counts["failures"] = [line.strip(" ❌") for line in section.group(1).splitlines()] if section else []
    last = [line for line in plain.splitlines()
            if line.startswith("=") and ("found" in line or "failure" in line)]
    counts["verdict"] = last[-1].strip("= ") if last else ""
    return counts


def fuzz(name: str, command: list[str], args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    port = free_port()
    url = f"http://{HOST}:{port}"
    process = start_service([*command, "--port", str(port)], url, timeout_s=60,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    config = workdir / "schemathesis.toml"
    config.write_text(CONFIG)
    started = time.monotonic()
    try:
        run = subprocess.run(
            [str(Path(sys.executable).with_name("schemathesis")), "--config-file", str(config), "run",
             f"{url}/openapi.json", "--checks", "all", "--max-examples", str(args.max_examples),
             "--max-time", str(args.max_time_s), "--workers", "1", "--no-color"],
            check=False, capture_output=True, text=True, timeout=args.max_time_s + 300, cwd=workdir)
    finally:
        alive = process.poll() is None
        stop_service(process)
    summary = parse_summary(run.stdout + run.stderr)
    summary.update(service=name, seconds=round(time.monotonic() - started, 1), exit_code=run.returncode,
                   service_survived=alive)
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--max-examples", type=int, default=100, help="examples per operation and phase")
    parser.add_argument("--max-time-s", type=int, default=120, help="time budget per service")
    parser.add_argument("--services", nargs="+", default=["env", "sandbox", "retrieval", "viewer", "policy"])
    args = parser.parse_args()
    if shutil.which("schemathesis", path=str(Path(sys.executable).parent)) is None:
        sys.exit("schemathesis is not installed: pip install -e '.[dev]'")
    RESULTS.mkdir(exist_ok=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="agentgym-fuzz-") as tmp:
        commands = service_commands(Path(tmp))
        for name in args.services:
            rows.append(fuzz(name, commands[name], args, Path(tmp)))
            row = rows[-1]
            print(f"{name}: {row['generated']} cases, {row['failed']} failures ({row['seconds']} s) "
                  f"{row['verdict']}", flush=True)
    print("\n| service | cases | unique failures | service alive after | failures |")
    print("|---|---:|---:|---|---|")
    for row in rows:
        print(f"| {row['service']} | {row['generated']} | {row['failed']} | "
              f"{'yes' if row['service_survived'] else 'NO'} | {'; '.join(row['failures']) or '-'} |")
    saved = RESULTS / "fuzz.json"
    previous = json.loads(saved.read_text()).get("services", []) if saved.is_file() else []
    ran = {row["service"] for row in rows}
    kept = [row for row in previous if row.get("service") not in ran]
    saved.write_text(json.dumps({"max_examples": args.max_examples,
                                 "services": kept + stamp(rows, provenance())}, indent=2))


if __name__ == "__main__":
    main()
