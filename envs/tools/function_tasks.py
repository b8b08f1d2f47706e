"""The tasks of ``tools-v0`` (``agentgym.envs.tools.function_calling``): generation and checking.

``generate_task(family, number)`` builds one task from its id alone: the prompt, the seeded
database it starts from, the database a correct solution leaves, the value the answer must give
and the expert's plan of tool calls. ``state_checks`` and ``answer_matches`` grade an episode's
outcome against it, with the tolerance of ``numbers_match``.
"""

from __future__ import annotations

import functools
import re
import string
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np

from agentgym.envs.tools.function_tools import (
    UNITS,
    convert_units,
    format_number,
    parse_number,
)
from agentgym.errors import ConfigError

#: Task families, in the order a seed chooses among them.
FAMILIES = ("convert", "convert_store", "discount", "stock_value", "transfer", "sell", "weight", "richest",
            "close_account", "sensor", "restock")
#: A number (answer or stored value) is right within ``ABS_TOLERANCE`` of the exact value, or one part
#: in ``1 / REL_TOLERANCE`` for large values: rounding to 2 decimal places is accepted.
ABS_TOLERANCE = Fraction(1, 100)
REL_TOLERANCE = Fraction(1, 10**6)
#: Task numbers are drawn below this bound; the ``train`` split uses the even ones, ``test`` the odd ones.
NUM_TASKS = 2**31

ITEMS = ("widget", "gadget", "sprocket", "lantern", "kettle", "blanket", "helmet", "hammer", "wrench",
         "bucket", "candle", "drill", "ladder", "mirror", "pillow", "shovel", "teapot", "toaster", "umbrella",
         "whistle", "backpack", "stapler", "skillet", "doorbell")
ACCOUNTS = ("alice", "bob", "carol", "dave", "erin", "frank", "grace", "heidi", "ivan", "judy", "mallory",
            "niaj", "olivia", "peggy", "rupert", "sybil", "trent", "victor", "walter", "wendy")
PLACES = ("greenhouse", "freezer", "cellar", "attic", "garage", "lab", "kitchen", "warehouse")

_TASK_RE = re.compile(r"tools/([a-z_]+)/(0|[1-9][0-9]*)")
_UNIT_WORDS = {"mm": "millimetres", "cm": "centimetres", "m": "metres", "km": "kilometres", "in": "inches",
               "ft": "feet", "yd": "yards", "mi": "miles", "mg": "milligrams", "g": "grams",
               "kg": "kilograms", "t": "tonnes", "oz": "ounces", "lb": "pounds", "s": "seconds",
               "min": "minutes", "h": "hours", "day": "days", "week": "weeks", "ml": "millilitres",
               "l": "litres", "floz": "US fluid ounces", "pt": "US pints", "qt": "US quarts",
               "gal": "US gallons", "C": "degrees Celsius", "F": "degrees Fahrenheit", "K": "kelvin"}
_NOTE_NAMES = {"length": "distance", "mass": "mass", "time": "duration", "volume": "volume",
               "temperature": "temperature"}
_PUNCTUATION = str.maketrans("", "", string.punctuation)

#: One planned tool call: (tool name, arguments). Numbers in arguments are ``Fraction``s.
Call = tuple[str, dict[str, Any]]


@dataclass(frozen=True)
class Task:
    """One generated task: what the agent is told, the database it starts from, and what must come out."""

    task_id: str
    """``"tools/<family>/<number>"``; the number seeds everything else."""
    family: str
    """One of ``FAMILIES``."""
    prompt: str
    """The task as the agent reads it."""
    initial: dict[str, Fraction]
    """The database at reset (never mutated)."""
    expected: dict[str, Fraction]
    """The database a correct solution leaves behind."""
    answer: Fraction | str | None
    """The value the answer must give: a number, a name, or ``None`` when any answer (``"done"``) will do."""
    plan: tuple[tuple[Call, ...], ...]
    """The expert's calls, grouped in turns; a turn's calls depend only on earlier turns' results."""


def format_task_id(family: str, number: int) -> str:
    """The task id of task ``number`` of ``family``.

    Example:
        >>> format_task_id("transfer", 42)
        'tools/transfer/42'
    """
    return f"tools/{family}/{number}"


def parse_task_id(task_id: Any) -> tuple[str, int]:
    """``(family, number)`` of a task id written by ``format_task_id``.

    Raises:
        ConfigError: malformed id, unknown family, or number out of range.
    """
    match = _TASK_RE.fullmatch(task_id) if isinstance(task_id, str) else None
    if match is None:
        raise ConfigError(f"malformed tools task_id {task_id!r}: expected 'tools/<family>/<number>', "
                          "e.g. 'tools/transfer/42'")
    family, number = match.group(1), int(match.group(2))
    if family not in FAMILIES:
        raise ConfigError(f"unknown tools task family {family!r}; families: {', '.join(FAMILIES)}")
    if number >= NUM_TASKS:
        raise ConfigError(f"tools task number must be below {NUM_TASKS}, got {number}")
    return family, number


# --- task generation ------------------------------------------------------------------------------


class _Draft:
    """A task being built: the seeded database and the helpers the family builders share."""

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng
        self.items = self.pick(ITEMS, 5)
        self.accounts = self.pick(ACCOUNTS, 4)
        self.places = self.pick(PLACES, 3)
        self.db: dict[str, Fraction] = {}
        for item in self.items:
            self.db[self.price(item)] = Fraction(int(rng.integers(100, 20001)), 100)
            self.db[self.stock(item)] = Fraction(int(rng.integers(0, 81)))
            self.db[self.weight(item)] = Fraction(int(rng.integers(5, 601)), 10)
        for name in self.accounts:
            self.db[self.balance(name)] = Fraction(int(rng.integers(5000, 500001)), 100)
        for place in self.places:
            self.db[f"sensors/{place}/temp_f"] = Fraction(int(rng.integers(-300, 1101)), 10)

    def pick(self, pool: Sequence[str], count: int) -> list[str]:
        return [pool[i] for i in self.rng.permutation(len(pool))[:count].tolist()]

    def one(self, pool: Sequence[str]) -> str:
        return pool[int(self.rng.integers(len(pool)))]

    @staticmethod
    def price(item: str) -> str:
        return f"inventory/{item}/price"

    @staticmethod
    def stock(item: str) -> str:
        return f"inventory/{item}/stock"

    @staticmethod
    def weight(item: str) -> str:
        return f"inventory/{item}/weight_lb"

    @staticmethod
    def balance(name: str) -> str:
        return f"accounts/{name}/balance"

    def quantity(self) -> tuple[Fraction, str, str]:
        """A value and two different units of one dimension, for the conversion families."""
        dimension = self.one(sorted(_NOTE_NAMES))
        source, target = self.pick([s for s, (d, _, _) in UNITS.items() if d == dimension], 2)
        if dimension == "temperature":
            low = {"C": -40, "F": -40, "K": 233}[source]
            value = Fraction(int(self.rng.integers(low * 10, (low + 240) * 10 + 1)), 10)
        else:
            value = Fraction(int(self.rng.integers(2, 2001)), int(self.rng.choice([1, 10, 100])))
        return value, source, target


# A builder returns (prompt, changes to the database (None deletes the key), answer, plan).
_Built = tuple[str, dict[str, Fraction | None], Fraction | str | None, list[list[Call]]]


def _lookup(key: str) -> Call:
    return ("lookup", {"key": key})


def _calc(expression: str) -> Call:
    return ("calculate", {"expression": expression})


def _update(key: str, value: Fraction) -> Call:
    return ("update", {"key": key, "value": value})


def _answer(value: Fraction | str | None) -> Call:
    return ("answer", {"answer": "done" if value is None else value})


def _convert(value: Fraction, source: str, target: str) -> Call:
    return ("convert", {"value": value, "from_unit": source, "to_unit": target})


def _build_convert(d: _Draft) -> _Built:
    value, source, target = d.quantity()
    result = convert_units(value, source, target)
    prompt = (f"Convert {format_number(value)} {_UNIT_WORDS[source]} to {_UNIT_WORDS[target]}. "
              "Answer with the converted number.")
    return prompt, {}, result, [[_convert(value, source, target)], [_answer(result)]]


def _build_convert_store(d: _Draft) -> _Built:
    value, source, target = d.quantity()
    result = convert_units(value, source, target)
    key = f"notes/{_NOTE_NAMES[UNITS[source][0]]}_{target.lower()}"
    prompt = (f"Convert {format_number(value)} {_UNIT_WORDS[source]} to {_UNIT_WORDS[target]} and save the "
              f"result in the database under the key {key}.")
    plan = [[_convert(value, source, target)], [_update(key, result), _answer(None)]]
    return prompt, {key: result}, None, plan


def _build_discount(d: _Draft) -> _Built:
    item = d.one(d.items)
    percent = int(d.rng.choice([5, 10, 15, 20, 25, 30, 40, 50]))
    price = d.db[d.price(item)]
    sale = price * (100 - percent) / 100
    plan: list[list[Call]] = [[_lookup(d.price(item))],
                              [_calc(f"{format_number(price)} * (100 - {percent}) / 100")]]
    if d.rng.random() < 0.5:
        prompt = (f"Look up the price of the {item}, take {percent}% off it, and answer with the discounted "
                  "price.")
        return prompt, {}, sale, [*plan, [_answer(sale)]]
    prompt = f"The {item} is on sale at {percent}% off: lower its price in the database accordingly."
    return prompt, {d.price(item): sale}, None, [*plan, [_update(d.price(item), sale), _answer(None)]]


def _build_stock_value(d: _Draft) -> _Built:
    item = d.one(d.items)
    price, stock = d.db[d.price(item)], d.db[d.stock(item)]
    value = price * stock
    prompt = (f"What is the total value of the {item}s in stock (the price of one {item} times the number "
              "in stock)? Answer with the number.")
    plan = [[_lookup(d.price(item)), _lookup(d.stock(item))],
            [_calc(f"{format_number(price)} * {format_number(stock)}")], [_answer(value)]]
    return prompt, {}, value, plan


def _build_transfer(d: _Draft) -> _Built:
    payer, payee = d.pick(d.accounts, 2)
    have, had = d.db[d.balance(payer)], d.db[d.balance(payee)]
    amount = Fraction(int(d.rng.integers(100, int(min(have, 1000) * 100) + 1)), 100)
    left, right = have - amount, had + amount
    report = d.rng.random() < 0.5
    prompt = f"Transfer {format_number(amount)} from {payer}'s account to {payee}'s account."
    if report:
        prompt += f" Then answer with {payer}'s new balance."
    plan = [[_lookup(d.balance(payer)), _lookup(d.balance(payee))],
            [_calc(f"{format_number(have)} - {format_number(amount)}"),
             _calc(f"{format_number(had)} + {format_number(amount)}")],
            [_update(d.balance(payer), left), _update(d.balance(payee), right),
             _answer(left if report else None)]]
    return prompt, {d.balance(payer): left, d.balance(payee): right}, left if report else None, plan


def _build_sell(d: _Draft) -> _Built:
    item = d.one(d.items)
    if d.db[d.stock(item)] < 2:  # a sale needs something to sell
        d.db[d.stock(item)] = Fraction(int(d.rng.integers(5, 41)))
    price, stock = d.db[d.price(item)], d.db[d.stock(item)]
    count = int(d.rng.integers(1, int(min(stock, 12)) + 1))
    charge = price * count
    things = item if count == 1 else f"{item}s"
    prompt = (f"A customer buys {count} {things}. Take them out of stock and answer with the amount to "
              f"charge (the price of one {item} times {count}).")
    plan = [[_lookup(d.price(item)), _lookup(d.stock(item))],
            [_calc(f"{format_number(stock)} - {count}"), _calc(f"{format_number(price)} * {count}")],
            [_update(d.stock(item), stock - count), _answer(charge)]]
    return prompt, {d.stock(item): stock - count}, charge, plan


def _build_weight(d: _Draft) -> _Built:
    item = d.one(d.items)
    count = int(d.rng.integers(2, 25))
    pounds = d.db[d.weight(item)] * count
    kilograms = convert_units(pounds, "lb", "kg")
    prompt = (f"How many kilograms do {count} {item}s weigh? The database stores the weight of one {item} "
              "in pounds.")
    plan = [[_lookup(d.weight(item))], [_calc(f"{format_number(d.db[d.weight(item)])} * {count}")],
            [_convert(pounds, "lb", "kg")], [_answer(kilograms)]]
    return prompt, {}, kilograms, plan


def _build_richest(d: _Draft) -> _Built:
    names = d.pick(d.accounts, 3)
    largest = d.rng.random() < 0.5
    ranked = sorted(names, key=lambda n: d.db[d.balance(n)], reverse=largest)
    if d.db[d.balance(ranked[0])] == d.db[d.balance(ranked[1])]:  # keep the answer unique
        d.db[d.balance(ranked[0])] += Fraction(1 if largest else -1, 100)
    extreme = "largest" if largest else "smallest"
    prompt = (f"Which of {names[0]}, {names[1]} and {names[2]} has the {extreme} account balance? "
              "Answer with the name.")
    return prompt, {}, ranked[0], [[_lookup(d.balance(n)) for n in names], [_answer(ranked[0])]]


def _build_close_account(d: _Draft) -> _Built:
    closed, kept = d.pick(d.accounts, 2)
    total = d.db[d.balance(kept)] + d.db[d.balance(closed)]
    prompt = (f"Close {closed}'s account: add its whole balance to {kept}'s account, then delete "
              f"{closed}'s account.")
    plan = [[_lookup(d.balance(closed)), _lookup(d.balance(kept))],
            [_calc(f"{format_number(d.db[d.balance(kept)])} + {format_number(d.db[d.balance(closed)])}")],
            [_update(d.balance(kept), total), ("delete", {"key": d.balance(closed)}), _answer(None)]]
    return prompt, {d.balance(kept): total, d.balance(closed): None}, None, plan


def _build_sensor(d: _Draft) -> _Built:
    place = d.one(d.places)
    source, target = f"sensors/{place}/temp_f", f"sensors/{place}/temp_c"
    celsius = convert_units(d.db[source], "F", "C")
    prompt = (f"The {place} sensor's reading is stored in degrees Fahrenheit under {source}. Save the same "
              f"reading in degrees Celsius under {target}, keeping the Fahrenheit one.")
    plan = [[_lookup(source)], [_convert(d.db[source], "F", "C")], [_update(target, celsius), _answer(None)]]
    return prompt, {target: celsius}, None, plan


def _build_restock(d: _Draft) -> _Built:
    stocks = {item: d.db[d.stock(item)] for item in d.items}
    low, high = int(min(stocks.values())), int(max(stocks.values()))
    if low == high:  # some item must be below the level and some not
        high += 10
        d.db[d.stock(d.items[0])] = stocks[d.items[0]] = Fraction(high)
    level = int(d.rng.integers(low + 1, high + 1))
    short = [item for item in d.items if stocks[item] < level]
    added = sum((level - stocks[item] for item in short), Fraction(0))
    prompt = (f"Restock the inventory: every item with fewer than {level} units in stock gets its stock "
              f"raised to exactly {level}. Answer with the total number of units added.")
    expression = " + ".join(f"({level} - {format_number(stocks[item])})" for item in short)
    plan = [[("list_keys", {"prefix": "inventory/"})], [_lookup(d.stock(item)) for item in d.items],
            [_calc(expression), *(_update(d.stock(item), Fraction(level)) for item in short)],
            [_answer(added)]]
    return prompt, {d.stock(item): Fraction(level) for item in short}, added, plan


_BUILDERS: dict[str, Callable[[_Draft], _Built]] = {
    "convert": _build_convert, "convert_store": _build_convert_store, "discount": _build_discount,
    "stock_value": _build_stock_value, "transfer": _build_transfer, "sell": _build_sell,
    "weight": _build_weight, "richest": _build_richest, "close_account": _build_close_account,
    "sensor": _build_sensor, "restock": _build_restock,
}


@functools.lru_cache(maxsize=4096)
def generate_task(family: str, number: int) -> Task:
    """Task ``number`` of ``family``: its database, prompt, expected outcome and expert plan.

    Everything is drawn from ``numpy.random.default_rng(number)``, so a task id names one task.

    Raises:
        ConfigError: unknown family or number out of range.

    Example:
        >>> task = generate_task("transfer", 7)
        >>> task.prompt
        "Transfer 598.59 from ivan's account to mallory's account. Then answer with ivan's new balance."
        >>> [name for turn in task.plan for name, _ in turn]
        ['lookup', 'lookup', 'calculate', 'calculate', 'update', 'update', 'answer']
    """
    family, number = parse_task_id(format_task_id(family, number))
    draft = _Draft(np.random.default_rng(number))
    prompt, changes, answer, plan = _BUILDERS[family](draft)
    expected = {**draft.db, **{k: v for k, v in changes.items() if v is not None}}
    for key in [k for k, v in changes.items() if v is None]:
        del expected[key]
    return Task(format_task_id(family, number), family, prompt, dict(draft.db), expected, answer,
                tuple(tuple(turn) for turn in plan))


# --- checking -------------------------------------------------------------------------------------


def numbers_match(given: Fraction, expected: Fraction) -> bool:
    """``given`` is within ``ABS_TOLERANCE`` of ``expected``, or within ``REL_TOLERANCE`` of it relatively.

    Example:
        >>> exact = Fraction("5.632704")
        >>> numbers_match(Fraction("5.63"), exact), numbers_match(Fraction("5.62"), exact)
        (True, False)
    """
    return abs(given - expected) <= max(ABS_TOLERANCE, REL_TOLERANCE * abs(expected))


def answer_matches(given: Any, expected: Fraction | str | None) -> bool:
    """Whether an ``answer`` argument gives the expected value.

    A number is compared with ``numbers_match`` (a string answer contributes its first number); a
    name after lowercasing, dropping punctuation and trimming spaces. ``expected=None`` accepts
    anything.

    Example:
        >>> answer_matches("About 5.63 km.", Fraction("5.632704")), answer_matches(" Alice.", "alice")
        (True, True)
    """
    if expected is None:
        return True
    if isinstance(expected, str):
        return isinstance(given, str) and given.lower().translate(_PUNCTUATION).strip() == expected
    number = parse_number(given)
    return number is not None and numbers_match(number, expected)


def state_checks(values: Mapping[str, Fraction], task: Task) -> list[bool]:
    """One check per key the task or the agent changed: does its final value match the expected one?

    A key that is absent on one side only (not created, or not deleted) fails its check. Keys
    nobody changed hold their initial value, which is also the expected one, and are not checked.
    """
    touched = changed_keys(task.initial, task.expected) | changed_keys(task.initial, values)
    checks = []
    for key in sorted(touched):
        have, want = values.get(key), task.expected.get(key)
        checks.append((have is None and want is None)
                      or (have is not None and want is not None and numbers_match(have, want)))
    return checks


def changed_keys(before: Mapping[str, Fraction], after: Mapping[str, Fraction]) -> set[str]:
    """Keys added, removed or given another value between two database states."""
    return {key for key in set(before) | set(after) if before.get(key) != after.get(key)}
