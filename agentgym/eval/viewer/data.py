"""What the viewer shows, read from a folder: an evaluation (``agentgym eval --out``) or a training run
(``agentgym train --out``), as one list of episodes with a uniform shape (``EpisodeIndex``).

Both write the one episode-log format (``agentgym.rollout.episode_log``), read here by its one reader,
whichever version wrote it; ``agentgym.run_folder.RunFolder`` says which kind the folder is and names its
files.

An episode summary is ``{id, env, policy, iteration, task_index, sample, seed, task_id, success,
return, turns}`` (``turns``: how many). An episode adds ``observation`` (the first one), ``info``,
``num_turns`` and one page of its turns, each with ``prompt``, ``response``, ``action``,
``observation``, ``reward``, ``state_key``, ``invalid``, ``tool_calls``, ``advantage`` (when the run
recorded one in the turn's extras) and ``info``. A turn stored without its text (a training run stores token
ids) is decoded with the run's tokenizer when it is asked for.

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
from agentgym.rollout.episode_log import DamagedLine, EpisodeLog
from agentgym.run_folder import PLAN, RunFolder

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
    """Index into ``EpisodeIndex.logs``."""
    offset: int
    """Byte offset of the episode's line in its file."""
    length: int
    """Byte length of that line."""
    position: int
    """The line's place among its file's lines of JSON."""
    member: int
    """The episode's place among its line's episodes (an earlier training run's line held a whole group)."""

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


def _entry(record: dict[str, Any], env: str, policy: str, file: int, offset: int, length: int,
           position: int, member: int) -> EpisodeEntry:
    """The index entry of an episode (``episode_log.read_line``'s), ``env`` and ``policy`` standing in
    where the line names none (a training run's: its config names them)."""
    seed, task_id, iteration = record.get("seed"), record.get("task_id"), record.get("iteration")
    env, policy = record.get("env") or env, record.get("policy") or policy
    task_index, sample = record["task_index"], record["sample"]
    if iteration is not None:
        eid = f"{iteration}|{record.get('group_id')}|{record.get('trajectory_id') or sample}"
    else:
        eid = f"{env}|{policy}|{task_index}|{sample}"
    # Interned: a folder's thousands of episodes share a handful of env and policy names.
    return EpisodeEntry(eid, sys.intern(env), sys.intern(policy), iteration, task_index, sample,
                        seed if _is_int(seed) else None, None if task_id is None else str(task_id),
                        bool(record.get("success")), float(record["return"]), len(record["turns"]),
                        file, offset, length, position, member)


class EpisodeIndex:
    """The episodes, results and learning curves of one folder.

    Args:
        root: an evaluation or training-run folder.

    Raises:
        ConfigError: the folder is neither an evaluation nor a training run, its ``plan.json`` or
            ``config.json`` is damaged, or a trajectory line lacks a field (the message names the
            file, the line and the field).

    Example:
        >>> EpisodeIndex("/nonexistent")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        agentgym.errors.ConfigError: /nonexistent is not a folder; pass the --out folder of ...
    """

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self.folder = RunFolder(self.root)
        if not self.root.is_dir():
            raise ConfigError(f"{self.root} is not a folder; pass the --out folder of `agentgym eval` or "
                              "`agentgym train`")
        kind = self.folder.kind()
        if kind is None:
            raise ConfigError(f"{self.root} holds neither an evaluation (plan.json) nor a training run "
                              "(config.json and trajectories/); pass the --out folder of `agentgym eval` or "
                              "`agentgym train`")
        self.kind: str = kind
        self.logs: list[EpisodeLog] = []
        self.skipped_lines = 0
        self._entries: list[EpisodeEntry] = []
        self._parsed: OrderedDict[tuple[int, int], list[dict[str, Any]]] = OrderedDict()
        self._lock = threading.Lock()
        if self.kind == "eval":
            self._index_evaluation()
        else:
            self._index_training_run()
        self._by_id = {e.id: e for e in self._entries}

    @property
    def files(self) -> list[Path]:
        """The episode files indexed, in order."""
        return [log.path for log in self.logs]

    # --- indexing ---------------------------------------------------------------------------------

    def _relative(self, path: Path) -> str:
        return path.relative_to(self.root).as_posix()

    def _damaged(self, path: Path, number: int, problem: str) -> ConfigError:
        return ConfigError(f"{self._relative(path)} line {number}: {problem}; that line is damaged: repair "
                           "or delete it, then run `agentgym view` again")

    def _index_log(self, log: EpisodeLog, env: str, policy: str) -> list[EpisodeEntry]:
        """Every episode of ``log``, in order. A line that is not JSON (cut short by a crash, or still being
        written) is skipped and counted in ``skipped_lines``, as the evaluation store skips it."""
        self.logs.append(log)
        file, position, found = len(self.logs) - 1, 0, []
        for line in log.scan():
            try:
                episodes = log.episodes(line, position)
                found += [_entry(record, env, policy, file, line.offset, line.length, position, member)
                          for member, record in enumerate(episodes)]
            except DamagedLine as exc:
                raise self._damaged(log.path, line.number, str(exc)) from None
            except ValueError:
                self.skipped_lines += 1
                continue
            position += 1
        return found

    def _index_evaluation(self) -> None:
        fix = "restore it, or run the evaluation again into a new --out folder"
        plan = _read_json(self.folder.plan, PLAN, fix)
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
        for env in envs:
            for policy in policies:
                path = self.folder.episode_file(env["id"], policy["name"])
                if not path.is_file():
                    continue
                found: dict[tuple[int, int], EpisodeEntry] = {}
                for entry in self._index_log(EpisodeLog(path), env["id"], policy["name"]):
                    if planned and not (0 <= entry.task_index < len(seeds) and 0 <= entry.sample < samples
                                        and entry.seed == seeds[entry.task_index]):
                        self.skipped_lines += 1
                        continue
                    # The store reads the first line of a repeated (task, sample); so does the viewer.
                    found.setdefault((entry.task_index, entry.sample), entry)
                self._entries.extend(found[key] for key in sorted(found))

    def _index_training_run(self) -> None:
        config = self._config
        env, algorithm = config.get("env", {}), config.get("algorithm", {})
        if not isinstance(env, dict) or not isinstance(algorithm, dict):
            raise ConfigError("config.json is damaged ('env' and 'algorithm' must be objects); restore it "
                              "from the run's checkpoint or train again into a new --out folder")
        env_id, policy = str(env.get("id", "?")), str(algorithm.get("name", "train"))
        for iteration, path in self.folder.trajectory_files():
            self._entries.extend(self._index_log(EpisodeLog(path, iteration), env_id, policy))

    @cached_property
    def _config(self) -> dict[str, Any]:
        return _read_json(self.folder.config, self.folder.config.name,
                          "restore it from the run's checkpoint or train again into a new --out folder")

    @cached_property
    def tokenizer(self) -> Any:
        """The training run's tokenizer (its saved model's, else the one its config builds)."""
        saved = self.folder.model
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
        results = self.folder.results
        if self.kind == "eval" and results.is_file():
            try:
                data = _read_json(results, results.name, "run `agentgym eval --resume` again")
                rows, comparisons = data.get("results", []), data.get("comparisons", [])
                if not isinstance(rows, list) or not isinstance(comparisons, list):
                    raise ConfigError("results.json is damaged ('results' and 'comparisons' must be lists)")
                meta["results"], meta["comparisons"] = rows, comparisons
            except ConfigError as exc:
                meta["notes"].append(str(exc))
        if self.kind == "train":
            meta["curves"] = self._curves()
            report = self.folder.report
            if report.is_file():
                try:
                    evals = _read_json(report, report.name, "train again").get("eval", {})
                    meta["evals"] = {k: float(v["success_rate"]) for k, v in evals.items()
                                     if isinstance(v, dict) and _number(v.get("success_rate")) is not None}
                except (ConfigError, AttributeError) as exc:
                    meta["notes"].append(str(exc) if isinstance(exc, ConfigError)
                                         else "report.json is damaged")
        return meta

    def _curves(self) -> dict[str, list[list[float]]]:
        path = self.folder.metrics
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
        record = self._line(entry)[entry.member]
        turns: list[dict[str, Any]] = record["turns"]
        page: list[dict[str, Any]] = []
        size = 0
        for turn in turns[turn_offset:turn_offset + turn_limit]:
            shown = self._shown_turn(turn)
            size += len(json.dumps(shown, ensure_ascii=False))
            if page and size > max_page_bytes:
                break
            page.append(shown)
        end = turn_offset + len(page)
        return {**entry.summary(), "num_turns": entry.num_turns, "observation": record.get("observation"),
                "info": record.get("info"), "turn_offset": turn_offset,
                "next_turn_offset": end if end < len(turns) else None, "turns": page}

    def _shown_turn(self, t: dict[str, Any]) -> dict[str, Any]:
        extras = t.get("extras")
        extras = extras if isinstance(extras, dict) else {}
        # A turn without its text (a training run's) is shown decoded from its token ids.
        prompt = (t["prompt"] if "prompt" in t
                  else self.tokenizer.decode(t.get("prompt_ids") or [], skip_special_tokens=False))
        response = (t["response"] if "response" in t
                    else self.tokenizer.decode(t.get("response_ids") or [], skip_special_tokens=True))
        return {"prompt": prompt, "response": response, "action": t.get("action", ""),
                "observation": t.get("observation", ""), "reward": t.get("reward"),
                "state_key": t.get("state_key"), "invalid": bool(t.get("invalid")),
                "tool_calls": t.get("tool_calls", 0),
                "advantage": _number(extras.get("advantage", extras.get("adv"))), "info": t.get("info")}

    def _line(self, entry: EpisodeEntry) -> list[dict[str, Any]]:
        """The episodes of ``entry``'s line, read from disk at its offset (the last few are kept parsed)."""
        key = (entry.file, entry.offset)
        with self._lock:
            if key in self._parsed:
                self._parsed.move_to_end(key)
                return self._parsed[key]
            log = self.logs[entry.file]
            changed = FolderChanged(f"{self._relative(log.path)} changed since the viewer started; restart "
                                    "`agentgym view` to see it as it is now")
            try:
                episodes = log.read_at(entry.offset, entry.length, entry.position)
                again = _entry(episodes[entry.member], entry.env, entry.policy, entry.file, entry.offset,
                               entry.length, entry.position, entry.member)
            except (OSError, ValueError, IndexError, KeyError, TypeError):
                raise changed from None
            if again != entry:
                raise changed
            self._parsed[key] = episodes
            while len(self._parsed) > _PARSED_LINES_KEPT:
                self._parsed.popitem(last=False)
            return episodes
