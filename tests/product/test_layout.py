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


#: Which agentgym sub-packages each layer may import (besides itself and the top level's env API).
LAYERS = {
    "agentgym.rollout": set(),
    # the helper kit of every HTTP service and client; it knows no service
    "agentgym.service_kit": set(),
    # serve-policy is a service like the sandbox and retrieval: it stands on the service kit
    "agentgym.backends": {"agentgym.rollout", "agentgym.service_kit"},
    # where the envs of training and evaluation come from: in-process, env services (http/), Ray
    "agentgym.sources": {"agentgym.rollout", "agentgym.http"},
    "agentgym.eval": {"agentgym.rollout", "agentgym.backends", "agentgym.sources", "agentgym.http",
                      "agentgym.service_kit"},
    "agentgym.training": {"agentgym.rollout", "agentgym.backends", "agentgym.sources"},
    # a user's agent as an env behind an OpenAI-compatible proxy: the chat rendering of rollout/, the wire
    # models of the policy server, the held-out seed range of eval/
    "agentgym.harness": {"agentgym.rollout", "agentgym.backends", "agentgym.eval", "agentgym.http"},
    "agentgym.http": {"agentgym.service_kit"},
    "agentgym.sandbox": {"agentgym.service_kit"},
    "agentgym.retrieval": {"agentgym.service_kit"},
}
SUBPACKAGES = {*LAYERS, "agentgym.envs", "agentgym.trainers"}


def _subpackage(module: str) -> str | None:
    for package in SUBPACKAGES:
        if module == package or module.startswith(package + "."):
            return package
    return None


def test_layers_only_point_down() -> None:
    wrong = []
    for module, targets in GRAPH.items():
        home = _subpackage(module)
        if home in ("agentgym.envs", "agentgym.trainers"):
            continue
        app = module.startswith("agentgym.cli") or module == "agentgym.__main__"  # may use every layer
        for target in targets:
            there = _subpackage(target)
            if there is None or there == home:
                continue
            if there in ("agentgym.envs", "agentgym.trainers"):
                wrong.append(f"{module} imports the plug-in {target}")
            elif app:
                continue
            elif home is None:
                wrong.append(f"top-level {module} imports {target}")  # the env API stands alone
            elif there not in LAYERS[home]:
                wrong.append(f"{module} ({home}) imports {target} ({there})")
    assert not wrong, "\n".join(sorted(wrong))


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
