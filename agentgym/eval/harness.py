"""The evaluation harness: ``EvalPlan`` (policies × envs × tasks × samples) and ``Evaluation``,
which plays every episode, saves each as it finishes, resumes, and writes the reports.

Every policy plays the *same* tasks: task ``i`` of every env is ``reset(seed=seeds[i])`` for every
policy and sample (or, for an env evaluated on a task split, task ``seeds[i]`` of that split:
``reset(options={"split": ..., "index": seeds[i]})``), so policies compare task by task. An env with
judge settings is judged (``JudgedReward``): its episodes' rewards are the judge's scores.

Every policy plays through the ``Collector``, ``concurrency`` episodes at a time, as the actor that
fits it: token-level models (a model directory, a run folder or checkpoint, an endpoint's
``completions`` API with a local tokenizer) generate in one batch across the live episodes; a chat
endpoint gets one concurrent request per live episode (``agentgym.eval.chat``); ``random`` and
``expert`` pick moves (``agentgym.rollout.actors``). Episodes are appended to the folder as each chunk
of episodes finishes, so an interrupted or failed evaluation keeps them and ``resume=True`` plays only
the rest.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from agentgym.core import HELD_OUT_SEED_START, Env
from agentgym.errors import AgentGymError, AuthenticationError, ConfigError, RemoteEnvError, RequestRejected
from agentgym.eval.html import html_report
from agentgym.eval.loading import LoadedPolicy, load_policy
from agentgym.eval.plan import EnvEntry, EnvInfo, EvalError, EvalPlan
from agentgym.eval.policies import PolicySpec
from agentgym.eval.report import build_results, markdown_report
from agentgym.eval.store import EvalStore
from agentgym.rollout.actors import Actor, ExpertActor, RandomActor
from agentgym.rollout.collector import Collector
from agentgym.rollout.episode_log import episode_line
from agentgym.rollout.evaluation import collect_episodes
from agentgym.rollout.policy import Policy, SamplingParams
from agentgym.rollout.prompt import PromptRenderer
from agentgym.rollout.records import EpisodeGroup, Trajectory
from agentgym.sources.env_source import EnvSource, make_judge

#: Turns after which an episode of an env without a turn limit of its own is cut (truncated).
MAX_TURNS = 1000

#: Seeds of evaluation tasks start here by default: the range training's held-out evaluations use
#: (``eval.seed_offset``) and training never samples, so `agentgym eval` numbers match report.json's.
DEFAULT_SEED_START = HELD_OUT_SEED_START

ProgressFn = Callable[[str, str, int, int], None]
"""``(env id, policy name, episodes done, episodes total)``, called as episodes finish."""


class Evaluation:
    """Runs an ``EvalPlan`` into a folder.

    Args:
        plan: what to evaluate.
        out_dir: the evaluation folder (``agentgym.eval.store``).
        resume: complete the evaluation saved in ``out_dir`` (its plan must play the same episodes).
        env_token: bearer token of the env services (never saved).
        on_progress: progress callback (``ProgressFn``).
        command: the command line, recorded in results.json.

    Example:
        >>> import tempfile
        >>> from agentgym.eval.policies import parse_policy
        >>> plan = EvalPlan((parse_policy("expert"), parse_policy("random")),
        ...                 (EnvEntry("maze-v0", {"size": 2}),), tuple(range(4)))
        >>> with tempfile.TemporaryDirectory() as out:
        ...     results = Evaluation(plan, out).run()
        >>> [(r["policy"], r["success_rate"]) for r in results["results"]][0]
        ('expert', 1.0)
    """

    def __init__(self, plan: EvalPlan, out_dir: str | Path, *, resume: bool = False,
                 env_token: str | None = None, on_progress: ProgressFn | None = None,
                 command: str | None = None) -> None:
        self.plan = plan
        self.store = EvalStore(out_dir)
        self.resume = resume
        self.env_token = env_token
        self.on_progress = on_progress or (lambda *_: None)
        self.command = command
        self._clients: dict[str, Any] = {}
        self._judges: dict[str, Any] = {}
        """One judge per judged env, shared by its envs (one cache, one bound on requests)."""

    # --- set-up -------------------------------------------------------------------------------------

    def _prepare_folder(self) -> None:
        root = self.store.root
        if self.resume:
            if not self.store.has_plan():
                raise ConfigError(f"--resume {root}: no plan.json there; "
                                  "start the evaluation without --resume")
            saved = EvalPlan.from_json(self.store.read_plan())
            if not saved.same_episodes(self.plan):
                raise ConfigError(f"--resume {root}: that evaluation was started with different policies, "
                                  "envs, seeds or sampling; resume it with "
                                  "`agentgym eval --out DIR --resume` alone, or choose a new --out")
        elif self.store.has_plan():
            raise ConfigError(f"{root} already holds an evaluation; pass --resume to complete it, or choose "
                              "another --out")

    def source(self, entry: EnvEntry) -> EnvSource:
        """``entry`` as an ``EnvSource`` (what training builds its envs from too)."""
        return EnvSource(entry.id, dict(entry.kwargs), entry.max_turns, (entry.url,) if entry.url else (),
                         self.env_token, split=entry.split, judge=entry.judge)

    def env_factory(self, entry: EnvEntry) -> Callable[[], Env]:
        """Makes the env of ``entry``: in-process, or a session on its env service (one client per
        service); on its task split and judged when the entry says so (one judge per env)."""
        client = None
        if entry.url:
            from agentgym.http.client import EnvClient

            client = self._clients.get(entry.url)
            if client is None:
                client = self._clients[entry.url] = EnvClient(entry.url, token=self.env_token)
        source = self.source(entry)
        if entry.judge is not None and entry.id not in self._judges:
            self._judges[entry.id] = make_judge(source.judge or {})
        return source.factory(client, self._judges.get(entry.id))

    def probe(self, entry: EnvEntry) -> EnvInfo:
        """Make the env and reset it on the first task: a bad id, argument or service fails here."""
        where = f" on the env service {entry.url}" if entry.url else ""
        try:
            env = self.env_factory(entry)()
        except AgentGymError as exc:
            unreachable = (isinstance(exc, RemoteEnvError)
                           and not isinstance(exc, (AuthenticationError, RequestRejected)))
            if entry.url and unreachable:
                raise EvalError(f"env {entry.id}{where} cannot be reached ({exc}); start it with "
                                f"`agentgym serve {entry.id}` or fix --env-url") from None
            raise
        try:
            if entry.split is not None:  # every index in range, before any episode: checked at both ends
                for index in sorted({min(self.plan.seeds), max(self.plan.seeds)}):
                    env.task(entry.split, index)
            _, info = env.reset(seed=self.plan.seeds[0])
            has_expert = bool(getattr(env, "has_expert", False))
        except ConfigError as exc:
            if entry.split is None:
                raise
            raise ConfigError(f"{exc} (--split {entry.split}; `agentgym envs --tasks {entry.id}` lists its "
                              "splits)") from None
        finally:
            env.close()
        wanted = self.source(entry).action_format(self._clients.get(entry.url or ""))
        return EnvInfo(bool(info.get("tools")), has_expert, wanted)

    # --- the run ------------------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        """Play every missing episode, then write results.json, report.md and report.html.

        Returns:
            The results (also in ``results.json``).

        Raises:
            EvalError: an episode failed (the finished ones stay saved; resume completes the rest).
            ConfigError: a bad policy, env or folder, found before any episode runs.
        """
        self._prepare_folder()
        loaded: dict[str, LoadedPolicy] = {}
        try:
            infos = {entry.id: self.probe(entry) for entry in self.plan.envs}
            for spec in self.plan.policies:
                if spec.kind == "expert":
                    missing = [e for e, info in infos.items() if not info.has_expert]
                    if missing:
                        raise ConfigError(f"policy expert: {', '.join(missing)} has no expert; drop it from "
                                          "--envs or evaluate it with other policies")
            for spec in self.plan.policies:
                loaded[spec.name] = load_policy(spec, self.plan)
            # Written only once everything is known to work: a plan that failed to start leaves no folder
            # behind.
            self.store.write_plan(self.plan.to_json())
            for entry in self.plan.envs:
                for spec in self.plan.policies:
                    self._run_pair(entry, infos[entry.id], spec, loaded[spec.name])
        finally:
            for policy in loaded.values():
                policy.close()
            for client in self._clients.values():
                client.close()
            for judge in self._judges.values():
                judge.close()
        return write_reports(self.plan, self.store, infos, command=self.command)

    def _run_pair(self, entry: EnvEntry, info: EnvInfo, spec: PolicySpec, policy: LoadedPolicy) -> None:
        plan = self.plan
        done = {(r["task_index"], r["sample"]) for r in self.store.records(entry.id, spec.name)}
        total = len(plan.seeds) * plan.samples
        self.on_progress(entry.id, spec.name, len(done), total)
        if len(done) >= total:
            return
        started = time.perf_counter()
        try:
            self._run_collector(entry, info, spec, policy, done)
        finally:
            self.store.add_time(entry.id, spec.name, time.perf_counter() - started)

    def _fail(self, entry: EnvEntry, spec: PolicySpec, where: str, exc: BaseException) -> EvalError:
        saved = len(self.store.records(entry.id, spec.name))
        detail = str(exc) if isinstance(exc, AgentGymError) else f"{type(exc).__name__}: {exc}"
        kind = type(exc).__name__
        detail = detail.strip() or "(no message)"
        end = "" if detail[-1] in ".?!" else "."
        return EvalError(f"{entry.id} × {spec.name}, {where}: {kind}: {detail}{end} {saved} finished "
                         f"episodes of this pair are saved in {self.store.root}; fix the cause, then "
                         f"`agentgym eval --out {self.store.root} --resume` plays the rest")

    def _sampling(self, spec: PolicySpec) -> SamplingParams:
        return spec.prompt.sampling(self.plan.temperature, self.plan.sampling_seed)

    def _renderer(self, spec: PolicySpec, tokenizer: Any, action_format: str) -> PromptRenderer:
        return spec.prompt.renderer(tokenizer, action_format)  # type: ignore[arg-type]

    def _actor(self, info: EnvInfo, spec: PolicySpec,
               policy: LoadedPolicy) -> tuple[Policy | Actor, PromptRenderer | None, int | None]:
        """Who plays ``spec`` on this env: the actor (or token policy), its renderer and prompt budget."""
        fmt = spec.prompt.action_format or info.action_format
        if spec.kind == "random":
            return RandomActor(self.plan.sampling_seed), None, None
        if spec.kind == "expert":
            return ExpertActor(), None, None
        if policy.token_policy is not None:
            renderer = self._renderer(spec, policy.token_policy.tokenizer, fmt)
            return policy.token_policy, renderer, spec.prompt.max_prompt_tokens
        from agentgym.eval.chat import ChatActor
        from agentgym.eval.messages import MessageCodec

        # The endpoint reports its own context limit; the codec's ids are characters, not tokens.
        actor = ChatActor(policy.endpoint, fmt, send_tools=spec.send_tools,  # type: ignore[arg-type]
                          concurrency=self.plan.concurrency)
        return actor, self._renderer(spec, MessageCodec(), fmt), None

    def _run_collector(self, entry: EnvEntry, info: EnvInfo, spec: PolicySpec, policy: LoadedPolicy,
                       done: set[tuple[int, int]]) -> None:
        plan = self.plan
        actor, renderer, budget = self._actor(info, spec, policy)
        fmt = spec.prompt.action_format or info.action_format
        collector = Collector(self.env_factory(entry), actor, renderer, action_format=fmt,  # type: ignore[arg-type]
                              env_workers=16 if entry.url else 0, max_prompt_tokens=budget,
                              max_turns=MAX_TURNS)
        todo = [i for i in range(len(plan.seeds)) if any((i, k) not in done for k in range(plan.samples))]
        total = len(plan.seeds) * plan.samples
        finished = [len(done)]
        chunk = max(1, plan.concurrency // plan.samples)
        saved_tasks = [0]

        def save(start: int, groups: list[EpisodeGroup]) -> None:
            records = []
            for g_index, group in enumerate(groups):
                task = todo[start + g_index]
                for k, trajectory in enumerate(group.trajectories):
                    if (task, k) not in done:  # a resumed task replays only the samples it lacks
                        records.append(self._record(entry, spec, task, k, trajectory, renderer))
            self.store.append(entry.id, spec.name, records)
            saved_tasks[0] = start + len(groups)
            finished[0] = min(total, finished[0] + len(records))
            self.on_progress(entry.id, spec.name, finished[0], total)

        try:
            collect_episodes(collector, [plan.seeds[i] for i in todo], plan.samples, self._sampling(spec),
                             chunk_tasks=chunk, on_chunk=save,
                             group_ids=[f"{entry.id}/{i}" for i in todo])
        except Exception as exc:
            failed = [plan.seeds[i] for i in todo[saved_tasks[0]:saved_tasks[0] + chunk]]
            samples = "sample 0" if plan.samples == 1 else f"samples 0..{plan.samples - 1}"
            kind = "seed" if entry.split is None else f"index in split {entry.split}"
            where = f"task {kind} {failed[0]}, {samples}" if len(failed) == 1 else \
                f"tasks with {kind}s {failed[0]}..{failed[-1]}"
            raise self._fail(entry, spec, where, exc) from exc
        finally:
            collector.close()
            closer = getattr(actor, "close", None)
            if policy.token_policy is None and callable(closer):
                closer()

    @staticmethod
    def _record(entry: EnvEntry, spec: PolicySpec, task: int, sample: int, trajectory: Trajectory,
                renderer: PromptRenderer | None) -> dict[str, Any]:
        """An episode's log line: the prompt and response text of every turn, every step's info, the note."""
        texts = []
        for turn in trajectory.turns:
            if "prompt_text" in turn.extras:  # a chat endpoint: the messages as sent, the reply as received
                texts.append((str(turn.extras["prompt_text"]), str(turn.extras.get("response_text", ""))))
            elif renderer is not None:
                tokenizer = renderer.tokenizer
                texts.append((tokenizer.decode(turn.prompt_ids, skip_special_tokens=False),
                              tokenizer.decode(turn.response_ids, skip_special_tokens=True)))
            else:  # random and expert: the move is the response
                texts.append(("", turn.action))
        # The texts are stored once, as the turn's prompt and response, not again in its extras.
        kept = [{k: v for k, v in t.extras.items() if k not in ("prompt_text", "response_text")}
                for t in trajectory.turns]
        turns = [replace(t, extras=extras) for t, extras in zip(trajectory.turns, kept, strict=True)]
        # The reset seed of a split's task was its index in the split.
        split = {"split": entry.split, "index": trajectory.seed} if entry.split is not None else {}
        return episode_line(replace(trajectory, turns=turns), group_id=f"{entry.id}/{task}", task_index=task,
                            sample=sample, env=entry.id, policy=spec.name, texts=texts, prompt_ids=False,
                            **split)


def write_reports(plan: EvalPlan, store: EvalStore, infos: dict[str, EnvInfo], *,
                  command: str | None = None) -> dict[str, Any]:
    """Build the results from the saved episodes and write results.json, report.md and report.html."""
    results = build_results(plan, store, infos, command=command)
    # Atomic writes: a full disk is one line (EvalFolderError) and leaves the previous reports whole.
    store.write_file("results.json", json.dumps(results, indent=2) + "\n")
    store.write_file("report.md", markdown_report(results))
    store.write_file("report.html", html_report(results))
    return results
