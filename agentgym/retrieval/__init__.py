"""Document retrieval for search tools: a BM25 ``Index``, a retrieval HTTP service and its client.

``agentgym.retrieval.service`` (``create_retrieval_app``, ``RetrievalClient``) needs the ``server``
extra (FastAPI); the index itself needs only numpy.
"""

from __future__ import annotations

from agentgym.retrieval.index import DenseRetriever, Hit, Index, Retriever, build_index, read_corpus, tokenize

__all__ = ["DenseRetriever", "Hit", "Index", "Retriever", "build_index", "read_corpus", "tokenize"]
