"""``search-qa-v0``: contract, EM/F1 scoring, no answer leaks, the expert, both call forms, the synthetic
set."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import LiveServer

import agentgym
from agentgym.checker import check_env
from agentgym.envs.registration import register_tool_envs
from agentgym.envs.tools.search_qa import TOOLS, SearchQAEnv, exact_match, f1_score, normalize_answer
from agentgym.errors import ConfigError
from agentgym.http.client import EnvClient, RemoteEnv
from agentgym.retrieval import build_index
from agentgym.retrieval.service import create_retrieval_app
from agentgym.retrieval.synthetic import generate_corpus, write_jsonl

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(autouse=True)
def registered() -> None:
    register_tool_envs()
    register_tool_envs()  # idempotent


def play_expert(env: Any, **reset: Any) -> list[tuple[Any, ...]]:
    obs, info = env.reset(**reset)
    trace: list[tuple[Any, ...]] = [(obs, 0.0, False, False, info)]
    while not (trace[-1][2] or trace[-1][3]):
        trace.append(env.step(env.expert_action()))
    return trace


def test_check_env_passes() -> None:
    check_env("search-qa-v0", num_episodes=4)
    check_env(lambda: SearchQAEnv(num_entities=60, corpus_seed=3, reward="f1", format_penalty=0.5))


def test_normalisation_em_and_f1_on_hand_examples() -> None:
    assert normalize_answer("The Cat, a Hat & an Apple!") == "cat hat apple"
    assert normalize_answer("  New\tYork   CITY. ") == "new york city"
    assert normalize_answer("Theatre") == "theatre"  # articles only as whole words
    assert exact_match("the united states", ["United States", "USA"]) == 1.0
    assert exact_match("U.S.A.", ["USA"]) == 1.0
    assert exact_match("United States of America", ["United States"]) == 0.0
    # prediction "barack obama jr" vs gold "barack obama": overlap 2, p = 2/3, r = 1 → F1 = 0.8
    assert f1_score("Barack Obama Jr.", ["Barack Obama"]) == pytest.approx(0.8)
    # overlap 1 of pred 2 / gold 3 tokens: p = 1/2, r = 1/3 → F1 = 2·(1/6)/(5/6) = 0.4
    assert f1_score("paris france", ["the city of paris"]) == pytest.approx(0.4)
    assert f1_score("london", ["paris", "city of london"]) == pytest.approx(2 * 1 * 1 / 3 / (1 + 1 / 3))
    assert f1_score("the", ["a"]) == 0.0 and f1_score("", ["x"]) == 0.0


def test_expert_solves_every_synthetic_question_and_never_sees_the_answer_early() -> None:
    env = agentgym.make("search-qa-v0")
    items = env.unwrapped.items
    solved = 0
    for item in items:
        trace = play_expert(env, options={"task_id": item["id"]})
        gold = [normalize_answer(a) for a in item["golden_answers"]]
        reset_obs, info = trace[0][0], trace[0][4]
        assert info["answer"] == item["golden_answers"] and info["tools"] == TOOLS
        for text in (normalize_answer(reset_obs), normalize_answer(info["instructions"])):
            assert not any(f" {g} " in f" {text} " for g in gold), item["id"]
        # Multi-hop: the answer only shows up once the last hop's document has been retrieved.
        for obs, *_ in trace[1:-2]:
            assert not any(f" {g} " in f" {normalize_answer(obs)} " for g in gold), (item["id"], obs)
        assert item["supporting_docs"][-1] in trace[-2][4]["state_key"]
        solved += trace[-1][4]["success"]
        assert 2 <= len(trace) - 1 <= len(item["supporting_docs"]) + 1  # a search may surface two hops
    assert solved == len(items) > 300


def test_actions_rewards_and_state_key() -> None:
    env = agentgym.make("search-qa-v0", reward="f1", format_penalty=0.25, max_turns=20)
    obs, info = env.reset(seed=4)
    item = env.unwrapped.items[env.unwrapped.by_id[info["task_id"]]]
    assert info["state_key"] == f"{item['id']}|docs="
    obs, reward, terminated, _, info = env.step("I will just guess.")
    assert info["invalid_action"] and reward == -0.25 and not terminated
    assert obs.startswith("Invalid action: no tool")
    for bad in ("<search>a</search><answer>b</answer>", "<answer>a</answer><answer>b</answer>",
                "<search>a</search>" * 4, "<python>1</python>", '<tool_call>{"name": "search"}</tool_call>'):
        obs, reward, _, _, info = env.step(bad)
        assert info["invalid_action"] and reward == -0.25 and obs.endswith(item["question"]), bad
    query = item["search_queries"][0]
    call = json.dumps({"name": "search", "arguments": json.dumps({"query": query})})
    obs, reward, _, _, info = env.step(f"<tool_call>{call}</tool_call>")
    assert obs.startswith("<information>Doc 1(Title: ") and reward == 0.0 and not info["invalid_action"]
    key = info["state_key"]
    assert item["supporting_docs"][0] in key
    # Same evidence through another wording (two queries in one turn): same state.
    obs, _, _, _, info = env.step(f"<search>{query}</search> <search>{query}?</search>")
    assert obs.count("<information>") == 2 and info["state_key"] == key
    answer = item["golden_answers"][0]
    obs, reward, terminated, _, info = env.step(f"<answer>{answer} extra</answer>")
    assert terminated and not info["success"] and info["em"] == 0.0
    assert reward == info["f1"] == pytest.approx(f1_score(f"{answer} extra", [answer]))
    assert "not correct" in obs


def test_task_id_replays_and_bad_arguments_raise() -> None:
    env = agentgym.make("search-qa-v0")
    first = env.reset(seed=11)
    assert env.reset(seed=99, options={"task_id": first[1]["task_id"]}) == first
    with pytest.raises(ConfigError, match="unknown search-qa task_id"):
        SearchQAEnv(num_entities=40).reset(options={"task_id": "nope"})
    for kwargs, message in [({"top_k": 0}, "top_k"), ({"reward": "acc"}, "reward"),
                            ({"retriever": "faiss"}, "retriever"), ({"format_penalty": -1}, "format_penalty"),
                            ({"dataset": "missing.jsonl"}, "does not exist")]:
        with pytest.raises(ConfigError, match=message):
            SearchQAEnv(**kwargs)


def test_synthetic_generator_is_deterministic_and_multi_hop_needs_two_docs() -> None:
    docs, questions = generate_corpus(400, seed=9)
    assert (docs, questions) == generate_corpus(400, seed=9)
    assert generate_corpus(400, seed=10)[0] != docs
    by_id = {d["id"]: d for d in docs}
    assert len(by_id) == len(docs) == 400 and len({d["title"] for d in docs}) == 400
    hops = {q.hops for q in questions}
    assert hops == {1, 2, 3}
    for q in questions:
        assert len(set(q.supporting_docs)) == q.hops
        assert q.golden_answers[0] in by_id[q.supporting_docs[-1]]["text"]
        if q.hops >= 2:
            anchor = q.search_queries[0]
            assert anchor in q.question
            # No single document names the question's subject and states the answer.
            for doc in docs:
                text = f"{doc['title']} {doc['text']}"
                assert not (anchor in text and q.golden_answers[0] in text), (q, doc)


def test_user_dataset_with_a_corpus_file_and_a_retrieval_service(tmp_path: Path) -> None:
    docs, questions = generate_corpus(80, seed=2)
    corpus, qa = write_jsonl(docs, questions, tmp_path)
    env = agentgym.make("search-qa-v0", dataset=str(qa), corpus=str(corpus))
    assert all(play_expert(env, seed=s)[-1][4]["success"] for s in range(5))
    plain = tmp_path / "plain.jsonl"
    plain.write_text(json.dumps({"question": "Who?", "golden_answers": "Nobody"}) + "\n")
    env = agentgym.make("search-qa-v0", dataset=str(plain), corpus=str(corpus))
    _, info = env.reset(seed=0)
    assert info["task_id"] == "plain-1" and env.expert_action() is None and info["answer"] == ["Nobody"]
    with pytest.raises(ConfigError, match="needs corpus="):
        SearchQAEnv(dataset=str(plain))
    (tmp_path / "bad.jsonl").write_text('{"question": "x", "golden_answers": []}\n')
    with pytest.raises(ConfigError, match="bad.jsonl:1: 'golden_answers'"):
        SearchQAEnv(dataset=str(tmp_path / "bad.jsonl"), corpus=str(corpus))

    build_index(corpus, tmp_path / "index")
    server = LiveServer(create_retrieval_app(tmp_path / "index"))
    try:
        remote = agentgym.make("search-qa-v0", dataset=str(qa), retriever=server.url)
        local = agentgym.make("search-qa-v0", dataset=str(qa), corpus=str(tmp_path / "index"))
        assert play_expert(remote, seed=3) == play_expert(local, seed=3)
        remote.close()
    finally:
        server.stop()


def test_search_qa_over_the_env_service(make_service: Callable[..., Any]) -> None:
    client = EnvClient(client=make_service(["search-qa-v0"]))
    local = agentgym.make("search-qa-v0")
    with RemoteEnv("search-qa-v0", client=client) as remote:
        expected = json.loads(json.dumps(play_expert(local, seed=5)))
        assert json.loads(json.dumps(play_expert(remote, seed=5))) == expected


def test_tool_calls_counts_the_searches_each_step_ran() -> None:
    env = agentgym.make("search-qa-v0", max_turns=20)
    _, info = env.reset(seed=4)
    assert info["tool_calls"] == 0
    item = env.unwrapped.items[env.unwrapped.by_id[info["task_id"]]]
    query = item["search_queries"][0]
    assert env.step("no tag at all")[4]["tool_calls"] == 0  # invalid: nothing ran
    assert env.step(f"<search>{query}</search><search>")[4]["tool_calls"] == 0  # unclosed tag: nothing ran
    assert env.step(f"<search>{query}</search>")[4]["tool_calls"] == 1
    _, _, _, _, info = env.step(f"<search>{query}</search> <search>x</search>\n<search>{query}</search>")
    assert info["tool_calls"] == 3 and not info["invalid_action"]
    _, _, terminated, _, info = env.step("<answer>anything</answer>")  # an answer is not a tool call
    assert terminated and info["tool_calls"] == 0


def test_max_hops_keeps_the_questions_with_short_evidence_chains() -> None:
    full = SearchQAEnv(num_entities=200)
    hops = {item["id"]: len(item["search_queries"]) for item in full.items}
    assert set(hops.values()) == {1, 2, 3}
    for limit in (1, 2):
        env = SearchQAEnv(num_entities=200, max_hops=limit)
        assert [item["id"] for item in env.items] == [i for i, h in hops.items() if h <= limit]
        for seed in range(20):
            trace = play_expert(env, seed=seed)
            assert trace[-1][4]["success"] and len(trace) - 1 <= limit + 1
    assert len(SearchQAEnv(num_entities=200, max_hops=3).items) == len(full.items)
    with pytest.raises(ConfigError, match="max_hops"):
        SearchQAEnv(num_entities=40, max_hops=0)
