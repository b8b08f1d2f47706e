"""What the viewer shows, read from a folder: an evaluation (``agentgym eval --out``) or a training
run (``agentgym train --out``), as one list of episodes with a uniform shape.

An episode summary is ``{id, env, policy, iteration, task_index, sample, seed, task_id, success,
return, turns}`` (``turns``: how many). An episode adds ``observation`` (the first one), ``info``,
``num_turns`` and one page of its turns, each with ``prompt``, ``response``, ``action``,
``observation``, ``reward``, ``state_key``, ``invalid``, ``tool_calls``, ``advantage`` (when the run
recorded one in the turn's extras) and ``info``. Training runs store token ids; a page's text is
decoded with the run's tokenizer when it is asked for.

Only an index stays in memory: per episode its summary and where its line lies in its file (byte
offset and length). Episodes are read back from disk a page at a time, so a folder of any size
starts in one pass over its files and a large episode is sent in pages.
"""

from __future__ import annotations

import json
import sys
import threading
from collections import OrderedDict
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from agentgym.errors import ConfigError
from agentgym.eval.store import PLAN, EvalStore
from agentgym.run_folder import RunFolder as TrainingRun

#: Turns a page holds at most, and the JSON size after which a page ends early (a page always
#: holds at least one turn, however large).
MAX_TURN_PAGE = 500
TURN_PAGE_BYTES = 1 << 20
#: Episode summaries a list page holds at most.
MAX_LIST_PAGE = 1000
#: Parsed lines kept for paging through an episode without parsing its line again per page.
_PARSED_LINES_KEPT = 2


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class FolderChanged(ConfigError):
    """An episode's line is no longer where the index found it: the folder was rewritten meanwhile."""

    http_status = 409


@dataclass(frozen=True, slots=True)
class EpisodeEntry:
    """One episode of the index: its summary fields and where its line is."""

    id: str
    env: str
    policy: str
    iteration: int | None
    task_index: int
    sample: int
    seed: int | None
    task_id: str | None
    success: bool
    episode_return: float
    num_turns: int
    file: int
    """Index into ``RunFolder.files``."""
    offset: int
    """Byte offset of the episode's line in its file."""
    length: int
    """Byte length of that line."""
    position: int
    """The trajectory's place in its group's line (training runs); 0 for evaluations."""

    def summary(self) -> dict[str, Any]:
        return {"id": self.id, "env": self.env, "policy": self.policy, "iteration": self.iteration,
                "task_index": self.task_index, "sample": self.sample, "seed": self.seed,
                "task_id": self.task_id, "success": self.success, "return": self.episode_return,
                "turns": self.num_turns}


def _read_json(path: Path, name: str, fix: str) -> dict[str, Any]:
    """A JSON object file of the folder; anything else is a one-line ``ConfigError`` saying how to fix it."""
    try:
        data = json.loads(path.read_bytes())
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError
        raise ConfigError(f"{name} is damaged (not valid JSON: {exc}); {fix}") from None
    except OSError as exc:
        raise ConfigError(f"{name} cannot be read ({exc.strerror}); {fix}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{name} is damaged (a JSON {type(data).__name__}, not an object); {fix}")
    return data


class _Damaged(Exception):
    """A parsed line lacks a field the viewer needs (the message names it)."""


class RunFolder:
    """The episodes, results and learning curves of one folder.

    Args:
        root: an evaluation or training-run folder.

    Raises:
        ConfigError: the folder is neither an evaluation nor a training run, its ``plan.json`` or
            ``config.json`` is damaged, or a trajectory line lacks a field (the message names the
            file, the line and the field).

    Example:
        >>> RunFolder("/nonexistent")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        agentgym.errors.ConfigError: /nonexistent is not a folder; pass the --out folder of ...
    """

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self._run = TrainingRun(self.root)  # where a training run's files are
        if not self.root.is_dir():
            raise ConfigError(f"{self.root} is not a folder; pass the --out folder of `agentgym eval` or "
                              "`agentgym train`")
        if (self.root / PLAN).is_file():
            self.kind = "eval"
        elif self._run.config.is_file() and self._run.trajectories.is_dir():
            self.kind = "train"
        else:
            raise ConfigError(f"{self.root} holds neither an evaluation (plan.json) nor a training run "
                              "(config.json and trajectories/); pass the --out folder of `agentgym eval` or "
                              "`agentgym train`")
        self.files: list[Path] = []
        self.skipped_lines = 0
        self._entries: list[EpisodeEntry] = []
        self._by_id: dict[str, EpisodeEntry] = {}
        self._parsed: OrderedDict[tuple[int, int], Any] = OrderedDict()
        self._lock = threading.Lock()
        if self.kind == "eval":
            self._index_evaluation()
        else:
            self._index_training_run()
        self._by_id = {e.id: e for e in self._entries}

    # --- indexing ---------------------------------------------------------------------------------

    def _lines(self, path: Path) -> Any:
        """(line number, byte offset, parsed line) of each readable line of ``path``.

        A line that is not JSON (cut short by a crash, or still being written) is skipped and
        counted in ``skipped_lines``, as the evaluation store skips it.
        """
        offset = 0
        with open(path, "rb") as fh:
            for number, raw in enumerate(fh, start=1):
                start, offset = offset, offset + len(raw)
                if not raw.strip():
                    continue
                try:
                    parsed = json.loads(raw)
                except ValueError:
                    self.skipped_lines += 1
                    continue
                yield number, start, len(raw), parsed

    def _relative(self, path: Path) -> str:
        return path.relative_to(self.root).as_posix()

    def _damaged(self, path: Path, number: int, problem: str) -> ConfigError:
        return ConfigError(f"{self._relative(path)} line {number}: {problem}; that line is damaged: repair "
                           "or delete it, then run `agentgym view` again")

    def _index_evaluation(self) -> None:
        fix = "restore it, or run the evaluation again into a new --out folder"
        plan = _read_json(self.root / PLAN, PLAN, fix)
        envs, policies = plan.get("envs"), plan.get("policies")
        if (not isinstance(envs, list)
                or not all(isinstance(e, dict) and isinstance(e.get("id"), str) for e in envs)
                or not isinstance(policies, list)
                or not all(isinstance(p, dict) and isinstance(p.get("name"), str) for p in policies)):
            raise ConfigError(f"{PLAN} is damaged (it needs 'envs': [{{'id': ...}}] and 'policies': "
                              f"[{{'name': ...}}]); {fix}")
        seeds, samples = plan.get("seeds"), plan.get("samples")
        # As the evaluation store counts them: only the episodes the plan asks for, so the viewer
        # shows what the report counted, and a stray line never stands in for a planned episode.
        planned = isinstance(seeds, list) and all(_is_int(s) for s in seeds) and _is_int(samples)
        store = EvalStore(self.root)
        for env in envs:
            for policy in policies:
                path = store.path(env["id"], policy["name"])
                if not path.is_file():
                    continue
                self.files.append(path)
                found: dict[tuple[int, int], EpisodeEntry] = {}
                for number, offset, length, record in self._lines(path):
                    try:
                        entry = self._evaluation_entry(record, len(self.files) - 1, offset, length)
                    except _Damaged as exc:
                        raise self._damaged(path, number, str(exc)) from None
                    if planned and not (0 <= entry.task_index < len(seeds) and 0 <= entry.sample < samples
                                        and entry.seed == seeds[entry.task_index]):
                        self.skipped_lines += 1
                        continue
                    # The store reads the first line of a repeated (task, sample); so does the viewer.
                    found.setdefault((entry.task_index, entry.sample), entry)
                self._entries.extend(found[key] for key in sorted(found))

    @staticmethod
    def _evaluation_entry(record: Any, file: int, offset: int, length: int) -> EpisodeEntry:
        if not isinstance(record, dict):
            raise _Damaged(f"a JSON {type(record).__name__}, not an episode object")
        for name, valid, what in (("env", lambda v: isinstance(v, str), "a string"),
                                  ("policy", lambda v: isinstance(v, str), "a string"),
                                  ("task_index", _is_int, "an integer"), ("sample", _is_int, "an integer"),
                                  ("return", lambda v: _number(v) is not None, "a number"),
                                  ("turns", lambda v: isinstance(v, list), "a list")):
            if name not in record:
                raise _Damaged(f"the episode has no '{name}'")
            if not valid(record[name]):
                raise _Damaged(f"the episode's '{name}' is not {what}")
        if not all(isinstance(t, dict) for t in record["turns"]):
            raise _Damaged("a turn of the episode is not an object")
        seed = record.get("seed")
        task_id = record.get("task_id")
        eid = f"{record['env']}|{record['policy']}|{record['task_index']}|{record['sample']}"
        # Interned: a folder's thousands of episodes share a handful of env and policy names.
        return EpisodeEntry(eid, sys.intern(record["env"]), sys.intern(record["policy"]), None,
                            record["task_index"], record["sample"],
                            seed if _is_int(seed) else None, None if task_id is None else str(task_id),
                            bool(record.get("success")), float(record["return"]), len(record["turns"]),
                            file, offset, length, 0)

    def _index_training_run(self) -> None:
        config = self._config
        env, algorithm = config.get("env", {}), config.get("algorithm", {})
        if not isinstance(env, dict) or not isinstance(algorithm, dict):
            raise ConfigError("config.json is damaged ('env' and 'algorithm' must be objects); restore it "
                              "from the run's checkpoint or train again into a new --out folder")
        env_id, policy = str(env.get("id", "?")), str(algorithm.get("name", "train"))
        for iteration, path in self._run.trajectory_files():
            self.files.append(path)
            for task_index, (number, offset, length, group) in enumerate(self._lines(path)):
                try:
                    self._entries.extend(self._training_entries(group, env_id, policy, iteration, task_index,
                                                                len(self.files) - 1, offset, length))
                except _Damaged as exc:
                    raise self._damaged(path, number, str(exc)) from None

    @staticmethod
    def _training_entries(group: Any, env: str, policy: str, iteration: int, task_index: int, file: int,
                          offset: int, length: int) -> list[EpisodeEntry]:
        if not isinstance(group, dict):
            raise _Damaged(f"a JSON {type(group).__name__}, not a group object")
        if "group_id" not in group:
            raise _Damaged("the group has no 'group_id'")
        trajectories = group.get("trajectories")
        if not isinstance(trajectories, list):
            raise _Damaged("the group has no 'trajectories' list")
        entries = []
        for sample, t in enumerate(trajectories):
            if not isinstance(t, dict) or not isinstance(t.get("turns"), list):
                raise _Damaged(f"trajectory {sample} has no 'turns' list")
            episode_return = 0.0
            for n, turn in enumerate(t["turns"]):
                if not isinstance(turn, dict):
                    raise _Damaged(f"turn {n} of trajectory {sample} is not an object")
                for name in ("prompt_ids", "response_ids"):
                    if not isinstance(turn.get(name), list):
                        raise _Damaged(f"turn {n} of trajectory {sample} has no '{name}' list")
                reward = _number(turn.get("reward"))
                if reward is None:
                    raise _Damaged(f"turn {n} of trajectory {sample} has no numeric 'reward'")
                episode_return += reward
            seed, task_id = t.get("seed"), t.get("task_id")
            eid = f"{iteration}|{group['group_id']}|{t.get('trajectory_id') or sample}"
            entries.append(EpisodeEntry(eid, env, policy, iteration, task_index, sample,
                                        seed if _is_int(seed) else None,
                                        None if task_id is None else str(task_id), bool(t.get("success")),
                                        episode_return, len(t["turns"]), file, offset, length, sample))
        return entries

    @cached_property
    def _config(self) -> dict[str, Any]:
        return _read_json(self._run.config, self._run.config.name,
                          "restore it from the run's checkpoint or train again into a new --out folder")

    @cached_property
    def tokenizer(self) -> Any:
        """The training run's tokenizer (its saved model's, else the one its config builds)."""
        saved = self._run.model
        if (saved / "tokenizer_config.json").is_file() or (saved / "tokenizer.json").is_file():
            from transformers import AutoTokenizer

            return AutoTokenizer.from_pretrained(saved, local_files_only=True)
        model = self._config.get("model", {})
        if isinstance(model, dict) and model.get("path"):
            from transformers import AutoTokenizer

            from agentgym.backends.gguf import model_dir

            # The one resolver of model.path: a directory, a packaged model, a .gguf file or a Hub id.
            folder = model_dir(model["path"], revision=model.get("revision"))
            return AutoTokenizer.from_pretrained(folder, local_files_only=True)
        from agentgym.backends.tiny import ByteTokenizer

        return ByteTokenizer()

    # --- queries ----------------------------------------------------------------------------------

    def meta(self) -> dict[str, Any]:
        """Title, kind, filter choices, results (evaluations) and learning curves (training runs).

        A ``results.json`` or ``report.json`` that cannot be read is left out, named in ``notes``.
        """
        envs = sorted({e.env for e in self._entries})
        policies = list(dict.fromkeys(e.policy for e in self._entries))
        iterations = sorted({e.iteration for e in self._entries if e.iteration is not None})
        meta: dict[str, Any] = {"kind": self.kind, "title": self.root.resolve().name, "envs": envs,
                                "policies": policies, "iterations": iterations,
                                "episodes": len(self._entries), "skipped_lines": self.skipped_lines,
                                "results": [], "comparisons": [], "curves": {}, "evals": None, "notes": []}
        if self.kind == "eval" and (self.root / "results.json").is_file():
            try:
                data = _read_json(self.root / "results.json", "results.json",
                                  "run `agentgym eval --resume` again")
                results, comparisons = data.get("results", []), data.get("comparisons", [])
                if not isinstance(results, list) or not isinstance(comparisons, list):
                    raise ConfigError("results.json is damaged ('results' and 'comparisons' must be lists)")
                meta["results"], meta["comparisons"] = results, comparisons
            except ConfigError as exc:
                meta["notes"].append(str(exc))
        if self.kind == "train":
            meta["curves"] = self._curves()
            if self._run.report.is_file():
                try:
                    evals = _read_json(self._run.report, self._run.report.name, "train again").get("eval", {})
                    meta["evals"] = {k: float(v["success_rate"]) for k, v in evals.items()
                                     if isinstance(v, dict) and _number(v.get("success_rate")) is not None}
                except (ConfigError, AttributeError) as exc:
                    meta["notes"].append(str(exc) if isinstance(exc, ConfigError)
                                         else "report.json is damaged")
        return meta

    def _curves(self) -> dict[str, list[list[float]]]:
        path = self._run.metrics
        curves: dict[str, list[list[float]]] = {}
        if not path.is_file():
            return curves
        with open(path, "rb") as fh:
            for line in fh:
                try:
                    metrics = json.loads(line)
                except ValueError:
                    continue
                if not isinstance(metrics, dict):
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
                 iteration: int | None = None, task_index: int | None = None, offset: int = 0,
                 limit: int = MAX_LIST_PAGE) -> tuple[int, list[dict[str, Any]]]:
        """How many episodes match every given filter, and the summaries of ``limit`` of them from
        ``offset``."""
        matching = [e for e in self._entries
                    if (env is None or e.env == env) and (policy is None or e.policy == policy)
                    and (success is None or e.success == success)
                    and (iteration is None or e.iteration == iteration)
                    and (task_index is None or e.task_index == task_index)]
        return len(matching), [e.summary() for e in matching[offset:offset + limit]]

    def tasks(self, env: str | None = None) -> list[dict[str, Any]]:
        """The tasks played (of ``env``, if given), by task index: ``{task_index, seed, task_id}``."""
        found: dict[int, dict[str, Any]] = {}
        for e in self._entries:
            if env is None or e.env == env:
                found.setdefault(e.task_index,
                                 {"task_index": e.task_index, "seed": e.seed, "task_id": e.task_id})
        return [found[k] for k in sorted(found)]

    def episode(self, eid: str, *, turn_offset: int = 0, turn_limit: int = 50,
                max_page_bytes: int = TURN_PAGE_BYTES) -> dict[str, Any] | None:
        """One episode with one page of its turns, or None for an unknown id.

        The page holds the turns from ``turn_offset``, at most ``turn_limit`` of them, and ends early
        once its JSON passes ``max_page_bytes`` (it holds at least one turn). ``next_turn_offset``
        is where the next page starts, None after the last turn.

        Raises:
            FolderChanged: the episode's line changed on disk since the folder was indexed.
        """
        entry = self._by_id.get(eid)
        if entry is None:
            return None
        line = self._line(entry)
        if self.kind == "eval":
            turns: list[dict[str, Any]] = line["turns"]
            observation, info = line.get("observation"), line.get("info")
        else:
            turns = line["trajectories"][entry.position]["turns"]
            observation = info = None
        page: list[dict[str, Any]] = []
        size = 0
        for turn in turns[turn_offset:turn_offset + turn_limit]:
            shown = self._shown_turn(turn)
            size += len(json.dumps(shown, ensure_ascii=False))
            if page and size > max_page_bytes:
                break
            page.append(shown)
        end = turn_offset + len(page)
        return {**entry.summary(), "num_turns": entry.num_turns, "observation": observation, "info": info,
                "turn_offset": turn_offset, "next_turn_offset": end if end < len(turns) else None,
                "turns": page}

    def _shown_turn(self, t: dict[str, Any]) -> dict[str, Any]:
        if self.kind == "eval":
            return {"prompt": t.get("prompt"), "response": t.get("response"), "action": t.get("action"),
                    "observation": t.get("observation"), "reward": t.get("reward"),
                    "state_key": t.get("state_key"), "invalid": bool(t.get("invalid")),
                    "tool_calls": t.get("tool_calls", 0), "advantage": None, "info": t.get("info")}
        tokenizer = self.tokenizer
        extras = t.get("extras") or {}
        return {"prompt": tokenizer.decode(t["prompt_ids"], skip_special_tokens=False),
                "response": tokenizer.decode(t["response_ids"], skip_special_tokens=True),
                "action": t.get("action", ""), "observation": t.get("observation", ""),
                "reward": t.get("reward"),
                "state_key": t.get("state_key"), "invalid": bool(t.get("invalid")),
                "tool_calls": t.get("tool_calls", 0),
                "advantage": (_number(extras.get("advantage", extras.get("adv"))) if isinstance(extras, dict)
                              else None),
                "info": None}

    def _line(self, entry: EpisodeEntry) -> Any:
        """The parsed line of ``entry``, read from disk at its offset (the last few are kept parsed)."""
        key = (entry.file, entry.offset)
        with self._lock:
            if key in self._parsed:
                self._parsed.move_to_end(key)
                return self._parsed[key]
            path = self.files[entry.file]
            changed = FolderChanged(f"{self._relative(path)} changed since the viewer started; restart "
                                    "`agentgym view` to see it as it is now")
            try:
                with open(path, "rb") as fh:
                    fh.seek(entry.offset)
                    parsed = json.loads(fh.read(entry.length))
            except (OSError, ValueError):
                raise changed from None
            if not self._still(entry, parsed):
                raise changed
            self._parsed[key] = parsed
            while len(self._parsed) > _PARSED_LINES_KEPT:
                self._parsed.popitem(last=False)
            return parsed

    def _still(self, entry: EpisodeEntry, parsed: Any) -> bool:
        """Whether ``parsed`` is still the line ``entry`` was indexed from."""
        if not isinstance(parsed, dict):
            return False
        try:
            if self.kind == "eval":
                again = self._evaluation_entry(parsed, entry.file, entry.offset, entry.length)
                return again == entry
            again_list = self._training_entries(parsed, entry.env, entry.policy, entry.iteration or 0,
                                                entry.task_index, entry.file, entry.offset, entry.length)
        except _Damaged:
            return False
        return entry.position < len(again_list) and again_list[entry.position] == entry
