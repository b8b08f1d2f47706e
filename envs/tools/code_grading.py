"""The problems of ``code-tests-v0`` (``agentgym.envs.tools.code_tests``) and the harness that grades code.

``load_problems`` reads a problem set (the bundled one is ``data/code_problems.json``); ``grade``
runs a submission against a problem's hidden tests in the sandbox, one harness program for all of
them, and reports each case: passed, the value returned or the exception raised, what it printed.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentgym.envs.tools.code_runner import CodeRunner, describe_end
from agentgym.errors import ConfigError

#: The bundled problem set.
BUNDLED_PROBLEMS = Path(__file__).with_name("data") / "code_problems.json"
#: Characters kept of a returned value's repr or a test's printed output, in feedback.
SHOW_CHARS = 200
# Result lines of the harness start with this; everything else on stdout is the program's own.
_MARK = "@@agentgym-test@@ "
_ID_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


# --- problems ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CodeProblem:
    """One programming problem with its reference solution and tests."""

    id: str
    """The task id; also the name of the function to write."""
    title: str
    """A few words."""
    prompt: str
    """What the function must do."""
    signature: str
    """The ``def`` line to implement."""
    reference: str
    """A solution passing every test (the expert's submission)."""
    examples: tuple[tuple[tuple[Any, ...], Any], ...]
    """Visible ``(args, expected)`` pairs, shown in the prompt."""
    tests: tuple[tuple[tuple[Any, ...], Any], ...]
    """Hidden ``(args, expected)`` pairs: the reward counts these."""


def _pairs(raw: Any, where: str) -> tuple[tuple[tuple[Any, ...], Any], ...]:
    if not isinstance(raw, list) or not raw:
        raise ConfigError(f"{where} must be a non-empty list of {{'args': [...], 'expected': ...}}")
    out = []
    for n, case in enumerate(raw):
        if not isinstance(case, dict) or not isinstance(case.get("args"), list) or "expected" not in case:
            raise ConfigError(f"{where}[{n}] must be an object with an 'args' list and an 'expected' value")
        out.append((tuple(case["args"]), case["expected"]))
    return tuple(out)


def load_problems(path: str | None = None) -> tuple[CodeProblem, ...]:
    """The problems of a JSON file (default: the bundled set of 36).

    Format: ``{"problems": [{"id", "title", "prompt", "signature", "reference", "examples": [{"args":
    [...], "expected": ...}], "tests": [...]}]}``; ``id`` is the function's name.

    Raises:
        ConfigError: the file is missing or a problem is malformed (the message names it).

    Example:
        >>> problems = load_problems()
        >>> len(problems) >= 30, problems[0].signature
        (True, 'def is_palindrome(s: str) -> bool:')
    """
    file = Path(path) if path is not None else BUNDLED_PROBLEMS
    if not file.is_file():
        raise ConfigError(f"problem file {str(file)!r} does not exist; give a JSON file or problems=None")
    stat = file.stat()
    return _load_problems(str(file.resolve()), stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=8)
def _load_problems(path: str, _mtime_ns: int, _size: int) -> tuple[CodeProblem, ...]:
    """``load_problems`` behind a cache that an edited file misses (the stat is part of the key)."""
    file = Path(path)
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise ConfigError(f"{file}: not valid JSON ({exc})") from None
    raw = data.get("problems") if isinstance(data, dict) else None
    if not isinstance(raw, list) or not raw:
        raise ConfigError(f"{file}: expected {{\"problems\": [...]}} with at least one problem")
    problems, seen = [], set()
    for n, item in enumerate(raw):
        where = f"{file.name}: problem {n}"
        if not isinstance(item, dict):
            raise ConfigError(f"{where} must be an object")
        for key in ("id", "title", "prompt", "signature", "reference"):
            if not isinstance(item.get(key), str) or not item[key].strip():
                raise ConfigError(f"{where}: {key!r} must be a non-empty string")
        if not _ID_RE.fullmatch(item["id"]) or item["id"] in seen:
            raise ConfigError(f"{where}: id {item['id']!r} must be a unique Python identifier "
                              "(the function name)")
        seen.add(item["id"])
        problems.append(CodeProblem(
            item["id"], item["title"], item["prompt"], item["signature"], item["reference"],
            _pairs(item.get("examples"), f"{where} examples"), _pairs(item.get("tests"), f"{where} tests")))
    return tuple(problems)


# --- grading -------------------------------------------------------------------------------------

# Values are compared through this canonical form, computed in the sandbox for what the function
# returned and on the host for the expected value. It follows ``==`` where JSON can say it (True == 1,
# 2.0 == 2, tuples are lists) and rounds floats to 9 significant digits.
_CANON_SOURCE = '''\
def _canon(value, depth=0):
    import math, numbers
    if depth > 100:
        return {"deep": True}
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        value = float(value)
        if not math.isfinite(value):
            return {"float": repr(value)}
        if value == int(value) and abs(value) < 2 ** 53:
            return int(value)
        return {"float": float("%.9g" % value)}
    if isinstance(value, (list, tuple)):
        return [_canon(item, depth + 1) for item in value]
    if isinstance(value, dict):
        pairs = [[_canon(k, depth + 1), _canon(v, depth + 1)] for k, v in value.items()]
        return {"dict": sorted(pairs, key=lambda pair: repr(pair[0]))}
    if isinstance(value, (set, frozenset)):
        return {"set": sorted((_canon(item, depth + 1) for item in value), key=repr)}
    return {"object": type(value).__name__}
'''
_canon_ns: dict[str, Any] = {}
# Our own source, shared with the harness so both sides canonicalise alike.
exec(compile(_CANON_SOURCE, "<canon>", "exec"), _canon_ns)  # noqa: S102


def value_hash(value: Any) -> str:
    """The digest the harness reports for a returned value (equal digests: equal values).

    Example:
        >>> value_hash((1, 2.0, True)) == value_hash([1, 2, 1]), value_hash([1]) == value_hash([2])
        (True, False)
    """
    canon = _canon_ns["_canon"](value)
    return hashlib.sha256(json.dumps(canon, sort_keys=True).encode()).hexdigest()


# The program a submission runs as. Only the tests' arguments go in, never the expected values: the
# host compares the digests, so code that forges the harness's output still has to know the answers.
_HARNESS = '''\
import hashlib as _hashlib, json as _json, signal as _signal, sys as _sys
_MARK = {mark!r}
_SOURCE = {source!r}
_ENTRY = {entry!r}
_ARGS = {args!r}
_TEST_S = {test_s!r}
_SHOW = {show!r}
{canon}

class _Timeout(BaseException):
    pass


def _alarm(signum, frame):
    raise _Timeout()


class _Capture:
    def __init__(self):
        self.kept = []
        self.size = 0

    def write(self, text):
        text = str(text)
        if self.size < _SHOW:
            self.kept.append(text[: _SHOW - self.size])
        self.size += len(text)
        return len(text)

    def flush(self):
        pass

    def text(self):
        return "".join(self.kept)


def _describe(exc):
    if isinstance(exc, _Timeout):
        return "timeout"
    line, tb = None, exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == "solution.py":
            line = tb.tb_lineno
        tb = tb.tb_next
    try:
        if isinstance(exc, SyntaxError):
            line, text = exc.lineno, exc.msg
        else:
            text = str(exc)
        message = "%s: %s" % (type(exc).__name__, text) if text else type(exc).__name__
    except BaseException:
        message = type(exc).__name__
    return (message[:_SHOW] + (" (solution.py, line %d)" % line if line else ""))


def _emit(record):
    _sys.__stdout__.write(_MARK + _json.dumps(record) + "\\n")
    _sys.__stdout__.flush()


def _guarded(call):
    capture = _Capture()
    _sys.stdout = _sys.stderr = capture
    _signal.setitimer(_signal.ITIMER_REAL, _TEST_S)
    try:
        return call(), None, capture
    except BaseException as exc:
        return None, _describe(exc), capture
    finally:
        _signal.setitimer(_signal.ITIMER_REAL, 0)
        _sys.stdout, _sys.stderr = _sys.__stdout__, _sys.__stderr__


_signal.signal(_signal.SIGALRM, _alarm)
_NS = {{"__name__": "solution", "__builtins__": __builtins__}}
try:
    _code = compile(_SOURCE, "solution.py", "exec")
except BaseException as _exc:
    _emit({{"setup": _describe(_exc), "stdout": ""}})
    _sys.exit(0)
_, _error, _capture = _guarded(lambda: exec(_code, _NS))
if _error is None and not callable(_NS.get(_ENTRY)):
    _error = "the code defines no function %r" % _ENTRY
if _error is not None:
    _emit({{"setup": _error, "stdout": _capture.text()}})
    _sys.exit(0)
_function = _NS[_ENTRY]
for _index, _text in enumerate(_ARGS):
    _args = _json.loads(_text)
    _value, _error, _capture = _guarded(lambda: _function(*_args))
    _record = {{"test": _index, "stdout": _capture.text()}}
    if _error is None:
        _shown, _ = _guarded(lambda: repr(_value)[:_SHOW])[:2]
        _digest, _failed = _guarded(lambda: _hashlib.sha256(
            _json.dumps(_canon(_value), sort_keys=True).encode()).hexdigest())[:2]
        if _failed is not None:
            _error = "the returned value could not be compared: " + _failed
        else:
            _record.update(hash=_digest, repr=_shown if isinstance(_shown, str) else "?")
    if _error is not None:
        _record["error"] = _error
    _emit(_record)
'''


@dataclass(frozen=True)
class CaseOutcome:
    """How one hidden test went."""

    passed: bool
    """The function returned the expected value in time."""
    detail: str
    """What went wrong (``""`` when it passed): a wrong value, an exception, a timeout, or no result."""
    got: str = ""
    """``repr`` of the returned value, cut to ``SHOW_CHARS`` (``""`` when nothing came back)."""
    printed: str = ""
    """What the test printed, cut to ``SHOW_CHARS``."""


@dataclass(frozen=True)
class Grade:
    """The verdict on one submission."""

    outcomes: tuple[CaseOutcome, ...]
    """One per hidden test, in order."""
    setup_error: str = ""
    """Why the code could not even be loaded (syntax error, exception at import, no such function)."""
    setup_printed: str = ""
    """What loading the code printed."""

    @property
    def passed(self) -> int:
        """Hidden tests passed."""
        return sum(outcome.passed for outcome in self.outcomes)


def harness_program(problem: CodeProblem, code: str, test_s: float) -> str:
    """The program that loads ``code`` and reports each hidden test's result (never the expected values).

    Example:
        >>> program = harness_program(load_problems()[0], "def is_palindrome(s):\\n    return True", 1.0)
        >>> compile(program, "main.py", "exec") is not None
        True
    """
    return _HARNESS.format(mark=_MARK, source=code, entry=problem.id, test_s=float(test_s), show=SHOW_CHARS,
                           args=[json.dumps(list(args)) for args, _ in problem.tests], canon=_CANON_SOURCE)


def grade(problem: CodeProblem, code: str, runner: CodeRunner, test_s: float) -> Grade:
    """Run ``code`` against ``problem``'s hidden tests in the sandbox and compare on this side.

    Whatever the code does comes back as failed tests with a reason, never as an exception.
    """
    result = runner.run(harness_program(problem, code, test_s))
    records: dict[int, dict[str, Any]] = {}
    setup: dict[str, Any] | None = None
    for line in result.stdout.split("\n"):
        if not line.startswith(_MARK):
            continue
        try:
            record = json.loads(line[len(_MARK):])
        except ValueError:
            continue
        if not isinstance(record, dict):
            continue
        if "setup" in record:
            setup = record
        elif isinstance(record.get("test"), int):
            records[record["test"]] = record  # the last line for a test wins: the harness writes it last
    if setup is not None:
        error = str(setup.get("setup", ""))[:SHOW_CHARS * 2]
        printed = str(setup.get("stdout", ""))[:SHOW_CHARS]
        return Grade(tuple(CaseOutcome(False, "the code did not load") for _ in problem.tests),
                     error, printed)
    missing = describe_end(result, runner.limits) or (
        f"no result: the program ended early (exit status {result.exit_code})" if result.exit_code else
        "no result: the program ended early")
    outcomes = []
    for index, (_, expected) in enumerate(problem.tests):
        record = records.get(index)
        if record is None:
            outcomes.append(CaseOutcome(False, missing))
            continue
        printed = str(record.get("stdout", ""))[:SHOW_CHARS]
        if "error" in record:
            error = str(record["error"])[:SHOW_CHARS * 2]
            detail = f"timed out after {test_s:g} s" if error == "timeout" else f"raised {error}"
            outcomes.append(CaseOutcome(False, detail, printed=printed))
        elif record.get("hash") == value_hash(expected):
            outcomes.append(CaseOutcome(True, "", str(record.get("repr", ""))[:SHOW_CHARS], printed))
        else:
            got = str(record.get("repr", "?"))[:SHOW_CHARS]
            outcomes.append(CaseOutcome(False, "wrong value", got, printed))
    return Grade(tuple(outcomes))
