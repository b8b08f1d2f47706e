"""``WebShopEnv`` (``webshop-v0``): shop for the product an instruction describes, WebShop's pages in text."""

from __future__ import annotations

import functools
import re
from typing import Any, ClassVar

from agentgym.core import HELD_OUT_SEED_START, Env, TaskSplit
from agentgym.envs.webshop.catalog import DEFAULT_NUM_PRODUCTS, Catalog, Goal, generate_catalog
from agentgym.envs.webshop.data import load_webshop_catalog
from agentgym.envs.webshop.reward import FUZZY_THRESHOLD, normalize_color, score_purchase, token_set_ratio
from agentgym.envs.webshop.search import canonical_query, search_engine
from agentgym.errors import ConfigError
from agentgym.snapshot import pack_snapshot, unpack_snapshot

#: Results shown per page (WebShop: 10).
RESULTS_PER_PAGE = 10
#: The pages; ``description`` and ``features`` are also the buttons that open them.
SEARCH, RESULTS, ITEM, BOUGHT = "search", "results", "item", "bought"
DESCRIPTION, FEATURES = "description", "features"
BACK_TO_SEARCH, PREV, NEXT, BUY_NOW = "back to search", "< prev", "next >", "buy now"
#: The search page's one admissible action, WebShop-style: the agent writes its own query.
SEARCH_TEMPLATE = "search[<query>]"
#: Goals held out for testing: WebShop tests on its first 500 goals and trains on the rest. A catalog of
#: fewer than 5,000 goals holds out its first tenth instead (at least one goal), so both splits have tasks.
MAX_TEST_GOALS = 500

_ACTION_RE = re.compile(r"(search|click)\[(.*)\]", re.IGNORECASE | re.DOTALL)
_TASK_RE = re.compile(r"webshop/([A-Za-z0-9.-]+)/(\d+)")
_ECHO_CHARS = 80
_INSTRUCTIONS = (
    "You are shopping in an online store for the product that the instruction describes. Each turn, answer "
    "with one action:\n"
    "- search[your query] on the search page looks for products;\n"
    "- click[button] presses a button shown in brackets on the page: a product id opens that product, an "
    "option value chooses it, [description] and [features] show more about the product, [next >] and "
    "[< prev] page through results (10 per page) or go back, [back to search] starts a new search, and "
    "[buy now] buys the product with the chosen options, which ends the episode.\n"
    "The purchase scores how well the product, its options and its price fit the instruction."
)


def format_task_id(catalog: Catalog, goal_index: int) -> str:
    """The task id of goal ``goal_index`` of ``catalog``.

    Example:
        >>> format_task_id(generate_catalog(0, 20), 3)
        'webshop/gen-s0-n20/3'
    """
    return f"webshop/{catalog.name}/{goal_index}"


def num_test_goals(num_goals: int) -> int:
    """How many of a catalog's first goals form its ``test`` split (the rest form ``train``).

    Example:
        >>> num_test_goals(12087), num_test_goals(500), num_test_goals(15), num_test_goals(1)
        (500, 50, 1, 0)
    """
    if num_goals < 2:  # one goal cannot be both trained on and held out
        return 0
    return min(MAX_TEST_GOALS, max(1, num_goals // 10))


def _shown(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _ECHO_CHARS else text[:_ECHO_CHARS] + "..."


@functools.lru_cache(maxsize=65536)
def _expert_options(catalog: Catalog, goal_index: int, asin: str) -> tuple[tuple[str, str], ...] | None:
    """The options that make buying ``asin`` earn reward 1 for the goal (group, value), or ``None`` if no
    choice of options does: the product is then not worth buying."""
    goal = catalog.goals[goal_index]
    product = catalog.by_asin[asin]
    wanted = [normalize_color(value) for _, value in goal.options]
    chosen: dict[str, str] = {}
    for name, values in product.options:
        for value in values:
            if product.option_group(value) != name:
                continue  # a value shown in two groups: clicking it sets the first group only
            if any(token_set_ratio(normalize_color(value), w) > FUZZY_THRESHOLD for w in wanted):
                chosen[name] = value
                break
    if score_purchase(product, chosen, goal).reward < 1.0:
        return None
    return tuple(chosen.items())


class WebShopEnv(Env):
    """WebShop (Yao et al. 2022) in text: search a catalog, open products, choose options, buy.

    Reset picks a goal (by the seed, or ``options={"task_id": "webshop/gen-s0-n500/17"}``, or a task of a
    split: ``options={"split": "test", "index": 3}``) and shows the search page with the instruction
    ("i need a waterproof mascara, with color: black, and price lower than 40.00 dollars"). Actions are
    ``search[query]`` (search page only: BM25 over the catalog, at most 50 results) and ``click[button]``
    for a button shown in brackets:

    - results page: a product id (opens it), ``next >`` / ``< prev`` (10 results per page),
      ``back to search``;
    - product page: an option value (chooses it within its group), ``description``, ``features``,
      ``< prev`` (back to the results page), ``back to search``, ``buy now``;
    - description and features pages: ``< prev`` (back to the product), ``back to search``.

    ``buy now`` terminates the episode with WebShop's reward (``envs.webshop.reward``);
    ``info["success"]`` is reward == 1 and ``info["purchase"]`` holds the score's parts. Any other action
    changes nothing, earns 0 and sets ``info["invalid_action"]``, with an observation saying why.
    ``info["admissible_actions"]`` lists the clickables of the page, and ``"search[<query>]"`` on the search
    page. ``info["state_key"]`` names the page: the search page; a results page by its query's index words
    and page number; a product page by product id and chosen options (and the sub-page). Where ``< prev``
    leads from a product page is navigation history and stays out of the key.

    The expert searches with the instruction's words (or, when no result of those can earn reward 1, the
    target's title), pages to the first result that can earn reward 1 (the target or an equally
    satisfying product), chooses the options that match, and buys.

    Task splits (``task_splits``): ``test``, the catalog's first goals (``num_test_goals``: 500, as in
    WebShop, or a tenth of a smaller catalog), and ``train``, the rest; task ``i`` of ``train`` is goal
    ``num_test_goals + i``. A seeded reset draws a ``test`` goal for a held-out seed (``HELD_OUT_SEED_START``
    and above, the seeds evaluations use) and a ``train`` goal for any other.

    Args:
        catalog_seed: seed of the generated catalog.
        num_products: size of the generated catalog (goals: one per product).
        data_dir: a folder with WebShop's released files (``envs.webshop.data``) to shop in instead.

    Raises:
        ConfigError: an argument is out of range, or the data folder cannot be read.

    Example:
        >>> env = WebShopEnv(num_products=60)
        >>> obs, info = env.reset(seed=0)
        >>> info["admissible_actions"]
        ['search[<query>]']
        >>> rewards = []
        >>> while (action := env.expert_action()) is not None:
        ...     obs, reward, terminated, _, info = env.step(action)
        ...     rewards.append(reward)
        >>> rewards[-1], info["success"], terminated
        (1.0, True, True)
    """

    has_expert: ClassVar[bool] = True
    supports_snapshot: ClassVar[bool] = True
    #: Every step pays 0 except buying, which pays WebShop's reward in [0, 1].
    reward_range: ClassVar[tuple[float, float]] = (0.0, 1.0)

    def __init__(self, catalog_seed: int = 0, num_products: int = DEFAULT_NUM_PRODUCTS,
                 data_dir: str | None = None) -> None:
        if isinstance(catalog_seed, bool) or not isinstance(catalog_seed, int) or catalog_seed < 0:
            raise ConfigError(f"catalog_seed must be a non-negative integer, got {catalog_seed!r}")
        self.catalog = (load_webshop_catalog(str(data_dir)) if data_dir is not None
                        else generate_catalog(catalog_seed, num_products))
        self.engine = search_engine(self.catalog)
        self._goal_index = -1
        self._page = SEARCH
        self._typed_query = ""
        self._results: tuple[str, ...] = ()
        self._page_number = 1
        self._asin = ""
        self._chosen: dict[str, str] = {}

    # --- the contract ----------------------------------------------------------------------------

    def choose_task(self, seed: int | None) -> int:
        """A goal index drawn from the seeded ``np_random``, among the held-out goals for held-out seeds."""
        # Held-out seeds (the evaluations') draw held-out goals, training seeds the others: a run's
        # evaluation never replays an instruction it trained on.
        total = len(self.catalog.goals)
        held = num_test_goals(total)
        first, count = ((0, held) if seed is not None and seed >= HELD_OUT_SEED_START and held
                        else (held, total - held) if total > held else (0, total))
        return first + int(self.np_random.integers(count))

    def start_task(self, task: int, options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        self._goal_index = task
        self._go_to_search()
        info = self._info(invalid=False)
        info["instructions"] = _INSTRUCTIONS
        return self._observe(), info

    def task_splits(self) -> tuple[TaskSplit, ...]:
        """``train`` and ``test``: disjoint goals of the catalog (see the class docstring)."""
        total = len(self.catalog.goals)
        held = num_test_goals(total)
        name = self.catalog.name
        splits = (TaskSplit("train", total - held, f"goals {held}..{total - 1} of catalog {name}"),
                  TaskSplit("test", held, f"goals 0..{held - 1} of catalog {name}, held out"))
        return tuple(split for split in splits if split.size)

    def describe_task(self, split: TaskSplit, index: int) -> dict[str, Any]:
        goal_index = index + (num_test_goals(len(self.catalog.goals)) if split.name == "train" else 0)
        return {"task_id": format_task_id(self.catalog, goal_index),
                "description": self.catalog.goals[goal_index].instruction}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        text = action.strip() if isinstance(action, str) else ""
        match = _ACTION_RE.fullmatch(text)
        if match is None:
            return self._invalid(f"{_shown(text)!r} is not an action; write search[query] or click[button]")
        verb, argument = match.group(1).lower(), " ".join(match.group(2).split())
        if verb == "search":
            if self._page != SEARCH:
                return self._invalid("search[...] works on the search page only; click[back to search] first")
            if not argument:
                return self._invalid("the search query is empty; write search[words describing the product]")
            self._typed_query, self._results = argument, self.engine.search(argument)
            self._page, self._page_number = RESULTS, 1
            return self._moved()
        return self._click(argument.lower())

    def expert_action(self) -> str | None:
        """The expert's next action (see the class docstring), or ``None`` once the episode is over."""
        if self._goal_index < 0 or self._page == BOUGHT:
            return None
        if self._page == SEARCH:
            return f"search[{self._expert_query()}]"
        if self._page == RESULTS:
            first = next((n for n, asin in enumerate(self._results) if self._plan(asin) is not None), None)
            if first is None:
                return f"click[{BACK_TO_SEARCH}]"
            page = first // RESULTS_PER_PAGE + 1
            if page != self._page_number:
                return f"click[{NEXT if page > self._page_number else PREV}]"
            return f"click[{self._results[first].lower()}]"
        if self._page in (DESCRIPTION, FEATURES):
            return f"click[{PREV}]"
        plan = self._plan(self._asin)
        if plan is None:
            return f"click[{PREV}]"
        for name, value in plan:
            if self._chosen.get(name) != value:
                return f"click[{value}]"
        return f"click[{BUY_NOW}]"

    def snapshot(self) -> bytes:
        """The goal and the page (query, results, product, chosen options) with ``np_random``, pickled."""
        return pack_snapshot(self, {
            "catalog": self.catalog.name, "goal_index": self._goal_index, "page": self._page,
            "typed_query": self._typed_query, "results": self._results, "page_number": self._page_number,
            "asin": self._asin, "chosen": dict(self._chosen)})

    def restore(self, data: bytes) -> None:
        """Reinstate a ``snapshot`` of an env over the same catalog (trusted bytes only: pickle)."""
        state = unpack_snapshot(self, data, expect={"catalog": self.catalog.name})
        self._goal_index, self._page = int(state["goal_index"]), state["page"]
        self._typed_query, self._results = state["typed_query"], tuple(state["results"])
        self._page_number, self._asin = int(state["page_number"]), state["asin"]
        self._chosen = dict(state["chosen"])

    def render(self) -> str | None:
        """The current page, or ``None`` before the first reset."""
        return None if self._goal_index < 0 else self._observe()

    # --- navigation ------------------------------------------------------------------------------

    @property
    def goal(self) -> Goal:
        """The current episode's goal (privileged: the instruction is all the agent sees of it)."""
        return self.catalog.goals[self._goal_index]

    def _go_to_search(self) -> None:
        self._page, self._typed_query, self._results, self._page_number = SEARCH, "", (), 1
        self._asin, self._chosen = "", {}

    def _click(self, button: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if button not in self._clickables():
            return self._invalid(f"there is no [{_shown(button)}] button on this page")
        page = self._page
        if button == BACK_TO_SEARCH:
            self._go_to_search()
        elif page == RESULTS:
            if button == NEXT:
                self._page_number += 1
            elif button == PREV:
                self._page_number -= 1
            else:
                self._asin = next(asin for asin in self._page_results() if asin.lower() == button)
                self._page, self._chosen = ITEM, {}
        elif page in (DESCRIPTION, FEATURES):
            self._page = ITEM
        elif button == PREV:
            self._page, self._asin, self._chosen = RESULTS, "", {}
        elif button in (DESCRIPTION, FEATURES):
            self._page = button
        elif button == BUY_NOW:
            return self._buy()
        else:
            product = self.catalog.by_asin[self._asin]
            group = product.option_group(button)
            assert group is not None  # a clickable that is no other button is an option value
            self._chosen[group] = button
        return self._moved()

    def _buy(self) -> tuple[str, float, bool, bool, dict[str, Any]]:
        product = self.catalog.by_asin[self._asin]
        score = score_purchase(product, self._chosen, self.goal)
        self._page = BOUGHT
        chosen = ", ".join(f"{name}: {value}" for name, value in self._chosen.items()) or "no options"
        obs = (f"Thank you for shopping with us! You bought {product.title} ({chosen}) for "
               f"${product.price:.2f}. Your score: {score.reward:g}")
        info = self._info(invalid=False, success=score.reward == 1.0)
        info["purchase"] = {"asin": product.asin, "options": dict(self._chosen), **score.to_info()}
        return obs, score.reward, True, False, info

    def _clickables(self) -> list[str]:
        if self._page == RESULTS:
            buttons = [BACK_TO_SEARCH]
            if self._page_number > 1:
                buttons.append(PREV)
            if self._page_number * RESULTS_PER_PAGE < len(self._results):
                buttons.append(NEXT)
            return buttons + [asin.lower() for asin in self._page_results()]
        if self._page == ITEM:
            values = [value for _, group in self.catalog.by_asin[self._asin].options for value in group]
            return [BACK_TO_SEARCH, PREV, *values, DESCRIPTION, FEATURES, BUY_NOW]
        if self._page in (DESCRIPTION, FEATURES):
            return [BACK_TO_SEARCH, PREV]
        return []

    def _page_results(self) -> tuple[str, ...]:
        start = (self._page_number - 1) * RESULTS_PER_PAGE
        return self._results[start:start + RESULTS_PER_PAGE]

    # --- the expert ------------------------------------------------------------------------------

    def _plan(self, asin: str) -> tuple[tuple[str, str], ...] | None:
        return _expert_options(self.catalog, self._goal_index, asin)

    def _expert_query(self) -> str:
        goal = self.goal
        if any(self._plan(asin) is not None for asin in self.engine.search(goal.search_text)):
            return goal.search_text
        return goal.name

    # --- observations and infos ------------------------------------------------------------------

    def _observe(self) -> str:
        lines = [f"Instruction: {self.goal.instruction}"]
        if self._page == SEARCH:
            lines.append("Search page. Write search[your query] to look for products.")
        elif self._page == RESULTS:
            lines.append(f"[{BACK_TO_SEARCH}]")
            total = len(self._results)
            if not total:
                lines.append(f"No products match {_shown(self._typed_query)!r}; go back and try other words.")
            else:
                last = (total - 1) // RESULTS_PER_PAGE + 1
                lines.append(f"Results for {_shown(self._typed_query)!r}: page {self._page_number} of {last} "
                             f"({total} products)")
                lines.append(" ".join(f"[{b}]" for b in (PREV, NEXT) if b in self._clickables()))
                for asin in self._page_results():
                    product = self.catalog.by_asin[asin]
                    lines.append(f"[{asin.lower()}] {product.title} | ${product.price:.2f}")
        else:
            product = self.catalog.by_asin[self._asin]
            lines.append(f"[{BACK_TO_SEARCH}] [{PREV}]")
            if self._page == ITEM:
                lines.append(product.title)
                lines.append(f"Price: ${product.price:.2f}")
                for name, values in product.options:
                    lines.append(f"{name}: " + " ".join(f"[{value}]" for value in values))
                chosen = ", ".join(f"{name}: {value}" for name, value in self._chosen.items())
                lines.append(f"Chosen: {chosen or 'nothing yet'}")
                lines.append(f"[{DESCRIPTION}] [{FEATURES}] [{BUY_NOW}]")
            elif self._page == DESCRIPTION:
                lines.append(f"Description: {product.description or '(none)'}")
            else:
                lines.append("Features:")
                lines.extend(f"- {feature}" for feature in product.features or ("(none)",))
        return "\n".join(line for line in lines if line)

    def _state_key(self) -> str:
        task = format_task_id(self.catalog, self._goal_index)
        if self._page == SEARCH:
            return f"{task}|search"
        if self._page == RESULTS:
            return f"{task}|results|{canonical_query(self._typed_query)}|p{self._page_number}"
        chosen = ",".join(f"{name}={value}" for name, value in sorted(self._chosen.items()))
        where = "item" if self._page != BOUGHT else "bought"
        sub = f"|{self._page}" if self._page in (DESCRIPTION, FEATURES) else ""
        return f"{task}|{where}|{self._asin}|{chosen}{sub}"

    def _info(self, *, invalid: bool, success: bool = False) -> dict[str, Any]:
        admissible = ([SEARCH_TEMPLATE] if self._page == SEARCH
                      else [f"click[{button}]" for button in self._clickables()])
        return {"state_key": self._state_key(), "task_id": format_task_id(self.catalog, self._goal_index),
                "admissible_actions": admissible, "invalid_action": invalid, "success": success}

    def _moved(self) -> tuple[str, float, bool, bool, dict[str, Any]]:
        return self._observe(), 0.0, False, False, self._info(invalid=False)

    def _invalid(self, why: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        return f"Invalid action: {why}.\n{self._observe()}", 0.0, False, False, self._info(invalid=True)

    def parse_task_id(self, task_id: Any) -> int:
        """The goal index of a task id of this catalog."""
        match = _TASK_RE.fullmatch(task_id) if isinstance(task_id, str) else None
        example = format_task_id(self.catalog, 0)
        if match is None or match.group(1) != self.catalog.name:
            raise ConfigError(f"webshop task_id {task_id!r} is not a task of this catalog; ids look like "
                              f"{example!r}")
        index = int(match.group(2))
        if index >= len(self.catalog.goals) or str(index) != match.group(2):
            raise ConfigError(f"webshop task_id {task_id!r}: goal index must be in [0, "
                              f"{len(self.catalog.goals) - 1}] without leading zeros, e.g. {example!r}")
        return index

