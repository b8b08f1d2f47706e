"""Document retrieval for search tools: a BM25 ``Index``, a retrieval HTTP service, its client and a
synthetic corpus.

``agentgym.retrieval.service`` (``create_retrieval_app``) needs the ``server`` extra (FastAPI);
``agentgym.retrieval.client`` (``RetrievalClient``) needs only httpx and the index only numpy.
``agentgym.retrieval.synthetic`` generates the built-in multi-hop corpus and its questions.
"""

from __future__ import annotations

from agentgym.retrieval.index import DenseRetriever, Hit, Index, Retriever, build_index, read_corpus, tokenize

__all__ = ["DenseRetriever", "Hit", "Index", "Retriever", "build_index", "read_corpus", "tokenize"]
