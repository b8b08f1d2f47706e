"""BM25 index build/load/search, the retrieval service (in-process and over a socket) and its client."""

from __future__ import annotations

import json
import math
import random
from collections import Counter
from pathlib import Path

import httpx
import pytest
from conftest import LiveServer
from fastapi.testclient import TestClient

from agentgym.errors import AuthenticationError, ConfigError, RemoteEnvError, RequestRejected
from agentgym.retrieval import Index, build_index
from agentgym.retrieval.client import RetrievalClient
from agentgym.retrieval.index import tokenize
from agentgym.retrieval.service import create_retrieval_app
from agentgym.retrieval.synthetic import generate_corpus, write_jsonl

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    docs, questions = generate_corpus(300, seed=5)
    out = tmp_path_factory.mktemp("synqa")
    write_jsonl(docs, questions, out)
    return out


def test_build_load_search_ranks_the_entity_doc_first(corpus_dir: Path, tmp_path: Path) -> None:
    built = build_index(corpus_dir / "corpus.jsonl", tmp_path / "index")
    loaded = Index.load(tmp_path / "index")
    docs = [json.loads(line) for line in (corpus_dir / "corpus.jsonl").read_text().splitlines()]
    assert len(loaded) == len(docs) == 300
    queries = [doc["title"] for doc in docs]
    for doc, hits in zip(docs, loaded.search(queries, k=3), strict=True):
        assert hits[0].id == doc["id"], doc["title"]
        assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
    assert loaded.search(queries[:20], k=5) == built.search(queries[:20], k=5)
    assert loaded.search(["zzzz qqqq"], k=3) == [[]]  # nothing shares a term: no hits, not random ones


def lucene_bm25_loop(docs: list[list[str]], query: list[str], k1: float = 1.5,
                     b: float = 0.75) -> list[float]:
    """Reference BM25 (Lucene variant), one document and one query term at a time.

    A term repeated in the query counts once per occurrence, as in a Lucene boolean query of term clauses.
    """
    avg_len = sum(len(d) for d in docs) / len(docs)
    scores = []
    for doc in docs:
        tf, score = Counter(doc), 0.0
        for term in query:
            df = sum(1 for d in docs if term in d)
            if tf[term]:
                idf = math.log(1 + (len(docs) - df + 0.5) / (df + 0.5))
                score += idf * tf[term] / (tf[term] + k1 * (1 - b + b * len(doc) / avg_len))
        scores.append(score)
    return scores


def test_bm25_scores_match_a_hand_computed_example() -> None:
    # Three docs of lengths 2, 2, 4 (avgdl 8/3); "cat" occurs in docs 0 and 2 (df 2 of N 3).
    index = Index([{"id": "0", "text": "cat sat"}, {"id": "1", "text": "dog ran"},
                   {"id": "2", "text": "cat cat dog slept"}])
    idf = math.log(1 + (3 - 2 + 0.5) / (2 + 0.5))  # = ln 1.6

    def norm(length: int) -> float:
        return 1.5 * (0.25 + 0.75 * length / (8 / 3))

    expected = [idf * 1 / (1 + norm(2)), 0.0, idf * 2 / (2 + norm(4))]
    assert index.scores("cat").tolist() == pytest.approx(expected, rel=1e-6)
    assert [hit.id for hit in index.search(["cat"], k=3)[0]] == ["2", "0"]  # doc 1 has no "cat": not returned
    assert index.scores("cat cat").tolist() == pytest.approx([2 * x for x in expected], rel=1e-6)


def test_bm25_matches_a_plain_loop_reference_on_random_corpora() -> None:
    rng = random.Random(0)
    words = [f"w{i}" for i in range(40)]
    for _ in range(5):
        docs = [" ".join(rng.choices(words, k=rng.randint(1, 30))) for _ in range(rng.randint(2, 60))]
        index = Index([{"id": str(i), "text": text} for i, text in enumerate(docs)])
        tokens = [tokenize(text) for text in docs]
        for _ in range(10):
            query = " ".join(rng.choices(words + ["unseen"], k=rng.randint(1, 5)))
            reference = lucene_bm25_loop(tokens, tokenize(query))
            assert index.scores(query).tolist() == pytest.approx(reference, rel=1e-5, abs=1e-6)
            hits = index.search([query], k=4)[0]
            ranked = sorted((i for i, s in enumerate(reference) if s > 1e-6),
                            key=lambda i: (-reference[i], i))
            # Top-4 scores agree (ids may differ only between float32 ties).
            assert [h.score for h in hits] == pytest.approx([reference[i] for i in ranked[:4]], rel=1e-5)


def test_bad_corpus_lines_name_the_line(tmp_path: Path) -> None:
    cases = {
        '{"id": "a", "text": "x"}\n{"id": "b", "text": 5}\n': "corpus.jsonl:2: 'text' must be a string",
        '{"id": "a", "text": "x"}\n\nnot json\n': "corpus.jsonl:3: not valid JSON",
        '{"id": "a", "text": "x"}\n{"id": "a", "text": "y"}\n': "corpus.jsonl:2: duplicate id 'a'",
        '["a"]\n': "corpus.jsonl:1: each line must be a JSON object",
        '{"text": "x"}\n': "corpus.jsonl:1: 'id' must be a non-empty string",
    }
    for content, message in cases.items():
        (tmp_path / "corpus.jsonl").write_text(content)
        with pytest.raises(ConfigError, match=message):
            build_index(tmp_path / "corpus.jsonl", tmp_path / "index")
    with pytest.raises(ConfigError, match="does not exist"):
        build_index(tmp_path / "missing.jsonl", tmp_path / "index")
    with pytest.raises(ConfigError, match="not a readable index"):
        Index.load(tmp_path / "nowhere")
    with pytest.raises(ConfigError, match="k must be a positive integer"):
        Index([{"id": "a", "text": "x"}]).search(["x"], k=0)


def test_service_in_process_errors_and_client(corpus_dir: Path) -> None:
    index = Index([json.loads(line) for line in (corpus_dir / "corpus.jsonl").read_text().splitlines()])
    app = create_retrieval_app(index, token="tok", max_k=5, max_body_bytes=4096)
    auth = {"Authorization": "Bearer tok"}
    with TestClient(app) as http:
        assert http.get("/health").json()["num_docs"] == 300  # no token needed
        response = http.post("/retrieve", json={"queries": [index.titles[7], index.titles[9]], "k": 2},
                             headers=auth)
        assert response.status_code == 200
        results = response.json()["results"]
        assert [r[0]["id"] for r in results] == [index.ids[7], index.ids[9]]
        assert set(results[0][0]) == {"id", "title", "text", "score"}
        for body, status, fragment in [
            ({"queries": ["x"], "k": 6}, 422, "k: Input should be less than or equal to 5"),
            # Strict: true is no number.
            ({"queries": ["x"], "k": True}, 422, "k: Input should be a valid integer"),
            ({"queries": ["x"], "k": "2"}, 422, "k: Input should be a valid integer"),
            ({"queries": [], "k": 2}, 422, "queries"),
            ({"queries": "x"}, 422, "queries"),
            ({"queries": ["x"], "extra": 1}, 422, "extra"),
            ({"queries": ["x" * 5000]}, 413, "exceeds the limit"),
        ]:
            response = http.post("/retrieve", json=body, headers=auth)
            assert response.status_code == status, body
            assert fragment in response.json()["error"]["message"]
        response = http.post("/retrieve", content=b"{not json",
                             headers={**auth, "Content-Type": "application/json"})
        assert response.status_code == 422 and response.json()["error"]["type"] == "RequestRejected"
        response = http.post("/retrieve", json={"queries": ["x"]})
        assert response.status_code == 401 and response.json()["error"]["type"] == "AuthenticationError"
        assert http.get("/nope", headers=auth).json()["error"]["type"] == "NotFound"
        metrics = http.get("/metrics", headers=auth).text
        assert "agentgym_retrieval_queries_total 2.0" in metrics
        assert 'agentgym_retrieval_errors_total{type="RequestRejected"}' in metrics

        client = RetrievalClient("http://testserver", token="tok", client=http)
        hits = client.retrieve([index.titles[3]], k=3)
        assert hits == index.search([index.titles[3]], k=3)
        with pytest.raises(RequestRejected, match="k: Input should be less than or equal to 5"):
            client.retrieve(["x"], k=50)
        # an integral float is an integer (JSON Schema's reading), and the bounds are in the schema
        assert http.post("/retrieve", json={"queries": ["x"], "k": 2.0}, headers=auth).status_code == 200
        schema = app.openapi()["components"]["schemas"]["RetrieveRequest"]["properties"]
        assert (schema["k"]["minimum"], schema["k"]["maximum"]) == (1, 5)
        with pytest.raises(AuthenticationError):
            RetrievalClient("http://testserver", client=http).retrieve(["x"])


def test_two_services_in_one_process_answer_from_their_own_index() -> None:
    """The routes are shared functions: each reaches its own app's index, bounds and metrics."""
    ships = Index([{"id": "s1", "title": "Ostavia", "text": "A ship."},
                   {"id": "s2", "title": "Brel", "text": "A boat."}])
    towns = Index([{"id": "t1", "title": "Ostavia", "text": "A town."}])
    with TestClient(create_retrieval_app(ships, max_k=2)) as first, \
            TestClient(create_retrieval_app(towns, max_k=7)) as second:
        assert first.get("/health").json() == {"status": "ok", "num_docs": 2, "max_k": 2}
        assert second.get("/health").json() == {"status": "ok", "num_docs": 1, "max_k": 7}
        for http, doc_id in ((first, "s1"), (second, "t1")):
            found = http.post("/retrieve", json={"queries": ["Ostavia"], "k": 1}).json()["results"]
            assert [[hit["id"] for hit in hits] for hits in found] == [[doc_id]]
        assert first.post("/retrieve", json={"queries": ["Ostavia"], "k": 5}).status_code == 422
        assert second.post("/retrieve", json={"queries": ["Ostavia"], "k": 5}).status_code == 200
        assert "agentgym_retrieval_requests_total 1.0" in first.get("/metrics").text
        assert "agentgym_retrieval_requests_total 2.0" in second.get("/metrics").text


def test_service_over_a_real_socket(corpus_dir: Path, tmp_path: Path) -> None:
    build_index(corpus_dir / "corpus.jsonl", tmp_path / "index")
    server = LiveServer(create_retrieval_app(tmp_path / "index"))
    try:
        with RetrievalClient(server.url, timeout_s=10) as client:
            assert client.health()["num_docs"] == 300
            local = Index.load(tmp_path / "index")
            queries = local.titles[:16]
            assert client.retrieve(queries, k=3) == local.search(queries, k=3)
        raw = httpx.post(f"{server.url}/retrieve", content=b"x" * (2 * 1024 * 1024),
                         headers={"Content-Type": "application/json"}, timeout=10)
        assert raw.status_code == 413
    finally:
        server.stop()
    # Nothing listens any more: connection errors are retried, then reported as a RemoteEnvError.
    with RetrievalClient(server.url, retries=1, timeout_s=2) as client, pytest.raises(RemoteEnvError):
        client.retrieve(["x"])
