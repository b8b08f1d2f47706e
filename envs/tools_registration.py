"""``register_tool_envs``: registers the tool-using envs (search-qa, code-math, code-tests, tools)."""

from __future__ import annotations

from agentgym.registry import register


def register_tool_envs() -> None:
    """Register ``search-qa-v0``, ``code-math-v0``, ``code-tests-v0`` and ``tools-v0``.

    Idempotent: every id is registered with ``override=True``, so calling it twice is harmless.
    Each is registered with ``action_format="raw"``: the env reads the whole reply (tags, tool calls,
    code blocks) and answers what it cannot use with ``info["invalid_action"]``.

    Example:
        >>> import agentgym
        >>> register_tool_envs()
        >>> agentgym.spec("search-qa-v0").max_turns, agentgym.spec("search-qa-v0").action_format
        (8, 'raw')
    """
    register(
        "search-qa-v0",
        "agentgym.envs.search_qa:SearchQAEnv",
        description="Search-R1-style multi-hop QA: <search> a BM25-indexed corpus, then <answer> (EM reward). "
        "Default: synthetic fictional corpus. Expert: hop-by-hop searcher.",
        # Synthetic questions need at most 3 searches and an answer; the rest allows mistakes.
        max_turns=8,
        action_format="raw",
        override=True,
    )
    register(
        "code-math-v0",
        "agentgym.envs.code_math:CodeMathEnv",
        description="ReTool-style math word problems with a sandboxed, stateful <python> tool, then <answer> "
        "(exact-value reward). Generated problems, 7 templates. Expert: runs a solution cell, answers its output.",
        # The expert needs one cell and the answer; the rest allows failed cells and slips.
        max_turns=8,
        action_format="raw",
        override=True,
    )
    register(
        "code-tests-v0",
        "agentgym.envs.code_tests:CodeTestsEnv",
        description="Write a Python function in a ```python block; sandboxed hidden unit tests, feedback on "
        "failures, 3 submissions; reward = fraction of tests passed. 36 bundled problems. Expert: reference.",
        # Three submissions plus room for two replies without code.
        max_turns=5,
        action_format="raw",
        override=True,
    )
    register(
        "tools-v0",
        "agentgym.envs.function_calling:FunctionCallingEnv",
        description="BFCL-style multi-turn function calling: calculator, unit converter and a key-value database "
        "(lookup/update/list_keys/delete) behind <tool_call> JSON; checked on the final database and the answer. "
        "Expert: scripted tool user.",
        # The expert needs at most 4 turns; the rest allows retries after tool errors and slips.
        max_turns=10,
        action_format="raw",
        override=True,
    )
