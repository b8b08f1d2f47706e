"""BM25 index build/load/search, the retrieval service (in-process and over a socket) and its client."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from conftest import LiveServer
from fastapi.testclient import TestClient

from agentgym.envs.synthetic_qa import generate_corpus, write_jsonl
from agentgym.errors import AuthenticationError, ConfigError, RemoteEnvError, RequestRejected
from agentgym.retrieval import Index, build_index
from agentgym.retrieval.service import RetrievalClient, create_retrieval_app

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
    for doc, hits in zip(docs, loaded.search(queries, k=3)):
        assert hits[0].id == doc["id"], doc["title"]
        assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
    assert loaded.search(queries[:20], k=5) == built.search(queries[:20], k=5)
    assert loaded.search(["zzzz qqqq"], k=3) == [[]]  # nothing shares a term: no hits, not random ones


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
        response = http.post("/retrieve", json={"queries": [index.titles[7], index.titles[9]], "k": 2}, headers=auth)
        assert response.status_code == 200
        results = response.json()["results"]
        assert [r[0]["id"] for r in results] == [index.ids[7], index.ids[9]]
        assert set(results[0][0]) == {"id", "title", "text", "score"}
        for body, status, fragment in [
            ({"queries": ["x"], "k": 6}, 422, "k must be in [1, 5]"),
            ({"queries": [], "k": 2}, 422, "queries"),
            ({"queries": "x"}, 422, "queries"),
            ({"queries": ["x"], "extra": 1}, 422, "extra"),
            ({"queries": ["x" * 5000]}, 413, "exceeds the limit"),
        ]:
            response = http.post("/retrieve", json=body, headers=auth)
            assert response.status_code == status, body
            assert fragment in response.json()["error"]["message"]
        response = http.post("/retrieve", content=b"{not json", headers={**auth, "Content-Type": "application/json"})
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
        with pytest.raises(RequestRejected, match="k must be"):
            client.retrieve(["x"], k=50)
        with pytest.raises(AuthenticationError):
            RetrievalClient("http://testserver", client=http).retrieve(["x"])


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
