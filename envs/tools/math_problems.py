"""Math word problems for ``code-math-v0``: a seeded generator with exact answers, and answer grading.

``generate_problem(template, difficulty, seed)`` gives the same problem on every platform, over
seven word-problem templates (arithmetic chains, rates, percentages, combinatorics, modular
arithmetic, sums of sequences, digit and divisor counts) at three difficulties, each with a Python
solution that prints the answer, and one drill (``DRILLS``): an arithmetic expression to evaluate,
whose solution cell is the expression itself, written as it stands in the question.
``parse_number`` and ``same_number`` grade a model's answer exactly.
"""

from __future__ import annotations

import functools
import math
import re
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np

from agentgym.errors import ConfigError

#: Answers longer than this are not parsed (bounds the work on adversarial text).
MAX_ANSWER_CHARS = 200
_TASK_RE = re.compile(r"([a-z]+)-d([1-3])-([0-9]{1,9})")

_BOXED_RE = re.compile(r"\\boxed\s*\{((?:[^{}]|\{[^{}]*\})*)\}")
_FRAC_RE = re.compile(r"\\[dt]?frac\s*\{([^{}]*)\}\s*\{([^{}]*)\}")
_THOUSANDS_RE = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")
_NUMBER_RE = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:/[+-]?(?:\d+(?:\.\d*)?|\.\d+))?")


def parse_number(text: str) -> Fraction | None:
    """The exact number an answer states, or ``None`` when it is not a plain number.

    Accepts integers, decimals and fractions (``a/b``), optionally inside ``\\boxed{}``, ``$…$``,
    ``\\frac{a}{b}``, with thousands separators, a leading ``x =``, a ``$`` sign or a trailing ``%``.

    Example:
        >>> [str(parse_number(s)) for s in ["42", "42.0", "84/2", "\\\\boxed{42}", "$1,234$", "x = -7/3"]]
        ['42', '42', '42', '42', '1234', '-7/3']
        >>> parse_number("\\\\frac{36}{5}"), parse_number("149.04")
        (Fraction(36, 5), Fraction(3726, 25))
        >>> parse_number("forty-two") is None, parse_number("1/0") is None
        (True, True)
    """
    if not isinstance(text, str) or len(text) > MAX_ANSWER_CHARS:
        return None
    boxed = _BOXED_RE.findall(text)
    body = boxed[-1] if boxed else text
    body = _FRAC_RE.sub(r"(\1)/(\2)", body)
    body = body.replace("\\left", "").replace("\\right", "").replace("\\!", "").replace("\\,", "")
    body = body.replace("−", "-").strip().strip("$").strip()
    if "=" in body:
        body = body.rsplit("=", 1)[1]
    body = _THOUSANDS_RE.sub("", body)
    body = "".join(body.split()).rstrip(".").removeprefix("$").removesuffix("%")
    body = re.sub(r"^\((.*)\)/\((.*)\)$", r"\1/\2", body)
    if not _NUMBER_RE.fullmatch(body):
        return None
    top, _, bottom = body.partition("/")
    try:
        value = Fraction(top) / Fraction(bottom) if bottom else Fraction(top)
    except (ValueError, ZeroDivisionError):
        return None
    return value


def same_number(guess: str, gold: Fraction) -> bool:
    """Whether the answer ``guess`` states ``gold``: exactly, or as a decimal of 6+ places within 1e-6.

    The decimal rule lets a printed float (``0.3333333333333333``) count for ``1/3``; shorter
    decimals must be exact, so ``0.33`` does not.

    Example:
        >>> same_number("0.333333", Fraction(1, 3)), same_number("0.33", Fraction(1, 3))
        (True, False)
        >>> same_number("7.2", Fraction(36, 5)), same_number("36/5", Fraction(36, 5))
        (True, True)
    """
    value = parse_number(guess)
    if value is None:
        return False
    if value == gold:
        return True
    decimals = re.search(r"\.(\d+)", guess)
    if decimals is None or len(decimals.group(1)) < 6:
        return False
    return abs(value - gold) <= Fraction(1, 10**6) * max(1, abs(gold))


# --- problems ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MathProblem:
    """One generated word problem."""

    id: str
    """``"<template>-d<difficulty>-<seed>"``; ``generate_problem`` rebuilds the problem from it."""
    template: str
    """Which template made it (one of ``TEMPLATES``)."""
    difficulty: int
    """1 (easy) to 3 (hard): bigger numbers and more steps."""
    question: str
    """The problem text shown to the agent."""
    answer: Fraction
    """The exact answer."""
    solution: str
    """Python whose output is the answer (the expert's cell): it prints it, or, for a drill, is an
    expression whose value the cell shows."""


class _Draw:
    """Integer draws from a seeded generator (inclusive bounds)."""

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng

    def int(self, low: int, high: int) -> int:
        return int(self.rng.integers(low, high + 1))

    def pick(self, items: Sequence[Any]) -> Any:
        return items[int(self.rng.integers(len(items)))]


_Made = tuple[str, Fraction, str]  # (question, answer, solution code)
_PRIMES = (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47)


def _tank(r: _Draw, d: int) -> _Made:
    volume = Fraction(r.int(20, 60 * d))
    text = [f"A tank holds {volume} liters of water."]
    code = ["from fractions import Fraction as F", f"water = F({volume})"]
    for _ in range(d + 1):
        kind = r.pick(("add", "drain", "evaporate", "pour"))
        if kind == "pour" and volume < 4:
            kind = "add"  # too little left to pour a whole liter out and keep some
        if kind == "add":
            count, size = r.int(2, 3 + 3 * d), r.int(3, 10 * d + 5)
            volume += count * size
            text.append(f"Then {count} buckets of {size} liters each are poured in.")
            code.append(f"water += {count} * {size}")
        elif kind == "drain":
            percent = r.int(1, 12) * 5 if d == 1 else r.int(3, 70)
            volume *= Fraction(100 - percent, 100)
            text.append(f"Then {percent}% of the water is drained.")
            code.append(f"water *= 1 - F({percent}, 100)")
        elif kind == "evaporate":
            part = r.int(2, 4 + 2 * d)
            volume -= volume / part
            text.append(f"Then 1/{part} of the water evaporates.")
            code.append(f"water -= water / {part}")
        else:
            amount = r.int(1, int(volume) // 2)
            volume -= amount
            text.append(f"Then {amount} liters are poured out.")
            code.append(f"water -= {amount}")
    bottles = r.int(3, 4 + 5 * d)
    text.append(f"Finally the water is shared equally among {bottles} bottles. How many liters go into "
                "each bottle? Give the exact value.")
    code.append(f"print(water / {bottles})")
    return " ".join(text), volume / bottles, "\n".join(code)


def _work(r: _Draw, d: int) -> _Made:
    top = 6 + 6 * d
    a, b = r.int(2, top), r.int(2, top)
    if d == 1:
        question = (f"Pipe A alone fills a tank in {a} hours and pipe B alone fills it in {b} hours. With "
                    "both pipes open, how many hours does it take to fill the empty tank? Give the exact "
                    "value.")
        rate = Fraction(1, a) + Fraction(1, b)
        code = f"from fractions import Fraction as F\nrate = F(1, {a}) + F(1, {b})\nprint(1 / rate)"
        return question, 1 / rate, code
    if d == 2:
        c = r.int(math.floor(1 / (Fraction(1, a) + Fraction(1, b))) + 1, 3 * top)
        question = (f"Pipe A alone fills a tank in {a} hours and pipe B alone in {b} hours, while a drain "
                    f"empties a full tank in {c} hours. With both pipes and the drain open, how many hours "
                    "does it take to fill the empty tank? Give the exact value.")
        rate = Fraction(1, a) + Fraction(1, b) - Fraction(1, c)
        code = ("from fractions import Fraction as F\n"
                f"rate = F(1, {a}) + F(1, {b}) - F(1, {c})\nprint(1 / rate)")
        return question, 1 / rate, code
    a, b, c = r.int(3, top), r.int(3, top), r.int(2, top)
    pair = Fraction(1, a) + Fraction(1, b)
    days = r.int(1, math.ceil(1 / pair) - 1)  # a, b >= 3: Ann and Ben alone take over a day, never all of it
    rest = 1 - days * pair
    total = days + rest / (pair + Fraction(1, c))
    question = (f"Ann can paint a fence alone in {a} days, Ben in {b} days and Cal in {c} days. Ann and Ben "
                f"work together for {days} day{'s' if days > 1 else ''}, then Cal joins them until the fence "
                "is done. How many days does the whole job take? Give the exact value.")
    code = ("from fractions import Fraction as F\n"
            f"pair = F(1, {a}) + F(1, {b})\n"
            f"left = 1 - {days} * pair\n"
            f"print({days} + left / (pair + F(1, {c})))")
    return question, total, code


def _price(r: _Draw, d: int) -> _Made:
    cents = r.int(20, 500) * 100 if d == 1 else r.int(1000, 90000)
    price = Fraction(cents, 100)
    shown = f"{cents // 100}.{cents % 100:02d}"
    text = [f"A jacket costs ${shown}."]
    code = ["from fractions import Fraction as F", f"price = F({cents}, 100)"]
    for step in range(d + 1):
        kind = r.pick(("raise", "cut", "coupon"))
        percent = r.int(1, 9) * 5 if d == 1 else r.int(2, 45)
        if kind == "raise":
            price *= 1 + Fraction(percent, 100)
            text.append(f"{'Its' if step == 0 else 'Then its'} price is raised by {percent}%.")
            code.append(f"price *= 1 + F({percent}, 100)")
        elif kind == "cut":
            price *= 1 - Fraction(percent, 100)
            text.append(f"{'Its' if step == 0 else 'Then its'} price is cut by {percent}%.")
            code.append(f"price *= 1 - F({percent}, 100)")
        else:
            off = r.int(1, max(1, int(price) // 4))
            price -= off
            text.append(f"{'A' if step == 0 else 'Then a'} coupon takes ${off} off.")
            code.append(f"price -= {off}")
    tax = r.int(2, 12)
    price *= 1 + Fraction(tax, 100)
    text.append(f"Finally a {tax}% sales tax is added. What is the final price in dollars? "
                "Give the exact value.")
    code += [f"price *= 1 + F({tax}, 100)", "print(price)"]
    return " ".join(text), price, "\n".join(code)


def _count(r: _Draw, d: int) -> _Made:
    kind = r.pick(("committee", "strings", "paths") + (("boxes",) if d >= 2 else ()))
    if kind == "committee":
        men, women = r.int(5, 8 * d + 6), r.int(5, 8 * d + 6)
        a, b = r.int(2, min(men - 1, 2 + 2 * d)), r.int(2, min(women - 1, 2 + 2 * d))
        question = (f"A club has {men} men and {women} women. In how many ways can a committee of {a} men "
                    f"and {b} women be chosen?")
        code = f"from math import comb\nprint(comb({men}, {a}) * comb({women}, {b}))"
        return question, Fraction(math.comb(men, a) * math.comb(women, b)), code
    if kind == "strings":
        letters, length = r.int(3, 4 + 4 * d), r.int(4, 4 + 4 * d)
        question = (f"How many strings of length {length} over an alphabet of {letters} letters have no two "
                    "equal letters next to each other?")
        code = f"print({letters} * ({letters} - 1) ** ({length} - 1))"
        return question, Fraction(letters * (letters - 1) ** (length - 1)), code
    if kind == "paths":
        x, y = r.int(3, 4 + 3 * d), r.int(3, 4 + 3 * d)
        p, q = r.int(1, x - 1), r.int(1, y - 1)
        total = math.comb(x + y, x) - math.comb(p + q, p) * math.comb(x - p + y - q, x - p)
        question = (f"A robot walks on a grid from (0, 0) to ({x}, {y}), moving one unit right or one unit "
                    f"up each step. How many different paths avoid the point ({p}, {q})?")
        code = (f"from math import comb\n"
                f"print(comb({x + y}, {x}) - comb({p + q}, {p}) * comb({x - p + y - q}, {x - p}))")
        return question, Fraction(total), code
    coins, boxes = r.int(10, 30), r.int(3, 6)
    cap = r.int(max(2, -(-coins // boxes)), coins - 1)
    ways = [1] + [0] * coins
    for _ in range(boxes):
        ways = [sum(ways[n - k] for k in range(min(cap, n) + 1)) for n in range(coins + 1)]
    question = (f"In how many ways can {coins} identical coins be put into {boxes} different boxes so that "
                f"no box holds more than {cap} coins? (Boxes may stay empty.)")
    code = (f"ways = [1] + [0] * {coins}\n"
            f"for _ in range({boxes}):\n"
            f"    ways = [sum(ways[n - k] for k in range(min({cap}, n) + 1)) for n in range({coins} + 1)]\n"
            f"print(ways[{coins}])")
    return question, Fraction(ways[coins]), code


def _modular(r: _Draw, d: int) -> _Made:
    if r.pick(("power", "crt")) == "power":
        base, power = r.int(2, 10**d * 5), r.int(10 ** (d + 1), 10 ** (d + 2))
        modulus = r.int(7, 10 ** (d + 1))
        question = f"What is the remainder when {base}^{power} is divided by {modulus}?"
        return question, Fraction(pow(base, power, modulus)), f"print(pow({base}, {power}, {modulus}))"
    primes = list(_PRIMES[2:8 + 2 * d])
    moduli: list[int] = []
    for _ in range(d + 1):
        prime = r.pick(primes)
        primes.remove(prime)
        moduli.append(prime)
    rests = [r.int(0, m - 1) for m in moduli]
    answer, step = 0, 1
    # Sieve: keep the remainders met so far while stepping.
    for modulus, rest in zip(moduli, rests, strict=True):
        while answer % modulus != rest:
            answer += step
        step *= modulus
    parts = ", ".join(f"remainder {k} when divided by {m}" for m, k in zip(moduli, rests, strict=True))
    question = f"What is the smallest positive integer that leaves {parts}?"
    code = (f"pairs = {list(zip(moduli, rests, strict=True))}\n"
            "x, step = 0, 1\n"
            "for m, k in pairs:\n"
            "    while x % m != k:\n"
            "        x += step\n"
            "    step *= m\n"
            "print(x if x > 0 else step)")
    return question, Fraction(answer or step), code


def _series(r: _Draw, d: int) -> _Made:
    kind = r.pick(("multiples", "arithmetic", "telescoping", "geometric"))
    if kind == "multiples":
        limit, a, b = r.int(10 ** (d + 1), 10 ** (d + 2)), r.int(3, 9 + 2 * d), r.int(3, 9 + 2 * d)
        while b == a:
            b = r.int(3, 9 + 2 * d)
        lcm = a * b // math.gcd(a, b)
        # Inclusion-exclusion: multiples of a, plus multiples of b, minus those counted twice.
        total = sum(sign * k * (limit // k) * (limit // k + 1) // 2
                    for sign, k in ((1, a), (1, b), (-1, lcm)))
        question = f"What is the sum of all integers from 1 to {limit} that are divisible by {a} or by {b}?"
        code = f"print(sum(n for n in range(1, {limit} + 1) if n % {a} == 0 or n % {b} == 0))"
        return question, Fraction(total), code
    if kind == "arithmetic":
        first, step, count = r.int(-50 * d, 100 * d), r.int(-9 * d, 12 * d), r.int(20, 60 * d)
        total = count * (2 * first + (count - 1) * step) // 2
        question = (f"A sequence starts at {first}, and each term is {step} more than the one before. What "
                    f"is the sum of its first {count} terms?")
        return question, Fraction(total), f"print(sum({first} + {step} * k for k in range({count})))"
    if kind == "telescoping":
        shift, low = r.int(1, d + 1), r.int(1, 5)
        high = r.int(low + 10, low + 20 * d)
        total = sum(Fraction(1, k * (k + shift)) for k in range(low, high + 1))
        question = (f"What is the exact value of the sum of 1/(k*(k+{shift})) for k = {low}, {low + 1}, ..., "
                    f"{high}?")
        code = (f"from fractions import Fraction as F\n"
                f"print(sum(F(1, k * (k + {shift})) for k in range({low}, {high} + 1)))")
        return question, total, code
    first, num, den, count = r.int(2, 20 * d), r.int(1, 4), r.int(2, 5), r.int(4, 4 + 3 * d)
    ratio = Fraction(num, den) if num != den else Fraction(num + 1, den)
    total = sum(first * ratio**k for k in range(count))
    question = (f"A sequence starts at {first}, and each term is {ratio} times the one before. What is the "
                f"sum of its first {count} terms? Give the exact value.")
    code = (f"from fractions import Fraction as F\n"
            f"print(sum({first} * F({ratio.numerator}, {ratio.denominator}) ** k for k in range({count})))")
    return question, total, code


def _digits(r: _Draw, d: int) -> _Made:
    kind = r.pick(("digit_sum", "coprime", "divisors"))
    if kind == "digit_sum":
        base, power = r.int(2, 9), r.int(20 * d, 120 * d)
        question = f"What is the sum of the decimal digits of {base}^{power}?"
        code = f"print(sum(int(c) for c in str({base} ** {power})))"
        return question, Fraction(sum(map(int, str(base**power)))), code
    if kind == "coprime":
        limit, modulus = r.int(10 ** (d + 1), 10 ** (d + 2)), r.int(6, 60 * d)
        factors = [p for p in range(2, modulus + 1) if modulus % p == 0 and all(p % q for q in range(2, p))]
        total = 0
        for mask in range(1 << len(factors)):  # inclusion-exclusion over the prime factors
            chosen = [p for i, p in enumerate(factors) if mask >> i & 1]
            total += (-1) ** len(chosen) * (limit // math.prod(chosen))
        question = (f"How many integers from 1 to {limit} share no common factor greater than 1 with "
                    f"{modulus}?")
        code = f"from math import gcd\nprint(sum(1 for n in range(1, {limit} + 1) if gcd(n, {modulus}) == 1))"
        return question, Fraction(total), code
    exponents = [r.int(0, 2 + d) for _ in _PRIMES[: 3 + d]]
    exponents[0] = max(exponents[0], 1)
    # strict=False: exponents covers only the first 3 + d primes, the rest of _PRIMES is not drawn.
    number = math.prod(p**e for p, e in zip(_PRIMES, exponents, strict=False))
    count = math.prod(e + 1 for e in exponents)
    question = f"How many positive divisors does {number} have?"
    code = (f"n, count, p = {number}, 1, 2\n"
            "while n > 1:\n"
            "    e = 0\n"
            "    while n % p == 0:\n"
            "        n //= p\n"
            "        e += 1\n"
            "    count *= e + 1\n"
            "    p += 1\n"
            "print(count)")
    return question, Fraction(count), code


def _expression(r: _Draw, d: int) -> _Made:
    # Products of two-digit numbers and sums of them: a small model cannot work them out, but it can copy
    # the expression into a cell. The expression starts and ends with a number and its value is positive
    # (all signs + when the draw would not be), so a copy is a run of whole words and the printed value
    # has no sign to drop.
    factors = sorted(([r.int(11, 99) for _ in range(1 + (k == 0 or d == 3))] for k in range(d + 1)),
                     key=math.prod, reverse=True)
    terms = [math.prod(f) for f in factors]
    signs = [r.pick((1, -1)) for _ in terms[1:]]
    value = terms[0] + sum(s * t for s, t in zip(signs, terms[1:], strict=True))
    if value <= 0:
        signs, value = [1] * len(signs), sum(terms)
    expression = " * ".join(map(str, factors[0]))
    for sign, term in zip(signs, factors[1:], strict=True):
        expression += f" {'+' if sign > 0 else '-'} " + " * ".join(map(str, term))
    return f"Compute {expression}. Give the exact value.", Fraction(value), expression


#: Template name → generator ``(draw, difficulty) -> (question, answer, solution)``.
TEMPLATES: dict[str, Callable[[_Draw, int], _Made]] = {
    "tank": _tank, "work": _work, "price": _price, "count": _count, "modular": _modular, "series": _series,
    "digits": _digits,
}
#: Drills, chosen only by name (``CodeMathEnv(templates=["expression"])``): ``expression``, an arithmetic
#: expression to evaluate (``d`` + 1 terms; products of two-digit numbers), a learnable first task for a
#: tiny model: copy it into a cell, then copy the value shown into the answer.
DRILLS: dict[str, Callable[[_Draw, int], _Made]] = {"expression": _expression}
_GENERATORS = {**TEMPLATES, **DRILLS}


@functools.lru_cache(maxsize=4096)
def generate_problem(template: str, difficulty: int, seed: int) -> MathProblem:
    """The problem ``template`` makes at ``difficulty`` from ``seed`` (the same on every platform).

    Args:
        template: one of ``TEMPLATES``: ``tank`` (arithmetic chains), ``work`` (rates), ``price``
            (percentages), ``count`` (combinatorics), ``modular``, ``series`` (sums of sequences),
            ``digits`` (digit sums, coprime counts, divisor counts); or of ``DRILLS``: ``expression``.
        difficulty: 1 to 3.
        seed: any non-negative integer.

    Raises:
        ConfigError: an unknown template or a difficulty out of range.

    Example:
        >>> p = generate_problem("work", 1, 7)
        >>> print(p.question)  # doctest: +NORMALIZE_WHITESPACE
        Pipe A alone fills a tank in 4 hours and pipe B alone fills it in 9 hours. With both pipes open,
        how many hours does it take to fill the empty tank? Give the exact value.
        >>> p.id, p.answer
        ('work-d1-7', Fraction(36, 13))
    """
    if template not in _GENERATORS:
        raise ConfigError(f"unknown code-math template {template!r}; choose from {', '.join(_GENERATORS)}")
    if isinstance(difficulty, bool) or difficulty not in (1, 2, 3):
        raise ConfigError(f"difficulty must be 1, 2 or 3, got {difficulty!r}")
    rng = np.random.default_rng([zlib.crc32(template.encode()), difficulty, int(seed)])
    question, answer, solution = _GENERATORS[template](_Draw(rng), difficulty)
    return MathProblem(f"{template}-d{difficulty}-{seed}", template, difficulty, question, answer, solution)


def problem_from_id(task_id: str) -> MathProblem:
    """Rebuild a problem from its id ``"<template>-d<difficulty>-<seed>"``.

    Raises:
        ConfigError: a malformed id or an unknown template.
    """
    match = _TASK_RE.fullmatch(task_id) if isinstance(task_id, str) else None
    if match is None:
        raise ConfigError(f"malformed code-math task_id {task_id!r}; ids look like 'series-d2-1234'")
    return generate_problem(match.group(1), int(match.group(2)), int(match.group(3)))
