"""WebShop's purchase reward (Yao et al. 2022, §3.2): ``score_purchase`` and the matches it is made of.

Buying product ``y`` with chosen options ``Y_opt`` for a goal with attributes ``U_att``, options ``U_opt``
and price bound ``u_price``::

    reward = r_type * (|U_att ∩ Y_att| + |U_opt ∩ Y_opt| + 1[y_price <= u_price]) / (|U_att| + |U_opt| + 1)

- A goal attribute is matched when a product attribute fuzzily matches it (token-set ratio > 85), or it
  appears verbatim in the product's title, features or description.
- A goal option is matched when a chosen option fuzzily matches it (token-set ratio > 85), both first
  reduced to their colour name where they contain one (WebShop's ``normalize_color``).
- ``r_type`` is the type match: 1.0 when the bought product shares the goal's search query, or two of
  its category levels, or more than 20% of the goal title's type words; 0.5 when it shares none of
  those; 0.1 when it shares under 10% of the type words; 0.0 when it shares none.

Two stand-ins keep this offline and dependency-free: the token-set ratio is ``fuzz.token_set_ratio``'s
construction over ``difflib``'s similarity ratio (instead of Levenshtein's), and a title's type words are
its alphabetic words of two letters or more without stopwords (WebShop tags nouns with spaCy).

Hand-computed example: the goal "waterproof, long lasting mascara, color black, price lower than 40.00
dollars" has 2 attributes and 1 option, so the denominator is 2 + 1 + 1 = 4. A mascara of the same
query that is waterproof but not long lasting, bought in black at $24.99, matches 1 attribute, 1 option
and the price: reward = 1.0 * (1 + 1 + 1) / 4 = 0.75. Bought in brown it would be (1 + 0 + 1) / 4 = 0.5;
a shampoo (no shared category level, query or type word) scores 0. Success is reward == 1.
"""

from __future__ import annotations

import difflib
import functools
import re
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from agentgym.envs.webshop.catalog import Goal, Product
from agentgym.retrieval.index import STOPWORDS

#: A fuzzy match needs a token-set ratio above this (WebShop's threshold).
FUZZY_THRESHOLD = 85.0
#: Colour names an option value is reduced to (multi-word names first, so "navy blue" stays itself).
COLOR_SET: tuple[str, ...] = (
    "navy blue", "light blue", "dark blue", "sky blue", "light grey", "dark grey", "rose gold",
    "black", "white", "brown", "red", "green", "pink", "grey", "gray", "beige", "purple", "yellow",
    "orange", "blue", "gold", "silver", "burgundy", "khaki", "ivory", "nude", "coral", "berry",
)
_FUZZ_SPLIT = re.compile(r"[^0-9a-z]+")
_TYPE_WORD = re.compile(r"[a-z]{2,}")


# Catalog phrases repeat endlessly (attributes, option values), so the pairs are worth remembering.
@functools.lru_cache(maxsize=1 << 16)
def token_set_ratio(first: str, second: str) -> float:
    """Similarity of two phrases' word sets in ``[0, 100]``: 100 when one's words are a subset of the
    other's (``fuzz.token_set_ratio``'s construction; 0 when either has no word).

    Example:
        >>> token_set_ratio("waterproof", "Waterproof!"), token_set_ratio("large", "x-large")
        (100.0, 100.0)
        >>> token_set_ratio("8 ounce", "16 ounce") > FUZZY_THRESHOLD
        False
    """
    words_a = set(_FUZZ_SPLIT.split(first.lower())) - {""}
    words_b = set(_FUZZ_SPLIT.split(second.lower())) - {""}
    if not words_a or not words_b:
        return 0.0
    if words_a <= words_b or words_b <= words_a:
        return 100.0  # what the construction below gives: the shared words equal one side's
    shared = " ".join(sorted(words_a & words_b))
    with_a = f"{shared} {' '.join(sorted(words_a - words_b))}".strip()
    with_b = f"{shared} {' '.join(sorted(words_b - words_a))}".strip()
    best = max(_similarity(shared, with_a), _similarity(shared, with_b), _similarity(with_a, with_b))
    return round(100.0 * best, 6)


def _similarity(a: str, b: str) -> float:
    if not a or not b:
        return 0.0
    return difflib.SequenceMatcher(None, a, b, autojunk=False).ratio()


def normalize_color(value: str) -> str:
    """The first ``COLOR_SET`` name contained in ``value``, else ``value`` (WebShop's ``normalize_color``).

    Example:
        >>> normalize_color("black | gold"), normalize_color("16 ounce")
        ('black', '16 ounce')
    """
    for color in COLOR_SET:
        if color in value:
            return color
    return value


def type_words(title: str) -> set[str]:
    """The words of a title that say what the product is (alphabetic, two letters or more, no stopwords).

    Example:
        >>> sorted(type_words("Lumera Waterproof Mascara, 2 Pack"))
        ['lumera', 'mascara', 'pack', 'waterproof']
    """
    return {word for word in _TYPE_WORD.findall(title.lower()) if word not in STOPWORDS}


def count_attribute_matches(product: Product, wanted: Iterable[str]) -> int:
    """How many ``wanted`` attributes ``product`` has (fuzzy attribute match, or verbatim in its text)."""
    text = (product.title.lower(), " ".join(product.features).lower(), product.description.lower())
    count = 0
    for attribute in wanted:
        if (any(token_set_ratio(own, attribute) > FUZZY_THRESHOLD for own in product.attributes)
                or any(attribute in part for part in text)):
            count += 1
    return count


def count_option_matches(chosen: Iterable[str], wanted: Iterable[str]) -> int:
    """How many ``wanted`` option values some ``chosen`` value fuzzily matches (after ``normalize_color``)."""
    chosen = [normalize_color(value) for value in chosen]
    return sum(1 for value in wanted
               if any(token_set_ratio(own, normalize_color(value)) > FUZZY_THRESHOLD for own in chosen))


@dataclass(frozen=True)
class PurchaseScore:
    """The reward of one purchase and the matches it was computed from."""

    reward: float
    """``r_type * (attributes + options + price_ok) / (wanted attributes + wanted options + 1)``."""
    r_type: float
    """The type-match factor: 1.0, 0.5, 0.1 or 0.0."""
    title_score: float
    """Share of the goal title's type words the bought title has."""
    query_match: bool
    category_match: bool
    attribute_matches: int
    option_matches: int
    price_ok: bool

    def to_info(self) -> dict[str, Any]:
        """The score as a JSON-safe dict (the buying step's ``info["purchase"]``)."""
        return asdict(self)


def type_reward(product: Product, goal: Goal) -> tuple[float, float, bool, bool]:
    """``(r_type, title_score, query_match, category_match)`` of buying ``product`` for ``goal``."""
    query_match = product.query == goal.query
    levels = {level.strip() for level in product.product_category.split("›")}
    category_match = len(levels & {level.strip() for level in goal.product_category.split("›")}) >= 2
    desired = type_words(goal.name)
    title_score = len(type_words(product.title) & desired) / len(desired) if desired else 0.2
    r_type = 1.0 if (query_match or category_match or title_score > 0.2) else 0.5
    if title_score < 0.1:
        r_type = 0.1
    if title_score == 0.0:
        r_type = 0.0
    return r_type, title_score, query_match, category_match


def score_purchase(product: Product, chosen_options: Mapping[str, str], goal: Goal) -> PurchaseScore:
    """WebShop's reward for buying ``product`` with ``chosen_options`` (group → value) for ``goal``.

    Example:
        >>> mascara = Product("B0TEST0001", "Lumera Waterproof Mascara", "beauty", "beauty › eyes › mascara",
        ...                   "mascara", ("waterproof",), (("color", ("black", "brown")),), 24.99, "", ())
        >>> goal = Goal("B0TEST0002", "...", "...", ("waterproof", "long lasting"), (("color", "black"),),
        ...             40.0, "Velora Long Lasting Waterproof Mascara", "mascara", "beauty › eyes › mascara")
        >>> score_purchase(mascara, {"color": "black"}, goal).reward
        0.75
        >>> score_purchase(mascara, {"color": "brown"}, goal).reward
        0.5
    """
    r_type, title_score, query_match, category_match = type_reward(product, goal)
    attributes = count_attribute_matches(product, goal.attributes)
    options = count_option_matches(chosen_options.values(), [value for _, value in goal.options])
    price_ok = product.price <= goal.price_upper
    total = (attributes + options + int(price_ok)) / (len(goal.attributes) + len(goal.options) + 1)
    return PurchaseScore(round(r_type * total, 6), r_type, title_score, query_match, category_match,
                         attributes, options, price_ok)
