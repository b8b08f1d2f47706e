"""The tools of ``tools-v0``: an exact calculator, a unit converter, a key-value ``Database``, their specs.

Every tool is deterministic and exact: numbers are ``Fraction``s from the text the model wrote
(``0.1`` is one tenth, not the nearest binary float), and they are shown with at most
``DECIMALS`` decimal places (``format_number``). A tool that cannot do what it was asked raises
``ToolError`` with a message written for the model.
"""

from __future__ import annotations

import ast
import difflib
import json
import math
import re
from collections.abc import Mapping
from fractions import Fraction
from typing import Any

from agentgym.envs.tools.tool_calls import tool_spec

#: Decimal places shown for a number whose decimal expansion is longer (or never ends).
DECIMALS = 10
#: Longest expression ``calculate`` accepts (characters); bounds parsing time and nesting.
MAX_EXPRESSION_CHARS = 200
#: Largest exponent magnitude ``**`` accepts.
MAX_EXPONENT = 100
#: Largest numerator or denominator an intermediate result may have (bits, about 300 digits).
MAX_NUMBER_BITS = 1000
#: Most keys the database may hold (bounds the state a model can build up with ``update``).
MAX_KEYS = 100
#: Most keys one ``list_keys`` call returns.
MAX_LISTED_KEYS = 50

_KEY_RE = re.compile(r"[A-Za-z0-9_./-]{1,80}")
# Spellings of the operators that models and people use; ``^`` is a power, never XOR.
_SPELLINGS = str.maketrans({"×": "*", "÷": "/", "−": "-", "–": "-", "^": "**"})
_NUMBER_RE = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")
_EXPONENT_RE = re.compile(r"[eE][-+]?0*(\d+)")
_THOUSANDS_RE = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")


class ToolError(ValueError):
    """A tool call that is well formed but cannot be carried out (the message says why, for the model)."""


# --- numbers -------------------------------------------------------------------------------------


def format_number(value: Fraction | int) -> str:
    """``value`` as a plain decimal, exact when it has at most ``DECIMALS`` decimals, else rounded (half up).

    Example:
        >>> format_number(Fraction(25, 2)), format_number(Fraction(1, 3)), format_number(Fraction(-2, 3))
        ('12.5', '0.3333333333', '-0.6666666667')
        >>> format_number(Fraction(-1, 10**12)), format_number(42)
        ('0', '42')
    """
    value = Fraction(value)
    scale = 10**DECIMALS
    units = math.floor(abs(value) * scale + Fraction(1, 2))
    if units == 0:
        return "0"
    whole, part = divmod(units, scale)
    text = str(whole) + (f".{part:0{DECIMALS}d}".rstrip("0") if part else "")
    return ("-" if value < 0 else "") + text


def parse_number(value: Any) -> Fraction | None:
    """The number in a JSON value: an int, a finite float, or the first number written in a string.

    In strings, thousands separators and currency signs are ignored (``"$1,234.50"`` is 1234.5).
    ``None`` when there is no finite number.

    Example:
        >>> parse_number(0.1), parse_number("about $1,234.50 in total"), parse_number("none")
        (Fraction(1, 10), Fraction(2469, 2), None)
    """
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return Fraction(value)
    if isinstance(value, float):
        # repr is the shortest text that reads back as this float: the number the model wrote.
        return Fraction(repr(value)) if math.isfinite(value) else None
    if isinstance(value, str):
        match = _NUMBER_RE.search(_THOUSANDS_RE.sub("", value))
        if match is not None:
            try:
                return _decimal(match.group())
            except ToolError:
                return None
    return None


def _decimal(text: str) -> Fraction:
    """The exact value of a decimal literal; ``ToolError`` when it is not one or is out of range."""
    exponent = _EXPONENT_RE.search(text)
    # Fraction("1e999999999") would build a billion-digit integer before any size check could run.
    if exponent is not None and len(exponent.group(1)) > 3:
        raise ToolError(f"{text} is too large")
    try:
        value = Fraction(text.replace("_", ""))
    except (ValueError, ZeroDivisionError, OverflowError):
        raise ToolError(f"{text} is not a decimal number") from None
    return _bounded(value)


def to_json(value: Any) -> str:
    """JSON text of ``value``, with ``Fraction``s written as ``format_number`` decimals.

    Example:
        >>> to_json({"key": "accounts/bob/balance", "value": Fraction(1001, 4), "keys": [], "previous": None})
        '{"key": "accounts/bob/balance", "value": 250.25, "keys": [], "previous": null}'
    """
    if isinstance(value, Fraction):
        return format_number(value)
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{json.dumps(str(k))}: {to_json(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(to_json(v) for v in value) + "]"
    return json.dumps(value)


# --- calculator ----------------------------------------------------------------------------------


def calculate(expression: str) -> Fraction:
    """The exact value of an arithmetic expression; never runs code.

    The text is parsed with ``ast`` and only numbers (decimal, optionally with an exponent such as
    ``1e3``), ``+ - * /``, ``**`` with a whole-number exponent, signs and parentheses are accepted.
    ``^`` means ``**``; ``×``, ``÷`` and ``−`` are read as ``*``, ``/`` and ``-``. Unlike
    ``agentgym.envs.games.countdown.evaluate``, any number may appear and decimals are allowed.

    Raises:
        ToolError: empty, too long, malformed, a name, call or operator that is not arithmetic, a
            ``%`` (ambiguous: write ``15 / 100``), division by zero, or a result too large.

    Example:
        >>> calculate("(1.1 + 2.2) * 3"), calculate("2 ^ 10 - -1"), calculate("12.5 * (100 - 15) / 100")
        (Fraction(99, 10), Fraction(1025, 1), Fraction(85, 8))
        >>> try:
        ...     calculate("1 / (2 - 2)")
        ... except ToolError as exc:
        ...     print(exc)
        division by zero
    """
    if not isinstance(expression, str):
        raise ToolError("the expression must be text")
    text = expression.translate(_SPELLINGS).strip()
    if not text:
        raise ToolError("the expression is empty")
    if len(text) > MAX_EXPRESSION_CHARS:
        raise ToolError(f"the expression is longer than {MAX_EXPRESSION_CHARS} characters")
    if "%" in text:
        raise ToolError("'%' is not supported; write a percentage as a fraction, e.g. 15% of x as "
                        "x * 15 / 100")
    if "=" in text:
        raise ToolError("write the expression only, without '='")
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        raise ToolError("it is not a well-formed arithmetic expression") from None
    return _value(tree.body, text)


def _value(node: ast.AST, text: str) -> Fraction:
    if isinstance(node, ast.Constant):
        source = ast.get_source_segment(text, node) or repr(node.value)
        if type(node.value) not in (int, float):
            raise ToolError(f"{source} is not a number")
        return _decimal(source)  # from the source text, so 0.1 is exactly one tenth
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.UAdd, ast.USub)):
        operand = _value(node.operand, text)
        return -operand if isinstance(node.op, ast.USub) else operand
    if isinstance(node, ast.BinOp):
        left, right = _value(node.left, text), _value(node.right, text)
        if isinstance(node.op, ast.Add):
            return _bounded(left + right)
        if isinstance(node.op, ast.Sub):
            return _bounded(left - right)
        if isinstance(node.op, ast.Mult):
            return _bounded(left * right)
        if isinstance(node.op, ast.Div):
            if right == 0:
                raise ToolError("division by zero")
            return _bounded(left / right)
        if isinstance(node.op, ast.Pow):
            return _power(left, right)
        symbol = {ast.FloorDiv: "//", ast.Mod: "%", ast.MatMult: "@", ast.LShift: "<<", ast.RShift: ">>",
                  ast.BitOr: "|", ast.BitAnd: "&", ast.BitXor: "^"}.get(type(node.op), "that operator")
        raise ToolError(f"'{symbol}' is not supported; use + - * / ** and parentheses")
    if isinstance(node, ast.Tuple):
        raise ToolError("write numbers without thousands separators (1234.5, not 1,234.5)")
    if isinstance(node, ast.Name):
        raise ToolError(f"{node.id!r} is not a number; the calculator knows numbers only "
                        "(look values up first)")
    if isinstance(node, ast.Call):
        raise ToolError("functions are not supported; use numbers, + - * / ** and parentheses")
    kind = type(node).__name__.lower()
    raise ToolError(f"{kind} is not supported; use numbers, + - * / ** and parentheses")


def _power(base: Fraction, exponent: Fraction) -> Fraction:
    if exponent.denominator != 1:
        raise ToolError("the exponent of ** must be a whole number (roots are not exact)")
    power = int(exponent)
    if abs(power) > MAX_EXPONENT:
        raise ToolError(f"the exponent of ** must be between -{MAX_EXPONENT} and {MAX_EXPONENT}")
    if base == 0 and power < 0:
        raise ToolError("division by zero")
    # Estimate the size first: computing a huge power just to reject it would stall the env.
    bits = max(base.numerator.bit_length(), base.denominator.bit_length())
    if bits * abs(power) > MAX_NUMBER_BITS + 64:
        raise ToolError("the result is too large")
    return _bounded(base**power)


def _bounded(value: Fraction) -> Fraction:
    if max(value.numerator.bit_length(), value.denominator.bit_length()) > MAX_NUMBER_BITS:
        raise ToolError("the result is too large")
    return value


# --- unit converter -------------------------------------------------------------------------------

#: Units by symbol: (dimension, size in the dimension's base unit, other accepted names).
#: Factors are exact by definition (international yard and pound, US liquid gallon).
UNITS: dict[str, tuple[str, Fraction, tuple[str, ...]]] = {
    "mm": ("length", Fraction(1, 1000), ("millimeter", "millimetre")),
    "cm": ("length", Fraction(1, 100), ("centimeter", "centimetre")),
    "m": ("length", Fraction(1), ("meter", "metre")),
    "km": ("length", Fraction(1000), ("kilometer", "kilometre")),
    "in": ("length", Fraction("0.0254"), ("inch", "inches")),
    "ft": ("length", Fraction("0.3048"), ("foot", "feet")),
    "yd": ("length", Fraction("0.9144"), ("yard",)),
    "mi": ("length", Fraction("1609.344"), ("mile",)),
    "mg": ("mass", Fraction(1, 10**6), ("milligram",)),
    "g": ("mass", Fraction(1, 1000), ("gram",)),
    "kg": ("mass", Fraction(1), ("kilogram",)),
    "t": ("mass", Fraction(1000), ("tonne", "metric ton")),
    "oz": ("mass", Fraction("0.028349523125"), ("ounce",)),
    "lb": ("mass", Fraction("0.45359237"), ("pound", "lbs")),
    "s": ("time", Fraction(1), ("second", "sec")),
    "min": ("time", Fraction(60), ("minute",)),
    "h": ("time", Fraction(3600), ("hour", "hr")),
    "day": ("time", Fraction(86400), ("d",)),
    "week": ("time", Fraction(604800), ("wk",)),
    "ml": ("volume", Fraction(1, 1000), ("milliliter", "millilitre")),
    "l": ("volume", Fraction(1), ("liter", "litre")),
    "floz": ("volume", Fraction("0.0295735295625"), ("fluid ounce", "fl oz")),
    "pt": ("volume", Fraction("0.473176473"), ("pint",)),
    "qt": ("volume", Fraction("0.946352946"), ("quart",)),
    "gal": ("volume", Fraction("3.785411784"), ("gallon",)),
    # Temperatures are affine: the factor is unused, ``_to_kelvin``/``_from_kelvin`` convert.
    "C": ("temperature", Fraction(1), ("celsius", "degc", "centigrade")),
    "F": ("temperature", Fraction(1), ("fahrenheit", "degf")),
    "K": ("temperature", Fraction(1), ("kelvin",)),
}
_ZERO_CELSIUS = Fraction("273.15")


def _aliases() -> dict[str, str]:
    names: dict[str, str] = {}
    for symbol, (_, _, others) in UNITS.items():
        for name in (symbol, *others):
            names[name.lower()] = symbol
            if len(name) > 2 and not name.endswith(("s", "feet")):
                names[name.lower() + "s"] = symbol  # plurals: miles, litres, ounces
    return names


_ALIASES = _aliases()


def unit_symbol(name: str) -> str:
    """The symbol of a unit written by its symbol or name, singular or plural, any case.

    Raises:
        ToolError: the unit is unknown (the message lists the units).

    Example:
        >>> unit_symbol("Kilometres"), unit_symbol("°F"), unit_symbol("lbs")
        ('km', 'F', 'lb')
    """
    key = " ".join(str(name).lower().replace("°", "").replace("degrees", "").replace("degree", "").split())
    symbol = _ALIASES.get(key.rstrip("."))
    if symbol is None:
        raise ToolError(f"unknown unit {name!r}; known units: {units_text()}")
    return symbol


def units_text() -> str:
    """The unit symbols by dimension, as the instructions and error messages list them.

    Example:
        >>> units_text().split("; ")[0]
        'length: mm cm m km in ft yd mi'
    """
    groups: dict[str, list[str]] = {}
    for symbol, (dimension, _, _) in UNITS.items():
        groups.setdefault(dimension, []).append(symbol)
    return "; ".join(f"{dimension}: {' '.join(symbols)}" for dimension, symbols in groups.items())


def convert_units(value: Fraction, from_unit: str, to_unit: str) -> Fraction:
    """``value`` in ``from_unit`` expressed in ``to_unit``, exactly (units by symbol or name).

    Raises:
        ToolError: an unknown unit, units of different dimensions, or a temperature below absolute zero.

    Example:
        >>> format_number(convert_units(Fraction("3.5"), "miles", "km"))
        '5.632704'
        >>> convert_units(Fraction(212), "F", "C"), convert_units(Fraction(1), "lb", "oz")
        (Fraction(100, 1), Fraction(16, 1))
    """
    source, target = unit_symbol(from_unit), unit_symbol(to_unit)
    (kind, factor, _), (target_kind, target_factor, _) = UNITS[source], UNITS[target]
    if kind != target_kind:
        raise ToolError(f"cannot convert {kind} ({source}) to {target_kind} ({target})")
    if kind != "temperature":
        return value * factor / target_factor
    kelvin = _to_kelvin(value, source)
    if kelvin < 0:
        raise ToolError(f"{format_number(value)} {source} is below absolute zero")
    return _from_kelvin(kelvin, target)


def _to_kelvin(value: Fraction, symbol: str) -> Fraction:
    if symbol == "C":
        return value + _ZERO_CELSIUS
    if symbol == "F":
        return (value - 32) * Fraction(5, 9) + _ZERO_CELSIUS
    return value


def _from_kelvin(value: Fraction, symbol: str) -> Fraction:
    if symbol == "C":
        return value - _ZERO_CELSIUS
    if symbol == "F":
        return (value - _ZERO_CELSIUS) * Fraction(9, 5) + 32
    return value


# --- key-value database ---------------------------------------------------------------------------


class Database:
    """A key-value store of numbers: what ``lookup``, ``update``, ``list_keys`` and ``delete`` act on.

    Keys are 1-80 characters of letters, digits and ``_ . / -`` (``accounts/alice/balance``).

    Args:
        values: the initial contents (copied).

    Example:
        >>> db = Database({"accounts/alice/balance": Fraction(120)})
        >>> db.update("accounts/alice/balance", Fraction(80)), db.lookup("accounts/alice/balance")
        (Fraction(120, 1), Fraction(80, 1))
        >>> try:
        ...     db.lookup("accounts/alcie/balance")
        ... except ToolError as exc:
        ...     print(exc)
        no key 'accounts/alcie/balance'; did you mean 'accounts/alice/balance'?
    """

    def __init__(self, values: Mapping[str, Fraction]) -> None:
        self.values: dict[str, Fraction] = dict(values)

    def lookup(self, key: str) -> Fraction:
        """The number under ``key``; ``ToolError`` (with the nearest keys) when there is none."""
        return self.values[self._existing(key)]

    def update(self, key: str, value: Fraction) -> Fraction | None:
        """Store ``value`` under ``key`` (a new key is created); returns the previous value or ``None``."""
        if not _KEY_RE.fullmatch(key):
            raise ToolError(f"invalid key {key!r}: use 1-80 letters, digits and _ . / - (e.g. notes/total)")
        if key not in self.values and len(self.values) >= MAX_KEYS:
            raise ToolError(f"the database is full ({MAX_KEYS} keys); delete a key first")
        previous = self.values.get(key)
        self.values[key] = value
        return previous

    def list_keys(self, prefix: str = "") -> list[str]:
        """The keys that start with ``prefix``, sorted (at most ``MAX_LISTED_KEYS``)."""
        return sorted(key for key in self.values if key.startswith(prefix))[:MAX_LISTED_KEYS]

    def delete(self, key: str) -> Fraction:
        """Remove ``key``; returns its value."""
        return self.values.pop(self._existing(key))

    def _existing(self, key: str) -> str:
        if key in self.values:
            return key
        near = difflib.get_close_matches(key, list(self.values), n=2, cutoff=0.9)  # typos, not siblings
        hint = f"did you mean {' or '.join(repr(k) for k in near)}?" if near else "list_keys shows the keys"
        raise ToolError(f"no key {key!r}; {hint}")


# --- specs and dispatch ---------------------------------------------------------------------------

TOOLS: list[dict[str, Any]] = [
    tool_spec("calculate", "Evaluate an arithmetic expression exactly: numbers, + - * /, ** with a "
              "whole-number exponent, parentheses. Write 15% of x as x * 15 / 100.",
              {"expression": {"type": "string", "description": "e.g. 12.5 * (100 - 15) / 100"}}),
    tool_spec("convert", "Convert a quantity between units of length, mass, time, volume or temperature.",
              {"value": {"type": "number", "description": "The quantity to convert."},
               "from_unit": {"type": "string", "description": "Unit of the value, e.g. mi, kg, F, gal."},
               "to_unit": {"type": "string", "description": "Unit to convert to, e.g. km, lb, C, l."}}),
    tool_spec("lookup", "Read the number stored under a key of the database.",
              {"key": {"type": "string", "description": "e.g. inventory/widget/price"}}),
    tool_spec("update", "Store a number under a key of the database (a new key is created).",
              {"key": {"type": "string", "description": "e.g. accounts/alice/balance"},
               "value": {"type": "number", "description": "The new value."}}),
    tool_spec("list_keys", "List the database keys that start with a prefix (all keys when it is empty).",
              {"prefix": {"type": "string", "description": "e.g. inventory/ or accounts/"}}, required=[]),
    tool_spec("delete", "Remove a key from the database.",
              {"key": {"type": "string", "description": "e.g. accounts/bob/balance"}}),
    tool_spec("answer", "Give the final answer; this ends the episode. Answer \"done\" when the task asks "
              "for no value.",
              {"answer": {"type": ["number", "string"], "description": "A number, a name, or \"done\"."}}),
]


def run_tool(name: str, arguments: Mapping[str, Any], db: Database) -> dict[str, Any]:
    """Run one (schema-valid) call of a tool other than ``answer``; its result as a JSON-able dict.

    Numbers in the result are ``Fraction``s (``to_json`` writes them as decimals).

    Raises:
        ToolError: the tool cannot carry out the call (unknown key or unit, division by zero, ...).

    Example:
        >>> db = Database({"inventory/kettle/price": Fraction("19.99")})
        >>> to_json(run_tool("lookup", {"key": "inventory/kettle/price"}, db))
        '{"key": "inventory/kettle/price", "value": 19.99}'
        >>> to_json(run_tool("convert", {"value": 2, "from_unit": "h", "to_unit": "min"}, db))
        '{"value": 2, "from_unit": "h", "to_unit": "min", "result": 120}'
    """
    if name == "calculate":
        return {"result": calculate(arguments["expression"])}
    if name == "convert":
        value = _number_argument(arguments["value"], "value")
        result = convert_units(value, arguments["from_unit"], arguments["to_unit"])
        return {"value": value, "from_unit": unit_symbol(arguments["from_unit"]),
                "to_unit": unit_symbol(arguments["to_unit"]), "result": result}
    if name == "lookup":
        return {"key": arguments["key"], "value": db.lookup(arguments["key"])}
    if name == "update":
        value = _number_argument(arguments["value"], "value")
        return {"key": arguments["key"], "value": value, "previous": db.update(arguments["key"], value)}
    if name == "list_keys":
        prefix = arguments.get("prefix", "")
        return {"prefix": prefix, "keys": db.list_keys(prefix)}
    if name == "delete":
        return {"key": arguments["key"], "deleted": db.delete(arguments["key"])}
    raise ToolError(f"unknown tool {name!r}")


def _number_argument(value: Any, name: str) -> Fraction:
    number = parse_number(value) if not isinstance(value, str) else None
    if number is None:
        raise ToolError(f"argument {name!r} must be a finite number")
    if max(number.numerator.bit_length(), number.denominator.bit_length()) > MAX_NUMBER_BITS:
        raise ToolError(f"argument {name!r} is too large")
    return number
