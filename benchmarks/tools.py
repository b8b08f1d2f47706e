"""Latency and throughput of the tool services: the code sandbox and BM25 retrieval.

    python benchmarks/tools.py [--duration-s 5] [--clients 1 8 32] [--backends bwrap subprocess docker]
                               [--docs 100000] [--skip-sandbox] [--skip-retrieval]

**Sandbox.** For each backend it starts ``agentgym sandbox serve --backend B`` as a separate process
(once with no warm pool, once with ``--pool-size 8``), then ``C`` concurrent clients each post
``POST /run`` back to back for ``--duration-s`` seconds. The program is a small computation
(``print(sum(i * i for i in range(10_000)))``), so the time is the sandbox's: process start-up,
isolation set-up, limits, teardown. A backend that cannot run here is listed with the reason.

**Retrieval.** It generates the synthetic corpus with ``--docs`` documents, builds the BM25 index
in a child process (wall time, peak RSS and its growth over the loaded corpus, size on disk), then
measures queries in-process (one thread) and through ``agentgym retrieval serve`` with ``C``
concurrent clients (one query per request, and 32 queries per request). Queries are the corpus's
questions in full ("In which country was the founder of Zorvex Labs born?"), the expensive kind:
every content word is a posting list to add, and words like "born" or "founder" occur in tens of
thousands of documents; in-process it also times entity-name queries (what the expert searches).

Client and services share this machine's cores; the table says how many there are. It prints
markdown tables and writes ``benchmarks/results/tools.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import platform
import random
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from env_server import HOST, start_server, stop_server
from provenance import provenance

from agentgym.service_kit.launcher import free_port

RESULTS = Path(__file__).resolve().parent / "results"
PROGRAM = "print(sum(i * i for i in range(10_000)))"
EXPECTED = f"{sum(i * i for i in range(10_000))}\n"


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile of ``values`` (not necessarily sorted), in the same unit."""
    ordered = sorted(values)
    return (ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered)) - 1))] if ordered
            else float("nan"))


async def drive(url: str, clients: int, duration_s: float, make_request: Any,
                warmup_s: float = 1.0) -> dict[str, Any]:
    """``clients`` loops posting ``make_request(rng)`` → (path, json, items) for ``duration_s`` after a
    warm-up."""
    latencies: list[float] = []
    counts = {"requests": 0, "items": 0, "busy": 0, "errors": 0}
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=60.0) as client:
        start = time.monotonic()
        measure_from, stop_at = start + warmup_s, start + warmup_s + duration_s

        async def loop(worker: int) -> None:
            rng = random.Random(worker)
            while (now := time.monotonic()) < stop_at:
                path, payload, items = make_request(rng)
                response = await client.post(path, json=payload)
                done = time.monotonic()
                if now < measure_from:
                    continue
                if response.status_code == 503:  # the service's concurrency cap: back off briefly
                    counts["busy"] += 1
                    await asyncio.sleep(0.01)
                    continue
                if response.status_code != 200:
                    counts["errors"] += 1
                    continue
                latencies.append((done - now) * 1000)
                counts["requests"] += 1
                counts["items"] += items

        await asyncio.gather(*(loop(worker) for worker in range(clients)))
    return {**counts, "per_s": counts["items"] / duration_s, "p50_ms": percentile(latencies, 50),
            "p99_ms": percentile(latencies, 99)}


# --- sandbox ------------------------------------------------------------------------------------


def sandbox_rows(backends: list[str], clients: list[int], duration_s: float) -> list[dict[str, Any]]:
    from agentgym.errors import ConfigError
    from agentgym.sandbox import default_backend

    rows: list[dict[str, Any]] = []
    for backend in backends:
        try:
            default_backend(backend)  # type: ignore[arg-type]
        except ConfigError as exc:
            rows.append({"backend": backend, "unavailable": str(exc)})
            continue
        for pool in (0, 8):
            port = free_port()
            command = [sys.executable, "-m", "agentgym", "sandbox", "serve", "--backend", backend,
                       "--host", HOST, "--port", str(port), "--pool-size", str(pool),
                       "--max-concurrency", str(max(clients))]
            server = start_server(command, port)
            try:
                url = f"http://{HOST}:{port}"
                check = httpx.post(f"{url}/run", json={"code": PROGRAM}, timeout=60).json()
                if check["stdout"] != EXPECTED:
                    raise RuntimeError(f"{backend}: unexpected sandbox output {check!r}")
                for count in clients:
                    cell = asyncio.run(drive(url, count, duration_s,
                                             lambda _rng: ("/run", {"code": PROGRAM}, 1)))
                    rows.append({"backend": backend, "pool": pool, "clients": count, **cell})
                    print(f"  sandbox {backend} pool={pool} clients={count}: {cell['per_s']:.1f} calls/s, "
                          f"p50 {cell['p50_ms']:.1f} ms", flush=True)
            finally:
                stop_server(server)
    return rows


def sandbox_table(rows: list[dict[str, Any]]) -> str:
    lines = ["| backend | warm pool | clients | calls/s | p50 ms | p99 ms | 503s |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for row in rows:
        if "unavailable" in row:
            lines.append(f"| {row['backend']} | — | — | unavailable: {row['unavailable'][:90]} | | | |")
        else:
            lines.append(f"| {row['backend']} | {row['pool']} | {row['clients']} | {row['per_s']:.1f} | "
                         f"{row['p50_ms']:.1f} | {row['p99_ms']:.1f} | {row['busy']} |")
    return "\n".join(lines)


# --- retrieval ----------------------------------------------------------------------------------


def _rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _build_child(corpus: str, out: str, queue: Any) -> None:
    from agentgym.retrieval.index import Index, read_corpus

    docs = read_corpus(corpus)
    loaded = _rss_mb()
    start = time.perf_counter()
    Index(docs).save(out)
    queue.put({"build_s": time.perf_counter() - start, "rss_loaded_mb": loaded,
               "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024})


def retrieval_rows(num_docs: int, clients: list[int], duration_s: float, workdir: Path) -> dict[str, Any]:
    from agentgym.retrieval.index import Index
    from agentgym.retrieval.synthetic import generate_corpus, write_jsonl

    start = time.perf_counter()
    docs, questions = generate_corpus(num_docs, seed=0)
    corpus, _ = write_jsonl(docs, questions, workdir)
    generate_s = time.perf_counter() - start
    queries = [q.question for q in questions]

    context = mp.get_context("spawn")
    queue = context.Queue()
    child = context.Process(target=_build_child, args=(str(corpus), str(workdir / "index"), queue))
    child.start()
    build = queue.get(timeout=1800)
    child.join()
    disk_mb = sum(f.stat().st_size for f in (workdir / "index").rglob("*") if f.is_file()) / 2**20
    summary: dict[str, Any] = {"docs": len(docs), "questions": len(queries), "generate_s": generate_s,
                               **build, "index_disk_mb": disk_mb}
    print(f"  retrieval: {len(docs):,} docs built in {build['build_s']:.1f} s, "
          f"peak RSS {build['peak_rss_mb']:.0f} MB", flush=True)

    index = Index.load(workdir / "index")
    rng = random.Random(0)
    entities = [name for q in questions for name in q.search_queries]
    rows = []
    for kind, pool in (("question", queries), ("entity name", entities)):
        sample = [rng.choice(pool) for _ in range(2000)]
        index.search(sample[:50], k=3)  # warm-up
        latencies = []
        start = time.perf_counter()
        for query in sample:
            begin = time.perf_counter()
            index.search([query], k=3)
            latencies.append((time.perf_counter() - begin) * 1000)
        elapsed = time.perf_counter() - start
        rows.append({"mode": "in-process", "query": kind, "clients": 1, "queries_per_request": 1,
                     "per_s": len(sample) / elapsed, "p50_ms": percentile(latencies, 50),
                     "p99_ms": percentile(latencies, 99)})
    del index

    port = free_port()
    server = start_server([sys.executable, "-m", "agentgym", "retrieval", "serve", str(workdir / "index"),
                           "--host", HOST, "--port", str(port)], port)
    try:
        url = f"http://{HOST}:{port}"
        for count, batch in [(c, 1) for c in clients] + [(1, 32)]:
            def request(local: random.Random, batch: int = batch) -> tuple[str, dict[str, Any], int]:
                return "/retrieve", {"queries": [local.choice(queries) for _ in range(batch)], "k": 3}, batch

            cell = asyncio.run(drive(url, count, duration_s, request))
            rows.append({"mode": "service", "query": "question", "clients": count,
                         "queries_per_request": batch, **cell})
            print(f"  retrieval service clients={count} batch={batch}: {cell['per_s']:.0f} q/s, "
                  f"p50 {cell['p50_ms']:.2f} ms", flush=True)
    finally:
        stop_server(server)
    return {"summary": summary, "rows": rows}


def retrieval_tables(result: dict[str, Any]) -> str:
    s = result["summary"]
    lines = [("| documents | generate s | index build s | build peak RSS MB "
              "| RSS growth over loaded corpus MB | index on disk MB |"),
             "|---:|---:|---:|---:|---:|---:|",
             (f"| {s['docs']:,} | {s['generate_s']:.1f} | {s['build_s']:.1f} | {s['peak_rss_mb']:.0f} | "
              f"{s['peak_rss_mb'] - s['rss_loaded_mb']:.0f} | {s['index_disk_mb']:.0f} |"), "",
             "| mode | query | clients | queries/request | queries/s | p50 ms | p99 ms |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for row in result["rows"]:
        lines.append(f"| {row['mode']} | {row['query']} | {row['clients']} | {row['queries_per_request']} | "
                     f"{row['per_s']:,.0f} | {row['p50_ms']:.2f} | {row['p99_ms']:.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration-s", type=float, default=5.0,
                        help="measured seconds per cell (after 1 s warm-up)")
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 8, 32],
                        help="concurrent clients per cell")
    parser.add_argument("--backends", nargs="+", default=["bwrap", "subprocess", "docker"],
                        help="sandbox backends")
    parser.add_argument("--docs", type=int, default=100_000, help="documents in the retrieval corpus")
    parser.add_argument("--skip-sandbox", action="store_true")
    parser.add_argument("--skip-retrieval", action="store_true")
    parser.add_argument("--out", type=Path, default=RESULTS / "tools.json")
    args = parser.parse_args(argv)

    machine = f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    print(f"# tool services on {machine} (clients and services share the cores)\n", flush=True)
    results: dict[str, Any] = {"machine": machine, "duration_s": args.duration_s}
    if args.out.is_file():  # a skipped part keeps its last measurement
        previous = json.loads(args.out.read_text())
        results.update({part: previous[part] for part in ("sandbox", "retrieval") if part in previous})
        results["provenance"] = {part: record for part, record in previous.get("provenance", {}).items()
                                 if part in results}
    record = provenance(argv, script=__file__)
    if not args.skip_sandbox:
        results["sandbox"] = sandbox_rows(args.backends, args.clients, args.duration_s)
        results.setdefault("provenance", {})["sandbox"] = record
    if not args.skip_retrieval:
        with tempfile.TemporaryDirectory(prefix="agentgym-bench-") as tmp:
            results["retrieval"] = retrieval_rows(args.docs, args.clients, args.duration_s, Path(tmp))
        results.setdefault("provenance", {})["retrieval"] = record
    if "sandbox" in results:
        print("\n## Code sandbox: POST /run\n\n" + sandbox_table(results["sandbox"]))
    if "retrieval" in results:
        print("\n## Retrieval: BM25 (bm25s)\n\n" + retrieval_tables(results["retrieval"]))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2))
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
