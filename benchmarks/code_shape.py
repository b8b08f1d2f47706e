"""The shape of the code, measured from its source, so that a redesign is judged by numbers (``measure``).

Run it from the repository root::

    python benchmarks/code_shape.py                       # prints the table of the working tree
    python benchmarks/code_shape.py --json benchmarks/results/code_shape.json
    python benchmarks/code_shape.py --commit 96fba02 --json benchmarks/results/code_shape_before.json
    python benchmarks/code_shape.py --against benchmarks/results/code_shape_before.json  # before/after

Everything is read with ``ast`` and regular expressions; nothing is imported or run. What each row counts:

* ``loop.py``: ``agentgym/training/run/loop.py``'s lines (all of them), its methods (every ``def`` inside a
  class) and its **mode branches**: each ``if``/``elif``, ``while`` test or conditional expression
  (``a if test else b``) whose test names (as a variable or an attribute) one of the mode flags in
  ``MODE_FLAGS`` -- the asynchronous-collection flags (``max_staleness``, ``asynchronous``, ``weights``: the
  weight-sync object that only asynchronous collection has, ``queued_beyond``), the several-process flags
  (``dist``, ``world_size``, ``is_main``, ``rank``, ``distributed``, ``shared_by_processes``) and the
  resume/checkpoint flags (``resume``, ``resume_point``, ``saved_iteration``, ``has_checkpoint``,
  ``checkpoint_every``, ``from_run``, ``warm_source``, ``stop_after``). A test naming flags of two kinds
  counts once in the total and once under each kind. ``methods with mode branches`` counts the functions
  holding one.
* ``cfg passed``: calls in ``loop.py`` given the whole config (``cfg`` or ``self.cfg``) as an argument
  (``whole``), and calls given one of its sections or fields (``cfg.rollout``, ``self.cfg.loss.tis_cap``:
  ``parts``).
* ``two-way package pairs``: the packages are agentgym's direct subpackages (``rollout``, ``http``, ...),
  with ``training``'s four subpackages counted separately (``training.config`` ...), plus the plug-in folders
  ``envs`` and ``trainers``. A package imports another when any of its modules has an ``import`` of it,
  at module level or inside a function (lazy imports count); ``from agentgym.training import X`` names
  ``training.X`` when ``X`` is a subpackage. A pair counts when each imports the other.
* ``places that build Turn``: calls of ``Turn(...)`` (by name or attribute) in agentgym/, envs/, trainers/,
  outside ``agentgym/rollout/records.py`` where ``Turn`` is defined.
* ``episode writers`` / ``episode readers``: in the modules of agentgym/ whose name holds one of the
  episode words below or whose code names the episode folder (an attribute ``trajectories``/``trajectory``
  or a string holding ``trajectories``), the functions that name episode records (an identifier, argument,
  short string, their own name or their class's containing ``episode``, ``trajector``, ``group`` -- not a
  regular expression's ``m.group()`` -- or ``records``) and either write JSON (call
  ``json.dumps``/``json.dump`` and something named ``*write*`` or ``*file*``: a writer) or parse it (call
  ``json.loads``/``json.load``: a reader; a ``from_json`` of a dict already parsed is none). A heuristic: it
  finds the functions a reader of the code would look at, not a proof. ``record formats`` is the number of
  modules holding a writer.
* ``longest functions``: the 10 longest ``def``s in agentgym/, envs/, trainers/ (lines from ``def`` to its
  last line, nested functions included) with a cyclomatic complexity estimate: 1 + the number of
  ``if``/conditional expressions, ``for``, ``while``, ``try``, ``except`` clauses, boolean operators (each
  extra operand), comprehension clauses and ``match`` cases in it, nested functions included.
* ``test files``: ``test_*.py`` directly in tests/ and in its subfolders.
* ``documented result numbers``: the claims of README.md, docs/*.md and benchmarks/README.md (``claims``)
  and how many of them more than one of those files states (``duplicated``; ``duplicates`` lists each
  with its files and lines). A result number is a number with a unit of measurement (``%``, ``×``/``x``,
  ``s``, ``ms``, ``min``, ``h``, ``s/iteration``, ``tokens/s`` and other rates, ``GiB``/``GB``/``MB``,
  ``pp``) in the prose: fenced code blocks and inline code are commands, and a number in a link's text
  refers to the page it links to. A distinctive number (``1.74×``, ``37.7 s``, ``3.8%``) is a claim of its
  own; a common integer (``27%``, ``3×``) is one only paired with its neighbour on the line (``27% -> 58%``),
  since single ones recur by chance. ``NOT_RESULTS`` lists the numbers that are settings, not results.
"""

from __future__ import annotations

import argparse
import ast
import io
import json
import re
import subprocess
import sys
import tarfile
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from provenance import provenance  # noqa: E402

REPO = Path(__file__).resolve().parents[1]

MODE_FLAGS: dict[str, frozenset[str]] = {
    "async": frozenset({"max_staleness", "asynchronous", "weights", "queued_beyond"}),
    "processes": frozenset({"dist", "world_size", "is_main", "rank", "distributed", "shared_by_processes"}),
    "resume": frozenset({"resume", "resume_point", "saved_iteration", "has_checkpoint", "checkpoint_every",
                         "from_run", "warm_source", "stop_after"}),
}
LOOP = "agentgym/training/run/loop.py"
RECORDS = "agentgym/rollout/records.py"
CODE_ROOTS = ("agentgym", "envs", "trainers")
EPISODE_WORDS = ("episode", "trajector", "group", "records")

#: A result number: a number and a unit that measures something, with its spread (``46% ± 37%``). It does not
#: start inside a word, a version (``v0.5``) or a product (``2×2``); a range (``75–78%``, ``5%–36%``) is one
#: number; ``×`` followed by a number is a product (a maze's size), not a speed-up.
NUMBER = re.compile(
    r"(?<![\w.\-/–×])(?P<num>\d+(?:[.,]\d+)*(?:%?[–-]\d+(?:[.,]\d+)*)?)\s?"
    r"(?P<unit>%|×(?!\s?\d)|x(?![\w])|pp\b|ms\b|min\b|minutes\b|GiB\b|GB\b|MiB\b|MB\b|"
    r"s/(?:iteration|it|step|update)\b|(?:tokens|steps|episodes|requests|req|turns|sessions)/s\b|s\b|h\b|"
    r"hours\b)(?P<spread>\s?±\s?\d+(?:[.,]\d+)*\s?%?)?")
FENCE = re.compile(r"^(```|~~~)")
INLINE_CODE = re.compile(r"`[^`\n]*`")
#: A markdown link's text: a number in it refers to the page it links to (a headline), it states nothing.
LINK_TEXT = re.compile(r"\[[^\]\n]*\]\([^)\n]*\)")
#: Integers such as ``27%`` or ``3×`` recur by chance across unrelated claims, so they count as one claim
#: only in the pair they form with the result number next to them on the line (``27% ... 58%``).
COMMON = re.compile(r"\d+(%|×|x| s| min| minutes| h| hours)")
#: A table cell's number: a common result number, or a bare decimal or thousands-separated number.
TABLE_NUMBER = re.compile(r"(?<![\w.\-/–×,±])(?<!± )(?:\d+(?:%|×(?!\s?\d))|\d+\.\d+|\d{1,3}(?:,\d{3})+)"
                          r"(?![\w.%×,–-]| ?±)")
#: Numbers with a unit that are not results: settings and levels that many pages name.
NOT_RESULTS = {"95%": "the confidence level of every interval"}


def doc_files(root: Path) -> list[Path]:
    """README.md, docs/*.md and benchmarks/README.md: the pages whose numbers are counted."""
    return [p for p in [root / "README.md", *sorted((root / "docs").glob("*.md")),
                        root / "benchmarks" / "README.md"] if p.is_file()]


def prose_lines(text: str) -> list[tuple[int, str]]:
    """``(line number, line)`` of the prose: outside fenced code blocks, without inline code and link text."""
    out, fenced = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line.strip()):
            fenced = not fenced
            continue
        if not fenced:
            out.append((number, LINK_TEXT.sub(" ", INLINE_CODE.sub(" ", line))))
    return out


def result_numbers(line: str) -> list[str]:
    """The result numbers of one line of prose, in order, each with its unit.

    Example:
        >>> result_numbers("GiGPO reaches 72% in 1.5 s/iteration, 2× faster on 2×2 mazes (75–78%), 46% ± 37%")
        ['72%', '1.5 s/iteration', '2×', '75–78%', '46% ± 37%']
    """
    found = []
    for match in NUMBER.finditer(line):
        unit = match["unit"]
        found.append(f"{match['num']}{'' if unit in ('%', '×', 'x') else ' '}{unit}{match['spread'] or ''}")
    return [n for n in found if n not in NOT_RESULTS]


def claims(line: str) -> list[str]:
    """What a line states, as keys that two pages stating the same result share: each distinctive result
    number (``1.74×``, ``37.7 s``, ``75–78%``), and each pair of neighbouring common numbers (``27% -> 58%``:
    neighbours among the line's common integers and, in a table row, the cells' bare decimals such as
    ``79.7``, whose unit is in the header).

    Example:
        >>> claims("from 27% after SFT to 58% after RL, 1.74× the steps/s; 2× and 3×")
        ['1.74×', '27% -> 58%', '58% -> 2×', '2× -> 3×']
        >>> claims("| plain | 79.7 | 9.6 | 70.1 | 1.00× |")
        ['1.00×', '79.7 -> 70.1']
    """
    numbers = result_numbers(line)
    common = [n for n in numbers if COMMON.fullmatch(n)]
    if line.lstrip().startswith("|"):
        common = [m[0] for m in TABLE_NUMBER.finditer(line) if len(re.sub(r"\D", "", m[0]).lstrip("0")) >= 3
                  or COMMON.fullmatch(m[0])]
    pairs = [f"{a} -> {b}" for a, b in zip(common, common[1:], strict=False)]
    return [n for n in numbers if not COMMON.fullmatch(n)] + pairs


def doc_claims(root: Path) -> dict[str, dict[str, list[int]]]:
    """Every claim of the doc pages (``claims``): ``{claim: {file: [line, ...]}}``."""
    where: dict[str, dict[str, list[int]]] = defaultdict(lambda: defaultdict(list))
    for path in doc_files(root):
        for line_number, line in prose_lines(path.read_text(encoding="utf-8")):
            for key in claims(line):
                where[key][path.relative_to(root).as_posix()].append(line_number)
    return {k: dict(v) for k, v in sorted(where.items())}


def repeated_claims(root: Path) -> dict[str, dict[str, list[int]]]:
    """The claims that more than one doc page states."""
    return {k: v for k, v in doc_claims(root).items() if len(v) > 1}


def names_in(node: ast.AST) -> set[str]:
    """Every variable and attribute name used in ``node``."""
    out = set()
    for child in ast.walk(node):
        if isinstance(child, ast.Name):
            out.add(child.id)
        elif isinstance(child, ast.Attribute):
            out.add(child.attr)
    return out


def functions(tree: ast.AST) -> list[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    """``(qualified name, node)`` of every function, methods as ``Class.method``."""
    out = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                out.append((prefix + child.name, child))
                visit(child, prefix + child.name + ".")
            elif isinstance(child, ast.ClassDef):
                visit(child, prefix + child.name + ".")
            else:
                visit(child, prefix)

    visit(tree, "")
    return out


def loop_shape(root: Path) -> dict[str, Any]:
    """loop.py's lines, methods, mode branches (by kind and by method) and ``cfg`` arguments."""
    path = root / LOOP
    source = path.read_text(encoding="utf-8")
    tree = ast.parse(source)
    methods = [n for cls in ast.walk(tree) if isinstance(cls, ast.ClassDef)
               for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    by_kind: dict[str, int] = dict.fromkeys(MODE_FLAGS, 0)
    total, holders = 0, defaultdict(int)
    for name, func in functions(tree):
        inner = {id(n) for _, f in functions(func) for n in ast.walk(f)}
        for node in ast.walk(func):
            if id(node) in inner or not isinstance(node, (ast.If, ast.While, ast.IfExp)):
                continue
            used = names_in(node.test)
            kinds = [kind for kind, flags in MODE_FLAGS.items() if used & flags]
            if kinds:
                total += 1
                holders[name] += 1
                for kind in kinds:
                    by_kind[kind] += 1
    whole = parts = 0
    for call in ast.walk(tree):
        if not isinstance(call, ast.Call):
            continue
        for arg in [*call.args, *(k.value for k in call.keywords)]:
            text = ast.unparse(arg)
            if text in ("cfg", "self.cfg"):
                whole += 1
            elif re.fullmatch(r"(self\.)?cfg(\.\w+)+", text):
                parts += 1
    return {"lines": len(source.splitlines()), "methods": len(methods), "mode_branches": total,
            "mode_branches_by_kind": by_kind, "methods_with_mode_branches": len(holders),
            "mode_branches_by_method": dict(sorted(holders.items())),
            "cfg_passed_whole": whole, "cfg_passed_parts": parts}


def module_name(root: Path, path: Path) -> str:
    """The import name of a source file (``envs/`` and ``trainers/`` as ``agentgym.envs``/``.trainers``)."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[0] in ("envs", "trainers"):
        parts = ["agentgym", *parts]
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def package_pairs(root: Path) -> dict[str, Any]:
    """The packages that import each other both ways (lazy imports included)."""
    packages = {p.name for p in (root / "agentgym").iterdir() if (p / "__init__.py").is_file()}
    packages |= {"envs", "trainers"}
    training = root / "agentgym" / "training"
    training_subs = {p.name for p in training.iterdir() if (p / "__init__.py").is_file()}
    known = packages | training_subs

    def package(module: str) -> str | None:
        parts = module.split(".")
        if len(parts) < 2 or parts[0] != "agentgym" or parts[1] not in packages:
            return None
        if parts[1] == "training" and len(parts) >= 3 and parts[2] in training_subs:
            return f"training.{parts[2]}"
        return parts[1]

    edges: dict[str, set[str]] = defaultdict(set)
    for base in CODE_ROOTS:
        for path in sorted((root / base).rglob("*.py")):
            module = module_name(root, path)
            source = package(module)
            if source is None:
                continue
            is_package = path.name == "__init__.py"
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                targets: list[str] = []
                if isinstance(node, ast.Import):
                    targets = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom):
                    if node.level:
                        anchor = module.split(".")
                        anchor = anchor[: len(anchor) - node.level + (1 if is_package else 0)]
                        target = ".".join([*anchor, *([node.module] if node.module else [])])
                    else:
                        target = node.module or ""
                    # ``from agentgym.training import run`` imports the subpackage ``training.run``
                    targets = [f"{target}.{a.name}" if a.name in known else target for a in node.names]
                for target in targets:
                    dest = package(target)
                    if dest is not None and dest != source:
                        edges[source].add(dest)
    pairs = sorted({tuple(sorted((a, b))) for a in edges for b in edges[a]
                    if a in edges.get(b, set()) and not b.startswith(a + ".") and not a.startswith(b + ".")})
    return {"two_way_pairs": len(pairs), "pairs": [f"{a} <-> {b}" for a, b in pairs]}


def code_files(root: Path) -> list[Path]:
    return [p for base in CODE_ROOTS for p in sorted((root / base).rglob("*.py"))]


def enclosing(tree: ast.AST) -> dict[int, str]:
    """``id(node)`` -> the qualified name of the innermost function holding it."""
    owner: dict[int, str] = {}
    for name, func in sorted(functions(tree), key=lambda item: item[0].count(".")):
        for node in ast.walk(func):
            owner[id(node)] = name
    return owner


def turn_builders(root: Path) -> dict[str, Any]:
    """Calls of ``Turn(...)`` outside the module that defines it."""
    places = []
    for path in code_files(root):
        rel = path.relative_to(root).as_posix()
        if rel == RECORDS:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        owner = enclosing(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and (
                    (isinstance(node.func, ast.Name) and node.func.id == "Turn")
                    or (isinstance(node.func, ast.Attribute) and node.func.attr == "Turn")):
                places.append(f"{rel}:{node.lineno} {owner.get(id(node), '<module>')}")
    return {"turn_builders": len(places), "places": places}


def _calls(func: ast.AST) -> set[str]:
    """Names of what ``func`` calls: ``fh.write(...)`` gives ``write``; ``json.dumps(...)`` gives ``dumps``
    and ``json.dumps``."""
    out = set()
    for node in ast.walk(func):
        if isinstance(node, ast.Call):
            if isinstance(node.func, ast.Attribute):
                out.add(node.func.attr)
                if isinstance(node.func.value, ast.Name):
                    out.add(f"{node.func.value.id}.{node.func.attr}")
            elif isinstance(node.func, ast.Name):
                out.add(node.func.id)
    return out


def _words(func: ast.AST) -> set[str]:
    """Lower-cased identifiers, argument names and short string constants in ``func``, and its name; the
    ``group`` of a regular-expression match (``m.group(1)``) is not an episode group."""
    out = {getattr(func, "name", "")}
    regex_group = False
    for node in ast.walk(func):
        if isinstance(node, ast.Name):
            out.add(node.id)
        elif isinstance(node, ast.Attribute):
            out.add(node.attr)
        elif isinstance(node, ast.arg):
            out.add(node.arg)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and len(node.value) < 80:
            out.add(node.value)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "group":
            regex_group = True
    if regex_group:
        out.discard("group")
    return {w.lower() for w in out}


def _names_trajectories(node: ast.AST) -> bool:
    """Whether ``node`` names the episode folder: an attribute ``trajectories``/``trajectory`` or a string
    holding ``trajectories``."""
    return any((isinstance(n, ast.Attribute) and n.attr in ("trajectories", "trajectory"))
               or (isinstance(n, ast.Constant) and isinstance(n.value, str) and "trajectories" in n.value
                   and len(n.value) < 80) for n in ast.walk(node))


def episode_io(root: Path) -> dict[str, Any]:
    """Functions that write episode records as JSON lines, and functions that read them back (the heuristic
    is in the module docstring)."""
    writers, readers = [], []
    for path in sorted((root / "agentgym").rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        tree = ast.parse(path.read_text(encoding="utf-8"))
        code = [n for n in tree.body if not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))]
        if not (any(w in path.stem for w in EPISODE_WORDS) or any(_names_trajectories(n) for n in code)):
            continue
        for name, func in functions(tree):
            if not any(w in word for word in _words(func) | {name.lower()} for w in EPISODE_WORDS):
                continue
            calls = _calls(func)
            if calls & {"json.dumps", "json.dump"} and any("write" in c or "file" in c for c in calls):
                writers.append(f"{rel} {name}")
            # Parsing stored text, not rebuilding a record from a dict already parsed (``from_json``).
            if calls & {"json.loads", "json.load"}:
                readers.append(f"{rel} {name}")
    formats = sorted({w.split(" ")[0] for w in writers})
    return {"record_formats": len(formats), "writer_modules": formats, "episode_writers": writers,
            "episode_readers": readers, "reader_modules": sorted({r.split(" ")[0] for r in readers})}


def complexity(func: ast.AST) -> int:
    """1 + decision points (see the module docstring)."""
    score = 1
    for node in ast.walk(func):
        if isinstance(node, (ast.If, ast.IfExp, ast.For, ast.AsyncFor, ast.While, ast.Try, ast.ExceptHandler,
                             ast.comprehension, ast.match_case)):
            score += 1
        elif isinstance(node, ast.BoolOp):
            score += len(node.values) - 1
    return score


def longest_functions(root: Path, count: int = 10) -> list[dict[str, Any]]:
    rows = []
    for path in code_files(root):
        rel = path.relative_to(root).as_posix()
        for name, func in functions(ast.parse(path.read_text(encoding="utf-8"))):
            rows.append({"function": f"{rel}:{name}", "lines": func.end_lineno - func.lineno + 1,
                         "complexity": complexity(func)})
    return sorted(rows, key=lambda r: (-r["lines"], r["function"]))[:count]


def test_files(root: Path) -> dict[str, int]:
    tests = root / "tests"
    files = list(tests.rglob("test_*.py"))
    top = [p for p in files if p.parent == tests]
    return {"root": len(top), "in_folders": len(files) - len(top)}


def measure(root: Path) -> dict[str, Any]:
    """Every measurement of the module docstring, for the checkout at ``root``."""
    numbers = doc_claims(root)
    duplicated = repeated_claims(root)
    return {"loop": loop_shape(root), "packages": package_pairs(root), "turn": turn_builders(root),
            "episode_io": episode_io(root), "longest_functions": longest_functions(root),
            "test_files": test_files(root),
            "doc_numbers": {"distinct": len(numbers), "duplicated": len(duplicated),
                            "duplicates": duplicated}}


def table(shape: dict[str, Any]) -> str:
    """The measurements as a plain-text table."""
    loop, kinds = shape["loop"], shape["loop"]["mode_branches_by_kind"]
    rows = [
        ("loop.py lines", loop["lines"]),
        ("loop.py methods", loop["methods"]),
        ("loop.py mode branches", f"{loop['mode_branches']} in {loop['methods_with_mode_branches']} methods ("
                                  + ", ".join(f"{k} {v}" for k, v in kinds.items()) + ")"),
        ("cfg passed in loop.py", f"{loop['cfg_passed_whole']} whole, {loop['cfg_passed_parts']} sections"),
        ("two-way package pairs", f"{shape['packages']['two_way_pairs']}: "
                                  + ", ".join(shape["packages"]["pairs"])),
        ("places that build Turn", shape["turn"]["turn_builders"]),
        ("record formats (writer modules)", f"{shape['episode_io']['record_formats']}: "
                                            + ", ".join(shape["episode_io"]["writer_modules"])),
        ("episode writers / readers", f"{len(shape['episode_io']['episode_writers'])} / "
                                      f"{len(shape['episode_io']['episode_readers'])} in "
                                      f"{len(shape['episode_io']['reader_modules'])} modules: "
                                      + ", ".join(shape["episode_io"]["reader_modules"])),
        ("test files root / in folders", f"{shape['test_files']['root']} / "
                                         f"{shape['test_files']['in_folders']}"),
        ("doc result claims in 2+ files", f"{shape['doc_numbers']['duplicated']} of "
                                          f"{shape['doc_numbers']['distinct']}"),
    ]
    width = max(len(name) for name, _ in rows)
    lines = [f"{name:<{width}}  {value}" for name, value in rows]
    lines.append("longest functions (lines, complexity):")
    lines += [f"  {r['lines']:>4} {r['complexity']:>4}  {r['function']}" for r in shape["longest_functions"]]
    return "\n".join(lines)


def rows(shape: dict[str, Any]) -> dict[str, str]:
    """The headline of each measurement, for a before/after table."""
    loop, io_ = shape["loop"], shape["episode_io"]
    longest = shape["longest_functions"][0]
    return {
        "`loop.py` lines / methods": f"{loop['lines']} / {loop['methods']}",
        "`loop.py` mode branches (async, processes, resume)": f"{loop['mode_branches']} in "
        f"{loop['methods_with_mode_branches']} methods ("
        + ", ".join(str(v) for v in loop["mode_branches_by_kind"].values()) + ")",
        "`cfg` handed to calls in `loop.py` (whole / a section)": f"{loop['cfg_passed_whole']} / "
                                                                  f"{loop['cfg_passed_parts']}",
        "package pairs importing each other": str(shape["packages"]["two_way_pairs"]),
        "places that build `Turn`": str(shape["turn"]["turn_builders"]),
        "modules writing episodes / reading them": f"{io_['record_formats']} / {len(io_['reader_modules'])}",
        "longest function (lines, complexity)": f"`{longest['function'].split(':')[-1]}` {longest['lines']}, "
                                                f"{longest['complexity']}",
        "functions over 150 lines": str(sum(r["lines"] > 150 for r in shape["longest_functions"])),
        "test files in tests/ / in its folders": f"{shape['test_files']['root']} / "
                                                 f"{shape['test_files']['in_folders']}",
        "doc results stated on two pages": f"{shape['doc_numbers']['duplicated']} of "
                                           f"{shape['doc_numbers']['distinct']}",
    }


def compared(before: dict[str, Any], after: dict[str, Any]) -> str:
    """A markdown table of two measurements, each column headed by the commit it measured."""
    def commit_of(shape: dict[str, Any]) -> str:
        record = shape.get("provenance", {})
        return str(record.get("measured_commit", record.get("commit", "?")))[:7]

    old, new = rows(before), rows(after)
    lines = [f"| measure | before ({commit_of(before)}) | after ({commit_of(after)}) |", "|---|---:|---:|"]
    return "\n".join(lines + [f"| {name} | {old.get(name, '')} | {new[name]} |" for name in new])


def checkout(rev: str, into: Path) -> str:
    """Extract the tree of commit ``rev`` into the folder ``into`` (``git archive``); its full hash."""
    try:
        full = subprocess.run(["git", "rev-parse", "--verify", f"{rev}^{{commit}}"], cwd=REPO, check=True,
                              capture_output=True, text=True).stdout.strip()
    except subprocess.CalledProcessError:
        raise SystemExit(f"--commit {rev!r} is not a commit of {REPO}; pass a hash or a ref from `git log`") \
            from None
    archive = subprocess.run(["git", "archive", full], cwd=REPO, check=True, capture_output=True).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return full


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--commit", help="measure this commit's tree instead of the working tree")
    parser.add_argument("--json", type=Path, help="also write the measurements, with provenance, here")
    parser.add_argument("--against", type=Path, metavar="JSON",
                        help="also print a markdown table of this earlier --json file against this run")
    args = parser.parse_args(argv)
    if args.against and not args.against.is_file():
        parser.error(f"--against {args.against}: no such file; pass a file an earlier --json wrote")
    with tempfile.TemporaryDirectory() as scratch:
        root, measured = REPO, None
        if args.commit:
            root = Path(scratch)
            measured = checkout(args.commit, root)
        shape = measure(root)
    print(table(shape))
    record = provenance(argv)
    if measured:
        record["measured_commit"] = measured  # the tree measured, not the checkout the script ran from
    shape = {"provenance": record, **shape}
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(shape, indent=2) + "\n", encoding="utf-8")
    if args.against:
        print()
        print(compared(json.loads(args.against.read_text(encoding="utf-8")), shape))
    return 0


if __name__ == "__main__":
    sys.exit(main())
