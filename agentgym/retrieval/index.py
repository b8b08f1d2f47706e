"""Document retrieval: ``Index`` (BM25 over a ``{id, title, text}`` corpus), ``build_index``, ``Hit``,
``DenseRetriever``.

The BM25 index is ``bm25s`` (Lucene scoring, k1 = 1.5, b = 0.75 by default): it stores each
(term, document) pair's precomputed BM25 contribution in a sparse matrix, so a query is a sum of a
few posting slices. agentgym tokenises (``tokenize``: lowercase alphanumerics, no stopwords, no
stemming) and ranks the top k itself, so ties come out in corpus order and documents sharing no
term with the query are never returned.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from agentgym.errors import ConfigError

#: Index format version written to ``meta.json``; ``Index.load`` refuses others.
FORMAT_VERSION = 2
_TOKEN_RE = re.compile(r"[a-z0-9]+")
# A short English stopword list: function words that carry no retrieval signal.
STOPWORDS = frozenset({
    "a", "an", "and", "are", "as", "at", "be", "by", "for", "from", "has", "have", "he", "her", "his",
    "in", "is", "it", "its", "of", "on", "or", "she", "that", "the", "their", "they", "this", "to", "was",
    "were", "which", "who", "whom", "with", "what", "when", "where", "why", "how", "did", "does", "do",
})


def tokenize(text: str) -> list[str]:
    """Lowercased alphanumeric tokens of ``text`` without stopwords (no stemming).

    Example:
        >>> tokenize("Who founded Zorvex Labs in 1987?")
        ['founded', 'zorvex', 'labs', '1987']
    """
    return [token for token in _TOKEN_RE.findall(text.lower()) if token not in STOPWORDS]


@dataclass(frozen=True)
class Hit:
    """One retrieved document."""

    id: str
    """The document id from the corpus."""
    title: str
    """Its title."""
    text: str
    """Its text."""
    score: float
    """Retrieval score (BM25 or cosine similarity); higher is better, comparable within one query."""

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "title": self.title, "text": self.text, "score": self.score}


class Retriever(Protocol):
    """Anything that answers batched queries with ranked hits.

    ``search(queries, k)`` returns one list per query, best first, at most ``k`` hits each (fewer
    when fewer documents match). ``Index``, ``DenseRetriever`` and ``RetrievalClient`` implement it.
    """

    def search(self, queries: Sequence[str], k: int) -> list[list[Hit]]: ...


def read_corpus(path: str | Path) -> list[dict[str, str]]:
    """The documents of a corpus JSONL file, one ``{"id", "title", "text"}`` object per line.

    ``title`` may be missing (empty); blank lines are skipped. Ids must be unique.

    Raises:
        ConfigError: the file is missing, or a line is not such an object (the message names the
            line number and what is wrong).
    """
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"corpus file {str(path)!r} does not exist; "
                          "give a JSONL file of {id, title, text} lines")
    docs: list[dict[str, str]] = []
    seen: set[str] = set()
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            docs.append(_check_doc(line, number, path, seen))
    if not docs:
        raise ConfigError(f"corpus file {str(path)!r} has no documents")
    return docs


def _check_doc(line: str, number: int, path: Path, seen: set[str]) -> dict[str, str]:
    where = f"{path}:{number}"
    try:
        doc = json.loads(line)
    except ValueError as exc:
        raise ConfigError(f"{where}: not valid JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise ConfigError(f"{where}: each line must be a JSON object with 'id', 'title' and 'text'")
    doc_id, title, text = doc.get("id"), doc.get("title", ""), doc.get("text")
    if isinstance(doc_id, int) and not isinstance(doc_id, bool):
        doc_id = str(doc_id)
    if not isinstance(doc_id, str) or not doc_id:
        raise ConfigError(f"{where}: 'id' must be a non-empty string, got {doc_id!r:.60}")
    if not isinstance(text, str):
        raise ConfigError(f"{where}: 'text' must be a string, got {text!r:.60}")
    if not isinstance(title, str):
        raise ConfigError(f"{where}: 'title' must be a string, got {title!r:.60}")
    if doc_id in seen:
        raise ConfigError(f"{where}: duplicate id {doc_id!r}")
    seen.add(doc_id)
    return {"id": doc_id, "title": title, "text": text}


def _bm25s() -> Any:
    """The ``bm25s`` module, or a ``ConfigError`` naming the extra that installs it."""
    try:
        import bm25s
    except ImportError:
        raise ConfigError("the BM25 index needs bm25s: pip install 'agentgym-rl[search]' "
                          "(or pip install bm25s)") from None
    return bm25s


class Index:
    """A BM25 index over a corpus; ``search`` is batched and thread-safe (read-only arrays).

    Args:
        docs: documents with ``id``, ``title`` and ``text`` (title and text are both indexed).
        k1: BM25 term-frequency saturation.
        b: BM25 length normalisation.

    Raises:
        ConfigError: no documents, ``k1``/``b`` out of range, or ``bm25s`` is not installed.

    Example:
        >>> index = Index([{"id": "1", "title": "Zorvex Labs", "text": "A company in Tarnholm."},
        ...                {"id": "2", "title": "Tarnholm", "text": "A city in Ostavia."}])
        >>> [hit.id for hit in index.search(["Tarnholm city"], k=2)[0]]
        ['2', '1']
    """

    def __init__(self, docs: Iterable[Mapping[str, str]], *, k1: float = 1.5, b: float = 0.75) -> None:
        if not (k1 > 0 and 0 <= b <= 1):
            raise ConfigError(f"BM25 needs k1 > 0 and 0 <= b <= 1, got k1={k1}, b={b}")
        self.ids: list[str] = []
        self.titles: list[str] = []
        self.texts: list[str] = []
        tokens: list[list[str]] = []
        for doc in docs:
            self.ids.append(str(doc["id"]))
            self.titles.append(str(doc.get("title", "")))
            self.texts.append(str(doc["text"]))
            tokens.append(tokenize(f"{self.titles[-1]} {self.texts[-1]}"))
        if not self.ids:
            raise ConfigError("an index needs at least one document")
        self.k1, self.b = float(k1), float(b)
        self.bm25 = _bm25s().BM25(k1=self.k1, b=self.b, method="lucene")
        self.bm25.index(tokens, show_progress=False)

    def __len__(self) -> int:
        return len(self.ids)

    def search(self, queries: Sequence[str], k: int = 3) -> list[list[Hit]]:
        """The top ``k`` documents for each query, best first (ties: corpus order).

        Documents sharing no term with the query are not returned, so a list may be shorter than ``k``.

        Raises:
            ConfigError: ``k`` is not a positive integer or ``queries`` is not a list of strings.
        """
        if isinstance(queries, str) or not all(isinstance(q, str) for q in queries):
            raise ConfigError("queries must be a list of strings")
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ConfigError(f"k must be a positive integer, got {k!r}")
        return [self._search_one(query, k) for query in queries]

    def scores(self, query: str) -> np.ndarray:
        """BM25 score of every document for ``query`` (float32, corpus order; 0 where no term matches).

        A term repeated in the query counts once per occurrence (a Lucene boolean query of term clauses).
        """
        term_ids = self.bm25.get_tokens_ids(tokenize(query))  # unknown terms dropped
        if not term_ids:  # bm25s cannot score an empty query; nothing matches it
            return np.zeros(len(self.ids), np.float32)
        return np.asarray(self.bm25.get_scores_from_ids(term_ids), np.float32)

    def _search_one(self, query: str, k: int) -> list[Hit]:
        scores = self.scores(query)
        matched = np.flatnonzero(scores > 0)
        if matched.size > k:
            kth = np.partition(scores[matched], matched.size - k)[matched.size - k]
            matched = matched[scores[matched] >= kth]  # keeps every tie at the cut, sorted below
        best = matched[np.lexsort((matched, -scores[matched]))][:k]
        return [Hit(self.ids[i], self.titles[i], self.texts[i], float(scores[i])) for i in best.tolist()]

    # --- persistence ------------------------------------------------------------------------------

    def save(self, out_dir: str | Path) -> Path:
        """Write the index to ``out_dir`` (created): ``meta.json``, ``docs.jsonl`` and ``bm25s/``."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        with (out / "docs.jsonl").open("w", encoding="utf-8") as handle:
            for doc_id, title, text in zip(self.ids, self.titles, self.texts, strict=True):
                handle.write(json.dumps({"id": doc_id, "title": title, "text": text}, ensure_ascii=False)
                             + "\n")
        self.bm25.save(out / "bm25s", show_progress=False)
        meta = {"format": FORMAT_VERSION, "kind": "bm25s", "k1": self.k1, "b": self.b,
                "num_docs": len(self.ids)}
        (out / "meta.json").write_text(json.dumps(meta), encoding="utf-8")
        return out

    @classmethod
    def load(cls, index_dir: str | Path) -> Index:
        """Read an index written by ``save`` / ``build_index``.

        Raises:
            ConfigError: the directory is missing, incomplete, or of another format version.
        """
        where = Path(index_dir)
        try:
            meta = json.loads((where / "meta.json").read_text(encoding="utf-8"))
            docs = [json.loads(line)
                    for line in (where / "docs.jsonl").read_text(encoding="utf-8").splitlines()]
        except (OSError, ValueError) as exc:
            raise ConfigError(f"{str(where)!r} is not a readable index directory ({exc}); build one with "
                              "agentgym.retrieval.build_index(corpus_jsonl, out_dir)") from None
        if meta.get("format") != FORMAT_VERSION or meta.get("kind") != "bm25s":
            raise ConfigError(f"{str(where)!r} has index format {meta.get('format')!r}; "
                              "rebuild it with build_index")
        try:
            bm25 = _bm25s().BM25.load(where / "bm25s", show_progress=False)
        except (OSError, ValueError, KeyError) as exc:
            raise ConfigError(f"{str(where / 'bm25s')!r} is not a readable bm25s index ({exc}); rebuild it "
                              "with build_index") from None
        index = cls.__new__(cls)
        index.k1, index.b = float(meta["k1"]), float(meta["b"])
        index.ids = [d["id"] for d in docs]
        index.titles = [d["title"] for d in docs]
        index.texts = [d["text"] for d in docs]
        index.bm25 = bm25
        if len(index.ids) != meta["num_docs"] or bm25.scores["num_docs"] != len(index.ids):
            raise ConfigError(f"{str(where)!r} is inconsistent (docs.jsonl does not match the bm25s index); "
                              "rebuild it")
        return index


def build_index(corpus_jsonl: str | Path, out_dir: str | Path, *, k1: float = 1.5, b: float = 0.75) -> Index:
    """Build a BM25 index of a corpus JSONL file (``{"id", "title", "text"}`` per line) into ``out_dir``.

    Raises:
        ConfigError: a bad corpus line (the message names the line number) or bad ``k1``/``b``.

    Example:
        >>> import tempfile, pathlib
        >>> tmp = pathlib.Path(tempfile.mkdtemp())
        >>> _ = (tmp / "corpus.jsonl").write_text('{"id": "d1", "title": "Ostavia", "text": "A country."}\\n')
        >>> index = build_index(tmp / "corpus.jsonl", tmp / "index")
        >>> Index.load(tmp / "index").search(["ostavia"], k=1)[0][0].id
        'd1'
    """
    index = Index(read_corpus(corpus_jsonl), k1=k1, b=b)
    index.save(out_dir)
    return index


class DenseRetriever:
    """Dense retrieval with a local sentence-transformers model (optional, ``search`` extra).

    A thin wrapper: it embeds every document once (``title. text``) with the model found in
    ``model_dir`` and ranks by cosine similarity with numpy. It never downloads anything. It is not
    exercised by the test suite (no model weights ship with agentgym); BM25 (``Index``) is the
    tested default.

    Args:
        model_dir: a local directory holding a sentence-transformers model.
        docs: the corpus (``read_corpus`` output or any ``{id, title, text}`` mappings).
        batch_size: encoding batch size.
        device: torch device for the model (``None``: its default).

    Raises:
        ConfigError: ``sentence_transformers`` is not installed, or ``model_dir`` is not a directory.
    """

    def __init__(self, model_dir: str | Path, docs: Sequence[Mapping[str, str]], *, batch_size: int = 64,
                 device: str | None = None) -> None:
        try:
            from sentence_transformers import SentenceTransformer
        except ImportError:
            raise ConfigError("DenseRetriever needs sentence-transformers: pip install sentence-transformers "
                              "(or use the BM25 Index)") from None
        if not Path(model_dir).is_dir():
            raise ConfigError(f"model_dir {str(model_dir)!r} is not a directory holding a "
                              "sentence-transformers model")
        self.model = SentenceTransformer(str(model_dir), device=device)
        self.batch_size = batch_size
        self.docs = [{"id": str(d["id"]), "title": str(d.get("title", "")), "text": str(d["text"])}
                     for d in docs]
        texts = [f"{d['title']}. {d['text']}" if d["title"] else d["text"] for d in self.docs]
        self.embeddings = self._encode(texts)

    def _encode(self, texts: Sequence[str]) -> np.ndarray:
        vectors = self.model.encode(list(texts), batch_size=self.batch_size, convert_to_numpy=True,
                                    normalize_embeddings=True, show_progress_bar=False)
        return np.asarray(vectors, dtype=np.float32)

    def search(self, queries: Sequence[str], k: int = 3) -> list[list[Hit]]:
        """The ``k`` documents most similar to each query, best first."""
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ConfigError(f"k must be a positive integer, got {k!r}")
        scores = self._encode(queries) @ self.embeddings.T  # (num_queries, num_docs)
        top = min(k, scores.shape[1])
        results = []
        for row in scores:
            best = np.argsort(-row, kind="stable")[:top]
            results.append([Hit(**self.docs[i], score=float(row[i])) for i in best.tolist()])
        return results

