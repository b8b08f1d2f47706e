"""What the viewer shows, read from a folder: an evaluation (``agentgym eval --out``) or a training
run (``agentgym train --out``), as one list of episodes with a uniform shape.

An episode summary is ``{id, env, policy, iteration, task_index, sample, seed, task_id, success,
return, turns}``; a full episode adds ``observation`` (the first one) and per turn ``prompt``,
``response``, ``action``, ``observation``, ``reward``, ``state_key``, ``invalid``, ``tool_calls``,
``advantage`` (when the run recorded one in the turn's extras) and ``info``. Training runs store
token ids; their text is decoded with the run's tokenizer when an episode is opened.
"""

from __future__ import annotations

import json
import re
from functools import cached_property
from pathlib import Path
from typing import Any

from agentgym.errors import ConfigError
from agentgym.eval.store import PLAN, EvalStore

_ITERATION = re.compile(r"iter_(\d+)\.jsonl$")


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


class RunFolder:
    """The episodes, results and learning curves of one folder.

    Raises:
        ConfigError: the folder is neither an evaluation nor a training run.

    Example:
        >>> RunFolder("/nonexistent")
        Traceback (most recent call last):
        ...
        agentgym.errors.ConfigError: /nonexistent is not a folder; pass the --out folder of `agentgym eval` or `agentgym train`
    """

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        if not self.root.is_dir():
            raise ConfigError(f"{self.root} is not a folder; pass the --out folder of `agentgym eval` or `agentgym train`")
        if (self.root / PLAN).is_file():
            self.kind = "eval"
        elif (self.root / "config.json").is_file() and (self.root / "trajectories").is_dir():
            self.kind = "train"
        else:
            raise ConfigError(f"{self.root} holds neither an evaluation (plan.json) nor a training run "
                              "(config.json and trajectories/); pass the --out folder of `agentgym eval` or "
                              "`agentgym train`")
        self._full: dict[str, dict[str, Any]] = {}
        self._summaries = self._load()

    # --- loading ----------------------------------------------------------------------------------

    def _load(self) -> list[dict[str, Any]]:
        summaries = []
        if self.kind == "eval":
            plan = json.loads((self.root / PLAN).read_text())
            store = EvalStore(self.root)
            for env in plan["envs"]:
                for policy in plan["policies"]:
                    for r in store.records(env["id"], policy["name"]):
                        eid = f"{r['env']}|{r['policy']}|{r['task_index']}|{r['sample']}"
                        self._full[eid] = r
                        summaries.append(self._summary(eid, r, None))
            return summaries
        config = json.loads((self.root / "config.json").read_text())
        env = config.get("env", {}).get("id", "?")
        policy = config.get("algorithm", {}).get("name", "train")
        files = sorted((self.root / "trajectories").glob("iter_*.jsonl"))
        for path in files:
            iteration = int(_ITERATION.search(path.name).group(1))  # type: ignore[union-attr]
            for task_index, line in enumerate(path.read_text().splitlines()):
                try:
                    group = json.loads(line)
                except ValueError:
                    continue
                for sample, t in enumerate(group.get("trajectories", [])):
                    eid = f"{iteration}|{group['group_id']}|{t.get('trajectory_id') or sample}"
                    record = {"env": env, "policy": policy, "task_index": task_index, "sample": sample,
                              "seed": t.get("seed"), "task_id": t.get("task_id"), "success": bool(t.get("success")),
                              "return": sum(float(x["reward"]) for x in t["turns"]), "truncated": t.get("truncated"),
                              "num_turns": len(t["turns"]), "observation": None, "token_turns": t["turns"]}
                    self._full[eid] = record
                    summaries.append(self._summary(eid, record, iteration))
        return summaries

    @staticmethod
    def _summary(eid: str, r: dict[str, Any], iteration: int | None) -> dict[str, Any]:
        r["iteration"] = iteration
        return {"id": eid, "env": r["env"], "policy": r["policy"], "iteration": iteration,
                "task_index": r["task_index"], "sample": r["sample"], "seed": r["seed"], "task_id": r["task_id"],
                "success": bool(r["success"]), "return": float(r["return"]), "turns": int(r["num_turns"])}

    @cached_property
    def tokenizer(self) -> Any:
        """The training run's tokenizer (its saved model's, else the one its config builds)."""
        saved = self.root / "model"
        if (saved / "tokenizer_config.json").is_file() or (saved / "tokenizer.json").is_file():
            from transformers import AutoTokenizer

            return AutoTokenizer.from_pretrained(saved, local_files_only=True)
        model = json.loads((self.root / "config.json").read_text()).get("model", {})
        if model.get("path"):
            from transformers import AutoTokenizer

            return AutoTokenizer.from_pretrained(model["path"], local_files_only=True)
        from agentgym.backends.tiny import ByteTokenizer

        return ByteTokenizer()

    # --- queries ----------------------------------------------------------------------------------

    def meta(self) -> dict[str, Any]:
        """Title, kind, filter choices, results (evaluations) and learning curves (training runs)."""
        envs = sorted({s["env"] for s in self._summaries})
        policies = list(dict.fromkeys(s["policy"] for s in self._summaries))
        iterations = sorted({s["iteration"] for s in self._summaries if s["iteration"] is not None})
        meta: dict[str, Any] = {"kind": self.kind, "title": self.root.resolve().name, "envs": envs,
                                "policies": policies, "iterations": iterations, "episodes": len(self._summaries),
                                "results": [], "comparisons": [], "curves": {}, "evals": None}
        results = self.root / "results.json"
        if self.kind == "eval" and results.is_file():
            data = json.loads(results.read_text())
            meta["results"], meta["comparisons"] = data.get("results", []), data.get("comparisons", [])
        if self.kind == "train":
            meta["curves"] = self._curves()
            report = self.root / "report.json"
            if report.is_file():
                evals = json.loads(report.read_text()).get("eval", {})
                meta["evals"] = {k: v["success_rate"] for k, v in evals.items() if isinstance(v, dict)}
        return meta

    def _curves(self) -> dict[str, list[list[float]]]:
        path = self.root / "metrics.jsonl"
        curves: dict[str, list[list[float]]] = {}
        if not path.is_file():
            return curves
        for line in path.read_text().splitlines():
            try:
                metrics = json.loads(line)
            except ValueError:
                continue
            step = _number(metrics.get("iteration"))
            if step is None:
                continue
            for key, value in metrics.items():
                number = _number(value)
                if key != "iteration" and number is not None:
                    curves.setdefault(key, []).append([step, number])
        return curves

    def episodes(self, *, env: str | None = None, policy: str | None = None, success: bool | None = None,
                 iteration: int | None = None, task_index: int | None = None) -> list[dict[str, Any]]:
        """Episode summaries matching every given filter."""
        return [s for s in self._summaries
                if (env is None or s["env"] == env) and (policy is None or s["policy"] == policy)
                and (success is None or s["success"] == success)
                and (iteration is None or s["iteration"] == iteration)
                and (task_index is None or s["task_index"] == task_index)]

    def episode(self, eid: str) -> dict[str, Any] | None:
        """One full episode, or None for an unknown id."""
        record = self._full.get(eid)
        if record is None:
            return None
        head = self._summary(eid, record, record.get("iteration"))
        if "token_turns" not in record:
            turns = [{**t, "advantage": None} for t in record["turns"]]
            return {**head, "observation": record.get("observation"), "info": record.get("info"), "turns": turns}
        tokenizer = self.tokenizer
        turns = []
        for t in record["token_turns"]:
            extras = t.get("extras") or {}
            turns.append({"prompt": tokenizer.decode(t["prompt_ids"], skip_special_tokens=False),
                          "response": tokenizer.decode(t["response_ids"], skip_special_tokens=True),
                          "action": t.get("action", ""), "observation": t.get("observation", ""),
                          "reward": t["reward"], "state_key": t["state_key"], "invalid": t.get("invalid", False),
                          "tool_calls": t.get("tool_calls", 0),
                          "advantage": _number(extras.get("advantage", extras.get("adv"))), "info": None})
        return {**head, "observation": None, "info": None, "turns": turns}
