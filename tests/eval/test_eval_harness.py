"""The evaluation harness with the policies that need no model (random, expert): identical tasks
across policies, what the trajectory log and reports hold, pass@k, env services, bad input, and
interrupted evaluations that resume without redoing finished episodes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar

import pytest
from conftest import CounterEnv

import agentgym
from agentgym.errors import ConfigError, RegistryError, UnknownEnv
from agentgym.eval.harness import Evaluation
from agentgym.eval.plan import EnvEntry, EvalError, EvalPlan
from agentgym.eval.policies import parse_policy
from agentgym.eval.store import EvalStore
from agentgym.service_kit.launcher import free_port


class FragileCounter(CounterEnv):
    """A counter whose env code raises on the second step of the episode reset with seed 3."""

    def reset(self, *, seed=None, options=None):
        self.seed_used = seed
        self.steps = 0
        return super().reset(seed=seed, options=options)

    def step(self, action: str):
        self.steps += 1
        if self.seed_used == 3 and self.steps == 2:
            raise RuntimeError("the counter's spring broke")
        return super().step(action)


class NoExpertCounter(CounterEnv):
    has_expert = False


class ToolCounter(CounterEnv):
    """A counter with a tool spec; ``inc`` is a tool call, reported in info["tool_calls"] when ``report``."""

    TOOLS: ClassVar[list[dict[str, Any]]] = [
        {"type": "function", "function": {"name": "inc", "parameters": {"type": "object"}}},
    ]

    def __init__(self, report: bool = True) -> None:
        super().__init__()
        self.report = report

    def reset(self, *, seed=None, options=None):
        obs, info = super().reset(seed=seed, options=options)
        return obs, {**info, "tools": self.TOOLS}

    def step(self, action: str):
        obs, reward, terminated, truncated, info = super().step(action)
        if self.report:
            info["tool_calls"] = int(action == "inc")
        return obs, reward, terminated, truncated, info


agentgym.register("test/eval-counter-v0", CounterEnv, max_turns=8, override=True)
agentgym.register("test/eval-fragile-v0", FragileCounter, max_turns=8, override=True)
agentgym.register("test/eval-noexpert-v0", NoExpertCounter, max_turns=8, override=True)
agentgym.register("test/eval-tools-v0", ToolCounter, max_turns=8, override=True)

POLICIES = (parse_policy("random"), parse_policy("expert"))


def plan(envs: tuple[EnvEntry, ...] = (EnvEntry("test/eval-counter-v0"),),
         seeds: tuple[int, ...] = tuple(range(6)), **kwargs: Any) -> EvalPlan:
    return EvalPlan(kwargs.pop("policies", POLICIES), envs, seeds, **kwargs)


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines()


def test_every_policy_plays_the_same_tasks_and_the_log_holds_every_turn(tmp_path: Path) -> None:
    results = Evaluation(plan(envs=(EnvEntry("maze-v0", {"size": 2}),)), tmp_path).run()
    store = EvalStore(tmp_path)
    random_eps, expert_eps = store.records("maze-v0", "random"), store.records("maze-v0", "expert")
    assert [(r["seed"], r["task_id"]) for r in random_eps] == [(r["seed"], r["task_id"]) for r in expert_eps]
    assert [r["seed"] for r in expert_eps] == list(range(6))
    episode = expert_eps[0]
    replay = agentgym.make("maze-v0", size=2)
    obs, info = replay.reset(seed=episode["seed"])
    assert episode["observation"] == obs and episode["info"]["state_key"] == info["state_key"]
    for turn in episode["turns"]:  # the log replays: same actions give the logged observations and keys
        assert turn["state_key"] == info["state_key"]
        obs, reward, terminated, _truncated, info = replay.step(turn["action"])
        assert (turn["observation"], turn["reward"], turn["info"]) == (obs, reward, info)
        assert set(turn) >= {"prompt", "response", "action", "observation", "reward", "state_key", "info",
                             "invalid"}
    assert episode["success"] and terminated
    rows = {r["policy"]: r for r in results["results"]}
    assert rows["expert"]["success_rate"] == 1.0 and rows["expert"]["episodes"] == 6
    assert rows["random"]["mean_turns"] > rows["expert"]["mean_turns"]


def test_results_json_and_reports(tmp_path: Path) -> None:
    Evaluation(plan(samples=3, seeds=(10, 11, 12, 13)), tmp_path, command="agentgym eval ...").run()
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["agentgym_version"] == agentgym.__version__
    assert results["command"] == "agentgym eval ..."
    assert results["seeds"] == [10, 11, 12, 13] and results["config"]["samples"] == 3
    # The exact config.
    assert EvalPlan.from_json(results["config"]) == plan(samples=3, seeds=(10, 11, 12, 13))
    row = next(r for r in results["results"] if r["policy"] == "random")
    assert row["episodes"] == 12 and row["tasks"] == 4 and {"pass@1", "pass@2", "pass@3"} <= set(row)
    assert row["pass@1"] <= row["pass@2"] <= row["pass@3"]
    records = EvalStore(tmp_path).records("test/eval-counter-v0", "random")
    by_task = [[r["success"] for r in records if r["task_index"] == t] for t in range(4)]
    assert row["pass@3"] == pytest.approx(sum(any(o) for o in by_task) / 4)
    assert [c["metric"] for c in results["comparisons"]] == ["success"]  # the return is the success here
    md, html = (tmp_path / "report.md").read_text(), (tmp_path / "report.html").read_text()
    assert "| test/eval-counter-v0 | expert | 4 × 3 | 100% |" in md and "pass@3" in md  # 4 tasks × 3 episodes
    assert results["comparisons"][0]["verdict"] in md
    assert html.count("<svg") == 2 and "<script" not in html and "src=" not in html  # self-contained


def test_tool_calls_per_episode_where_the_env_reports_them(tmp_path: Path) -> None:
    envs = (EnvEntry("test/eval-tools-v0"), EnvEntry("test/eval-tools-v0", {"report": False}))
    reported = Evaluation(plan(envs=envs[:1], policies=(parse_policy("expert"),)), tmp_path / "a").run()
    row = reported["results"][0]
    # Span 4: 4 incs.
    assert row["has_tools"] and row["tool_calls_reported"] and row["tool_calls_per_episode"] == 4.0
    assert "| 4.00 |" in (tmp_path / "a" / "report.md").read_text()
    silent = Evaluation(plan(envs=envs[1:], policies=(parse_policy("expert"),)), tmp_path / "b").run()
    assert not silent["results"][0]["tool_calls_reported"]
    assert "| 0% | — |" in (tmp_path / "b" / "report.md").read_text()  # "not reported", never a false 0


def test_returns_are_compared_where_they_say_more_than_success(tmp_path: Path) -> None:
    results = Evaluation(plan(envs=(EnvEntry("blackjack-v0"),), seeds=tuple(range(8))), tmp_path).run()
    assert [c["metric"] for c in results["comparisons"]] == ["success", "return"]
    by_metric = {c["metric"]: c for c in results["comparisons"]}
    rows = {r["policy"]: r for r in results["results"]}
    assert by_metric["return"]["difference"] == pytest.approx(rows["expert"]["mean_return"]
                                                              - rows["random"]["mean_return"])


def test_interrupted_evaluation_keeps_finished_episodes_and_resume_does_not_redo_them(tmp_path: Path) -> None:
    calls: list[tuple[str, int]] = []

    def stop_after_three(env: str, policy: str, done: int, total: int) -> None:
        calls.append((policy, done))
        if policy == "expert" and done == 3:
            raise KeyboardInterrupt

    the_plan = plan(concurrency=1)
    with pytest.raises(KeyboardInterrupt):
        Evaluation(the_plan, tmp_path / "cut", on_progress=stop_after_three).run()
    path = EvalStore(tmp_path / "cut").path("test/eval-counter-v0", "expert")
    kept = lines(path)
    assert len(kept) == 3 and not (tmp_path / "cut" / "results.json").exists()

    with pytest.raises(ConfigError, match="already holds an evaluation; pass --resume"):
        Evaluation(the_plan, tmp_path / "cut").run()
    with pytest.raises(ConfigError, match="started with different policies, envs, seeds"):
        Evaluation(plan(seeds=(0, 1)), tmp_path / "cut", resume=True).run()

    calls.clear()
    resumed = Evaluation(the_plan, tmp_path / "cut", resume=True,
                         on_progress=lambda e, p, d, t: calls.append((p, d))).run()
    assert ("expert", 3) in calls and ("expert", 0) not in calls and ("random", 6) == calls[0]
    after = lines(path)
    assert after[:3] == kept and len(after) == 6  # nothing replayed, nothing duplicated
    whole = Evaluation(the_plan, tmp_path / "whole").run()

    def strip(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{k: v for k, v in r.items() if k not in ("wall_s", "episodes_per_s")} for r in rows]

    assert strip(resumed["results"]) == strip(whole["results"])


def test_env_crash_mid_episode_is_one_line_and_keeps_the_finished_episodes(tmp_path: Path) -> None:
    the_plan = plan(envs=(EnvEntry("test/eval-fragile-v0"),), seeds=(0, 1, 2, 3, 4), concurrency=1,
                    policies=(parse_policy("expert"),))
    with pytest.raises(EvalError) as caught:
        Evaluation(the_plan, tmp_path).run()
    message = str(caught.value)
    assert "\n" not in message
    assert "test/eval-fragile-v0 × expert, task seed 3" in message and "spring broke" in message
    assert "--resume" in message
    saved = EvalStore(tmp_path).records("test/eval-fragile-v0", "expert")
    assert [r["seed"] for r in saved] == [0, 1, 2]


@pytest.mark.parametrize("entry, error, match", [
    (EnvEntry("maze-v9"), RegistryError, "not registered in that version; registered: maze-v0"),
    (EnvEntry("mazee-v0"), UnknownEnv, "Did you mean 'maze-v0'"),
    (EnvEntry("maze-v0", {"sise": 3}), ConfigError, "rejected its arguments"),
])
def test_bad_envs_fail_before_any_episode(tmp_path: Path, entry: EnvEntry, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        Evaluation(plan(envs=(entry,)), tmp_path).run()
    assert not (tmp_path / "plan.json").exists()  # nothing started: the same --out can be used again


def test_expert_on_an_env_without_one_says_what_to_drop(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="test/eval-noexpert-v0 has no expert; drop it from --envs"):
        Evaluation(plan(envs=(EnvEntry("test/eval-noexpert-v0"),)), tmp_path).run()


def test_env_service_gives_the_same_episodes_as_in_process(tmp_path: Path, live_server: Any) -> None:
    server = live_server(["maze-v0"])
    local = Evaluation(plan(envs=(EnvEntry("maze-v0", {"size": 2}),)), tmp_path / "local").run()
    remote = Evaluation(plan(envs=(EnvEntry("maze-v0", {"size": 2}, url=server.url),), concurrency=4),
                        tmp_path / "remote").run()
    for policy in ("random", "expert"):
        a = EvalStore(tmp_path / "local").records("maze-v0", policy)
        b = EvalStore(tmp_path / "remote").records("maze-v0", policy)
        assert ([[(t["action"], t["observation"], t["reward"], t["state_key"]) for t in r["turns"]]
                 for r in a]
                == [[(t["action"], t["observation"], t["reward"], t["state_key"]) for t in r["turns"]]
                    for r in b])
    assert [r["success_rate"] for r in local["results"]] == [r["success_rate"] for r in remote["results"]]


def test_unreachable_env_service_is_one_clear_line(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(EvalError, match=rf"env maze-v0 on the env service {url} cannot be reached "
                                        r".*agentgym serve maze-v0"):
        Evaluation(plan(envs=(EnvEntry("maze-v0", url=url),)), tmp_path).run()


@pytest.mark.parametrize("text, match", [
    ("gpt-4", "is not random, expert, an http"),
    ("expret", "did you mean 'expert'"),
    ("random,temperature=2", "unknown option 'temperature'"),
    ("http://127.0.0.1:1/v1,api=completions", "needs the served model's tokenizer"),
    ("ftp://host/v1", "must be http:// or https://"),
])
def test_bad_policy_specs(text: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        parse_policy(text)


def test_duplicate_policy_names_and_bad_plans() -> None:
    with pytest.raises(ConfigError, match="add ,name=LABEL"):
        plan(policies=(parse_policy("random"), parse_policy("random")))
    assert plan(policies=(parse_policy("random"), parse_policy("random,name=r2"))).policies[1].name == "r2"
    with pytest.raises(ConfigError, match="lists a seed twice"):
        plan(seeds=(1, 1))
    with pytest.raises(ConfigError, match="--samples must be >= 1"):
        plan(samples=0)
