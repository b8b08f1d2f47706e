"""Every built-in env's registration (id, entry point, description, max turns), one function per family.

``register_builtin_envs`` (called by ``agentgym.envs`` on import) registers them all. Registering imports
no env module: entry points are ``"agentgym.envs.<family>.<module>:<Class>"`` strings that ``make``
resolves, so the heavy families (TextWorld, ALFWorld) import their packages only when made. Every
function is idempotent (each id is registered with ``override=True``), so calling one twice is harmless.
"""

from __future__ import annotations

from agentgym.registry import register


def register_builtin_envs() -> None:
    """Register every built-in env: the games, TextWorld, the tool-using envs and ALFWorld.

    Example:
        >>> import agentgym
        >>> register_builtin_envs()
        >>> agentgym.spec("maze-v0").entry_point
        'agentgym.envs.games.maze:MazeEnv'
    """
    register_games()
    register_textworld_envs()
    register_tool_envs()
    register_alfworld_envs()
    register_harness_env()
    register_mcp_env()
    register_webshop_env()


def register_games() -> None:
    """Register the games: ``maze-v0``, ``sokoban-v0``, ``frozenlake-v0``, ``blackjack-v0``, ``wordle-v0``,
    ``tictactoe-v0`` and ``countdown-v0`` (``agentgym.envs.games``).

    Example:
        >>> import agentgym
        >>> register_games()
        >>> agentgym.spec("wordle-v0").max_turns
        12
    """
    register(
        "maze-v0",
        "agentgym.envs.games.maze:MazeEnv",
        description="Text gridworld maze generated from the seed; reach the goal. Expert: shortest path.",
        max_turns=50,
        override=True,
    )
    register(
        "sokoban-v0",
        "agentgym.envs.games.sokoban:SokobanEnv",
        description="Text Sokoban with generated solvable levels; push every box onto a goal. "
        "Expert: solver.",
        max_turns=60,
        override=True,
    )
    register(
        "frozenlake-v0",
        "agentgym.envs.games.frozenlake:FrozenLakeEnv",
        description="Frozen lake generated from the seed (Gymnasium toy text); reach G. Expert: planner.",
        max_turns=30,
        override=True,
    )
    register(
        "blackjack-v0",
        "agentgym.envs.games.blackjack:BlackjackEnv",
        description="Blackjack against a dealer standing on 17 (Gymnasium toy text). Expert: basic strategy.",
        max_turns=10,
        override=True,
    )
    register(
        "wordle-v0",
        "agentgym.envs.games.wordle:WordleEnv",
        description="Wordle: guess the seeded 5-letter word in 6 guesses. Expert: consistent-word solver.",
        # 6 guesses plus up to 6 invalid retries (invalid guesses do not use up a guess).
        max_turns=12,
        override=True,
    )
    register(
        "tictactoe-v0",
        "agentgym.envs.games.tictactoe:TicTacToeEnv",
        description="Tic-tac-toe as X against a minimax opponent of tunable strength. Expert: minimax.",
        # The agent moves at most 5 times; the rest of the budget allows invalid retries.
        max_turns=9,
        override=True,
    )
    register(
        "countdown-v0",
        "agentgym.envs.games.countdown:CountdownEnv",
        description="Countdown numbers game: reach the target with + - * /. Single turn. Expert: solver.",
        # Single turn: one answer ends the episode (an invalid one by truncation). For retries,
        # make("countdown-v0", max_attempts=3, max_turns=6).
        max_turns=1,
        override=True,
    )


def register_textworld_envs() -> None:
    """Register ``textworld-v0`` (``agentgym.envs.textworld``; needs the ``textworld`` extra).

    Registering does not import ``textworld``; making the env does (and raises ``ConfigError`` naming
    the extra when it is missing). Pick the game family with ``make("textworld-v0",
    challenge="tw-cooking", settings={...})``.

    Example:
        >>> import agentgym
        >>> register_textworld_envs()
        >>> agentgym.spec("textworld-v0").max_turns
        50
    """
    register(
        "textworld-v0",
        "agentgym.envs.textworld.games:TextWorldEnv",
        description=(
            "TextWorld games (tw-simple, tw-coin_collector, tw-treasure_hunter, tw-cooking) generated "
            "from the seed and cached on disk; act with admissible commands. Expert: winning policy."
        ),
        # ALFWorld's budget in verl-agent; the default games need 5-20 commands.
        max_turns=50,
        override=True,
    )


def register_tool_envs() -> None:
    """Register the tool-using envs: ``search-qa-v0``, ``code-math-v0``, ``code-tests-v0`` and ``tools-v0``
    (``agentgym.envs.tools``).

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
        "agentgym.envs.tools.search_qa:SearchQAEnv",
        description="Search-R1-style multi-hop QA: <search> a BM25-indexed corpus, then <answer> "
        "(EM reward). Default: synthetic fictional corpus. Expert: hop-by-hop searcher.",
        # Synthetic questions need at most 3 searches and an answer; the rest allows mistakes.
        max_turns=8,
        action_format="raw",
        override=True,
    )
    register(
        "code-math-v0",
        "agentgym.envs.tools.code_math:CodeMathEnv",
        description="ReTool-style math word problems with a sandboxed, stateful <python> tool, then <answer> "
        "(exact-value reward). Generated problems, 7 templates. "
        "Expert: runs a solution cell, answers its output.",
        # The expert needs one cell and the answer; the rest allows failed cells and slips.
        max_turns=8,
        action_format="raw",
        override=True,
    )
    register(
        "code-tests-v0",
        "agentgym.envs.tools.code_tests:CodeTestsEnv",
        description="Write a Python function in a ```python block; sandboxed hidden unit tests, feedback on "
        "failures, 3 submissions; reward = fraction of tests passed. 36 bundled problems. Expert: reference.",
        # Three submissions plus room for two replies without code.
        max_turns=5,
        action_format="raw",
        override=True,
    )
    register(
        "tools-v0",
        "agentgym.envs.tools.function_calling:FunctionCallingEnv",
        description="BFCL-style multi-turn function calling: calculator, unit converter and a key-value "
        "database (lookup/update/list_keys/delete) behind <tool_call> JSON; checked on the final database "
        "and the answer. Expert: scripted tool user.",
        # The expert needs at most 4 turns; the rest allows retries after tool errors and slips.
        max_turns=10,
        action_format="raw",
        override=True,
    )


def register_alfworld_envs() -> None:
    """Register ``alfworld-v0`` (``agentgym.envs.alfworld``; needs the ``alfworld`` extra).

    Registering does not import ``alfworld``; making the env does (and raises ``ConfigError`` naming
    the extra when it is missing). The official games are served when ``ALFWORLD_DATA`` (or
    ``data_dir=``) points at them, generated ones otherwise: ``make("alfworld-v0", split="valid_unseen",
    task_types=["pick_heat_then_place_in_recep"])``.

    Example:
        >>> import agentgym
        >>> register_alfworld_envs()
        >>> agentgym.spec("alfworld-v0").max_turns
        50
    """
    register(
        "alfworld-v0",
        "agentgym.envs.alfworld.env:AlfWorldEnv",
        description=(
            "ALFWorld household tasks (6 types) in text: official games from ALFWORLD_DATA, else games "
            "generated from ALFWorld's PDDL domain and cached; admissible commands. Expert: handcoded."
        ),
        # ALFWorld's budget in verl-agent (env.max_steps).
        max_turns=50,
        override=True,
    )


def register_harness_env() -> None:
    """Register ``harness-v0``: a user's own agent (an ``openai``-client loop, an Agents SDK or LangGraph
    agent) run once per episode against the rollout proxy (``agentgym.harness``); each of its model calls
    is one turn. Made with ``harness=`` and ``tasks=`` (the config's ``env.harness`` and ``env.tasks``).

    Example:
        >>> import agentgym
        >>> register_harness_env()
        >>> agentgym.spec("harness-v0").action_format
        'raw'
    """
    register(
        "harness-v0",
        "agentgym.harness.env:HarnessEnv",
        description="Your own agent (module:function or a command) on your tasks, its model calls served by "
        "the policy through an OpenAI-compatible rollout proxy; needs harness= and tasks=.",
        # one turn per call to the model: a guard against an agent that never stops calling
        max_turns=64,
        action_format="raw",
        override=True,
    )


def register_mcp_env() -> None:
    """Register ``mcp-v0``: tasks from a JSONL file solved with the tools of any MCP server
    (``agentgym.envs.mcp``), made with ``tasks=`` and one of ``server_command=`` or ``server_url=``.

    Example:
        >>> import agentgym
        >>> register_mcp_env()
        >>> agentgym.spec("mcp-v0").action_format
        'raw'
    """
    register(
        "mcp-v0",
        "agentgym.envs.mcp.env:MCPEnv",
        description="Tasks from a JSONL file (prompt, answer) solved with the tools of an MCP server over "
        "<tool_call> JSON, then <answer> (answer match or a checker function); needs tasks= and "
        "server_command= (stdio) or server_url= (streamable HTTP).",
        # A few tool turns and an answer; the rest allows retries after tool errors and slips.
        max_turns=10,
        action_format="raw",
        override=True,
    )


def register_webshop_env() -> None:
    """Register ``webshop-v0`` (``agentgym.envs.webshop``): WebShop's shopping pages in text over a generated
    catalog, or WebShop's released products with ``data_dir=``.

    Example:
        >>> import agentgym
        >>> register_webshop_env()
        >>> agentgym.spec("webshop-v0").max_turns
        15
    """
    register(
        "webshop-v0",
        "agentgym.envs.webshop.env:WebShopEnv",
        description="WebShop-style shopping: search[query] a BM25-indexed catalog generated from the seed "
        "(or WebShop's data_dir=), click[...] through results, options and buy now; WebShop's attribute, "
        "option, price and type reward. Expert: searches the instruction, buys a matching product.",
        # The expert needs at most 9 actions (search, 4 pages, product, 2 options, buy); the rest: slips.
        max_turns=15,
        override=True,
    )
