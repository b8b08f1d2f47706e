"""Uniform task sampling against the learning-signal curriculum: groups without signal, and how fast training
reaches a success threshold.

    python benchmarks/curriculum.py                                  # maze and search-qa, seeds 0-2
    python benchmarks/curriculum.py --presets configs/quickstart_maze_grpo.yaml --seeds 3 --jobs 1
    python benchmarks/curriculum.py --iterations 2 --seeds 0 --presets configs/quickstart_maze_gigpo.yaml
    python benchmarks/curriculum.py --table                          # the runs recorded so far

Each run is ``agentgym train PRESET`` with ``rollout.task_sampler`` set to ``uniform`` or ``curriculum`` (the
curriculum's other settings as the preset has them, ``--set`` to change them), ``seed=S`` and
``--iterations``, in a process of its own with one torch thread (``--jobs`` at a time). Per run it records
the share of the groups collected that gave no learning signal (``rollout/zero_signal_groups``) per
iteration, the training success per iteration, the held-out success before and after RL, and the first
iteration where the training success (mean of the last 3 iterations) reaches the preset's threshold; with
``--eval-every N`` also the first held-out evaluation (every N iterations) that reaches it.

Results accumulate in ``benchmarks/results/curriculum.json``, one row per (preset, sampler, seed,
iterations, overrides) with the commit, command and machine that produced it (``provenance``); a run
already recorded is not run again, so the grid fills in across invocations.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Any

from provenance import REPO, child_run, provenance, run_child

RESULTS = Path(__file__).resolve().parent / "results" / "curriculum.json"
SAMPLERS = ("uniform", "curriculum")
#: preset → the training-success threshold (benchmarks/algorithms.py's for the same tasks)
THRESHOLDS: dict[str, float] = {
    "configs/quickstart_maze_gigpo.yaml": 0.8,
    "configs/search_qa_grpo_tiny.yaml": 0.5,
}
WINDOW = 3
"""Iterations the training success is averaged over before it is compared with the threshold."""


def first_reaching(rates: list[float], threshold: float, window: int = WINDOW) -> int | None:
    """The first iteration (1-based) where the mean of the last ``window`` rates reaches ``threshold``.

    Example:
        >>> first_reaching([0.2, 0.9, 0.9, 0.9], 0.8), first_reaching([0.2, 0.9], 0.8)
        (4, None)
    """
    for i in range(window - 1, len(rates)):
        if sum(rates[i - window + 1:i + 1]) / window >= threshold:
            return i + 1
    return None


def key(row: dict[str, Any]) -> tuple[Any, ...]:
    return row["preset"], row["sampler"], row["seed"], row["iterations"], tuple(row["set"])


def run_one(spec: dict[str, Any]) -> dict[str, Any]:
    """One training run, in this process; its row of results."""
    import torch

    from agentgym.training.config.loading import load_config
    from agentgym.training.run.loop import train

    torch.set_num_threads(1)
    overrides = [f"seed={spec['seed']}", f"iterations={spec['iterations']}", "checkpoint_every=0",
                 f"rollout.task_sampler={spec['sampler']}", *spec["set"]]
    if spec["eval_every"]:
        overrides.append(f"eval.every={spec['eval_every']}")
    cfg = load_config(REPO / spec["preset"], overrides)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as out:
        report = train(cfg, out)
    history = report["history"]
    evals = [(h["iteration"], h["eval/success_rate"]) for h in history if "eval/success_rate" in h]
    evals.append((report["iterations"], report["eval"]["after"]["success_rate"]))
    threshold = spec["threshold"]
    rates = [h["rollout/success_rate"] for h in history]
    return {
        **spec,
        "wall_s": round(time.perf_counter() - started, 1),
        "zero_signal": [h["rollout/zero_signal_groups"] for h in history],
        "success": rates,
        "before": report["eval"]["before"]["success_rate"],
        "after": report["eval"]["after"]["success_rate"],
        "iters_to_threshold": first_reaching(rates, threshold),
        "eval_iters_to_threshold": next((i for i, rate in evals if rate >= threshold), None),
    }


def launch(spec: dict[str, Any]) -> dict[str, Any]:
    """``run_one`` in a child process (one torch thread, its own memory)."""
    return run_child(__file__, spec, omp_threads="1")


def read_rows(path: Path) -> list[dict[str, Any]]:
    return json.loads(path.read_text())["rows"] if path.is_file() else []


def save(path: Path, row: dict[str, Any]) -> None:
    """Add ``row`` to the results file, re-reading it under a lock so concurrent invocations keep each
    other's rows."""
    path.parent.mkdir(exist_ok=True)
    with open(path, "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        fh.seek(0)
        text = fh.read()
        rows = [r for r in (json.loads(text)["rows"] if text.strip() else []) if key(r) != key(row)]
        fh.seek(0)
        fh.truncate()
        fh.write(json.dumps({"rows": [*rows, row]}, indent=1) + "\n")


def _mean_std(values: list[float], percent: bool = False) -> str:
    if not values:
        return "-"
    scale, unit = (100, "%") if percent else (1, "")
    mean = statistics.mean(values) * scale
    spread = statistics.stdev(values) * scale if len(values) > 1 else 0.0
    return f"{mean:.0f}{unit} ± {spread:.0f}{unit}" if percent else f"{mean:.1f} ± {spread:.1f}"


def table(rows: list[dict[str, Any]]) -> str:
    """One markdown line per (preset, sampler, iterations, overrides): means ± std over the seeds."""
    lines = ["| preset | sampler | iterations | seeds | zero-signal groups | iterations to threshold "
             "(training; held-out) | held-out before → after |",
             "|---|---|---:|---|---:|---|---|"]
    cells: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for row in sorted(rows, key=lambda r: (r["preset"], r["iterations"], SAMPLERS.index(r["sampler"]),
                                           r["seed"])):
        cell = (row["preset"], row["sampler"], row["iterations"], tuple(row["set"]))
        cells.setdefault(cell, []).append(row)
    for (preset, sampler, iterations, overrides), runs in cells.items():
        reach = ", ".join(f"{r['iters_to_threshold'] or '-'}; {r['eval_iters_to_threshold'] or '-'}"
                          for r in runs)
        name = Path(preset).stem + (f" ({' '.join(overrides)})" if overrides else "")
        lines.append(f"| {name} | {sampler} | {iterations} | {', '.join(str(r['seed']) for r in runs)} | "
                     f"{_mean_std([statistics.mean(r['zero_signal']) for r in runs], percent=True)} | "
                     f"{reach} (threshold {runs[0]['threshold']:.0%}) | "
                     f"{_mean_std([r['before'] for r in runs], percent=True)} → "
                     f"{_mean_std([r['after'] for r in runs], percent=True)} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--presets", nargs="+", default=list(THRESHOLDS), help="config files (from the repo)")
    parser.add_argument("--samplers", nargs="+", default=list(SAMPLERS), choices=SAMPLERS)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--iterations", type=int, default=30)
    parser.add_argument("--threshold", type=float, default=None,
                        help="success threshold for every preset (default: the preset's, else 0.5)")
    parser.add_argument("--eval-every", type=int, default=0, help="held-out evaluation every N iterations")
    parser.add_argument("--set", action="append", default=[], help="extra override for every run (key=value)")
    parser.add_argument("--jobs", type=int, default=2, help="runs at a time (one torch thread each)")
    parser.add_argument("--results", default=str(RESULTS), help="JSON file the rows accumulate in")
    parser.add_argument("--table", action="store_true", help="only print the recorded rows")
    args = child_run(parser, argv, run_one)
    if args is None:
        return
    argv = sys.argv[1:] if argv is None else argv
    results = Path(args.results)
    specs = [{"preset": preset, "sampler": sampler, "seed": seed, "iterations": args.iterations,
              "set": args.set, "eval_every": args.eval_every,
              "threshold": args.threshold if args.threshold is not None else THRESHOLDS.get(preset, 0.5)}
             for preset in args.presets for sampler in args.samplers for seed in args.seeds]
    if not args.table:
        done = {key(r) for r in read_rows(results)}
        todo = [s for s in specs if key(s) not in done]
        print(f"{len(specs) - len(todo)} of {len(specs)} runs already in {results.name}; running {len(todo)}",
              flush=True)
        with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
            futures = [pool.submit(launch, spec) for spec in todo]
            for future in as_completed(futures):
                try:
                    row = future.result()
                except RuntimeError as exc:  # one failed run is reported; the others still count
                    print(exc, file=sys.stderr, flush=True)
                    continue
                save(results, {**row, "provenance": provenance(argv, script=__file__)})
                print(f"{Path(row['preset']).stem} {row['sampler']} seed {row['seed']}: zero-signal "
                      f"{statistics.mean(row['zero_signal']):.0%}, held-out {row['before']:.0%} -> "
                      f"{row['after']:.0%} ({row['wall_s']:.0f} s)", flush=True)
    wanted = {key(s) for s in specs}
    rows = read_rows(results)
    print(table(rows if args.table else [r for r in rows if key(r) in wanted]))


if __name__ == "__main__":
    main()
