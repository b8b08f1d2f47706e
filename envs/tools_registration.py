"""``register_tool_envs``: registers the tool-using envs (``search-qa-v0``)."""

from __future__ import annotations

from agentgym.registry import register


def register_tool_envs() -> None:
    """Register ``search-qa-v0``.

    Idempotent: every id is registered with ``override=True``, so calling it twice is harmless.

    Example:
        >>> import agentgym
        >>> register_tool_envs()
        >>> agentgym.spec("search-qa-v0").max_turns
        8
    """
    register(
        "search-qa-v0",
        "agentgym.envs.search_qa:SearchQAEnv",
        description="Search-R1-style multi-hop QA: <search> a BM25-indexed corpus, then <answer> (EM reward). "
        "Default: synthetic fictional corpus. Expert: hop-by-hop searcher.",
        # Synthetic questions need at most 3 searches and an answer; the rest allows mistakes.
        max_turns=8,
        override=True,
    )
