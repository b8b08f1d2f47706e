"""The package's shape: no import cycle, layers that only point down, no private names across packages,
a torch-free env side, and module sizes that stay readable."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: Source folders and the import names they install as.
PACKAGES = {"agentgym": ROOT / "agentgym", "agentgym.envs": ROOT / "envs",
            "agentgym.trainers": ROOT / "trainers"}


def _module_name(path: Path) -> str:
    for name, folder in sorted(PACKAGES.items(), key=lambda item: -len(item[0])):
        if folder in path.parents or path.parent == folder:
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            return ".".join([name, *parts])
    raise AssertionError(path)


def _modules() -> dict[str, Path]:
    found = {}
    for folder in PACKAGES.values():
        for path in folder.rglob("*.py"):
            if "data" not in path.relative_to(folder).parts[:-1]:
                found[_module_name(path)] = path
    return found


MODULES = _modules()


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(name: str, path: Path, *, type_checking: bool = True) -> list[tuple[str, list[str]]]:
    """(imported module, imported names) of every import: module-level, lazy (in functions) and, unless
    ``type_checking`` is False, those under ``if TYPE_CHECKING:`` (a type-only dependency is still one)."""
    tree = ast.parse(path.read_text(), str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: list[tuple[str, list[str]]] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node) and not type_checking:
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.extend((alias.name, []) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
            names = [alias.name for alias in node.names]
            submodules = [f"{base}.{n}" for n in names if f"{base}.{n}" in MODULES]
            found.append((base, [n for n in names if f"{base}.{n}" not in MODULES]))
            found.extend((sub, []) for sub in submodules)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def _graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for name, path in MODULES.items():
        targets = set()
        for module, _ in _imports(name, path):
            while module and module not in MODULES:
                module = module.rpartition(".")[0]
            if module and module != name:
                targets.add(module)
        graph[name] = targets
    return graph


GRAPH = _graph()


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    result: list[list[str]] = []
    sys.setrecursionlimit(10_000)

    def strongconnect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                strongconnect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                result.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            strongconnect(v)
    return result


def test_the_walk_sees_the_package() -> None:
    assert {"agentgym.core", "agentgym.rollout.collector", "agentgym.training.run.loop",
            "agentgym.trainers.gigpo", "agentgym.envs.games.maze"} <= set(MODULES)
    assert "agentgym.rollout.records" in GRAPH["agentgym.rollout.collector"]


def test_no_import_cycle_anywhere() -> None:
    """Lazy (in-function) and type-only imports count: a cycle through them is still a cycle."""
    assert _cycles(GRAPH) == []


def test_the_cycle_finder_finds_cycles() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


#: The tree's layers: which packages each package may import, besides itself and the top level's env API
#: (``agentgym.core``, ``registry``, ``errors``... which import no package). Every package of the tree has a
#: row, and every import is checked against it, lazy (in-function) and type-only ones included: an import
#: that is not in its package's row points up or sideways.
TRAINING = ("agentgym.training.config", "agentgym.training.api", "agentgym.training.engine",
            "agentgym.training.run")
ALLOWED: dict[str, set[str]] = {
    "agentgym.rollout": set(),
    # the helper kit of every HTTP service and client; it knows no service
    "agentgym.service_kit": set(),
    "agentgym.http": {"agentgym.service_kit"},
    "agentgym.sandbox": {"agentgym.service_kit"},
    "agentgym.retrieval": {"agentgym.service_kit"},
    # serve-policy is a service like the sandbox and retrieval: it stands on the service kit
    "agentgym.backends": {"agentgym.rollout", "agentgym.service_kit"},
    # where the envs of training and evaluation come from: in-process, env services (http/), Ray
    "agentgym.sources": {"agentgym.rollout", "agentgym.http"},
    "agentgym.eval": {"agentgym.rollout", "agentgym.backends", "agentgym.sources", "agentgym.http",
                      "agentgym.service_kit"},
    # a user's agent as an env behind an OpenAI-compatible proxy: the chat rendering of rollout/, the wire
    # models of the policy server, the held-out seed range of eval/
    "agentgym.harness": {"agentgym.rollout", "agentgym.backends", "agentgym.eval", "agentgym.http"},
    # training/ is config < api < engine < run: each imports only those to its left (and the layers below)
    "agentgym.training.config": {"agentgym.rollout", "agentgym.backends"},
    "agentgym.training.api": {"agentgym.rollout", "agentgym.backends", *TRAINING[:1]},
    "agentgym.training.engine": {"agentgym.rollout", "agentgym.backends", *TRAINING[:2]},
    "agentgym.training.run": {"agentgym.rollout", "agentgym.backends", "agentgym.sources", *TRAINING[:3]},
    # the package's face (``from agentgym.training import load_config``) re-exports its layers
    "agentgym.training": set(TRAINING),
    # plug-ins of the framework, as a third-party package would be: they import it, never the CLI or
    # each other
    "agentgym.envs": {"agentgym.rollout", "agentgym.service_kit", "agentgym.http", "agentgym.sandbox",
                      "agentgym.retrieval", "agentgym.harness"},
    "agentgym.trainers": {"agentgym.rollout", *TRAINING[:3]},
    # the application: every layer of the framework, no plug-in (they are found by name)
    "agentgym.cli": {"agentgym.rollout", "agentgym.service_kit", "agentgym.http", "agentgym.sandbox",
                     "agentgym.retrieval", "agentgym.backends", "agentgym.sources", "agentgym.eval",
                     "agentgym.harness", *TRAINING, "agentgym.training"},
}
TOP = "agentgym (top level)"


def _package(module: str) -> str:
    """The row of ``ALLOWED`` a module belongs to (the longest matching package), or ``TOP``."""
    if module == "agentgym.__main__":
        return "agentgym.cli"
    found = [p for p in ALLOWED if module == p or module.startswith(p + ".")]
    return max(found, key=len) if found else TOP


def _against_the_table(graph: dict[str, set[str]], allowed: dict[str, set[str]]) -> list[str]:
    """One line per import that its package's row does not allow: the module, the import and the rule."""
    wrong = []
    for module, targets in graph.items():
        home = _package(module)
        for target in sorted(targets):
            there = _package(target)
            if there == home or there == TOP and home != TOP:
                continue
            if home == TOP:
                wrong.append(f"{module} imports {target}: the top level (the env API) imports no package")
            elif there not in allowed[home]:
                rule = ", ".join(sorted(allowed[home])) or "none"
                wrong.append(f"{module} imports {target}: {home} may import {rule} (ALLOWED in "
                             f"tests/product/test_layout.py)")
    return sorted(wrong)


def test_every_package_has_a_row() -> None:
    """A new package takes its place in the table; it does not fall through to the top level."""
    packages = {".".join(name.split(".")[:2]) for name, path in MODULES.items() if path.name == "__init__.py"}
    packages |= {".".join(name.split(".")[:3]) for name in MODULES if name.startswith("agentgym.training.")
                 and MODULES[name].name == "__init__.py"}
    missing = sorted(p for p in packages if p != "agentgym" and p not in ALLOWED)
    assert not missing, f"packages without a row in ALLOWED (tests/product/test_layout.py): {missing}"


def test_every_import_follows_the_table() -> None:
    """Lazy (in-function) and type-only imports count: each is a dependency of its module."""
    wrong = _against_the_table(GRAPH, ALLOWED)
    assert not wrong, "\n".join(wrong)


def test_the_table_check_names_the_module_the_import_and_the_rule() -> None:
    graph = {"agentgym.training.config.schema": {"agentgym.training.run.loop", "agentgym.core"},
             "agentgym.core": {"agentgym.rollout.records"},
             "agentgym.training.run.loop": {"agentgym.training.engine.update"}}
    assert _against_the_table(graph, ALLOWED) == [
        "agentgym.core imports agentgym.rollout.records: the top level (the env API) imports no package",
        "agentgym.training.config.schema imports agentgym.training.run.loop: agentgym.training.config may "
        "import agentgym.backends, agentgym.rollout (ALLOWED in tests/product/test_layout.py)"]


def _two_way_pairs(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    edges = {(_package(m), _package(t)) for m, targets in graph.items() for t in targets}
    return {tuple(sorted(edge)) for edge in edges if edge[0] != edge[1] and edge[::-1] in edges}


def test_no_two_packages_import_each_other() -> None:
    assert _two_way_pairs(GRAPH) == set()


def _subpackage(module: str) -> str | None:
    package = _package(module)
    return None if package == TOP else package


def test_plugins_import_the_framework_never_each_other_privately() -> None:
    wrong = []
    for module, path in MODULES.items():
        here = _subpackage(module) or "agentgym"
        for target, names in _imports(module, path):
            if not target.startswith("agentgym"):
                continue
            there = _subpackage(target) or "agentgym"
            private = [n for n in names if n.startswith("_") and not n.startswith("__")]
            if private and there != here:
                wrong.append(f"{module} imports private {private} from {target}")
    assert not wrong, "\n".join(wrong)


def test_env_side_runs_without_torch() -> None:
    """``import agentgym``, ``make``, the rollout package and the HTTP service work with torch
    unimportable."""
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "import agentgym, agentgym.rollout, agentgym.backends, agentgym.training, agentgym.eval\n"
        "env = agentgym.make('maze-v0'); env.reset(seed=0); env.step('up')\n"
        "from agentgym.http.server import create_app; create_app(['maze-v0'])\n"
        "from agentgym.training import load_config\n"
        "assert 'torch' not in [m for m in sys.modules if sys.modules[m] is not None]\n"
        "print('ok')\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                            check=False)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-2000:]


@pytest.mark.parametrize("limit", [700])
def test_modules_stay_readable(limit: int) -> None:
    long = {name: n for name, path in MODULES.items() if (n := len(path.read_text().splitlines())) > limit}
    assert not long, f"modules over {limit} lines (one module, one job?): {long}"
