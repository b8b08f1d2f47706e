"""The vLLM backends against the installed vLLM, without importing it.

vLLM cannot run here (it needs CUDA and pins a torch of its own), so its source is read: the package is
located with ``importlib.util.find_spec`` and parsed with ``ast``, and every vLLM class, method, keyword
argument, attribute, HTTP route, request field, environment variable and ``vllm serve`` flag that
``agentgym/backends/vllm_backend.py`` and ``vllm_server.py`` use is looked up in it. What is looked up is
read off the backends' own code (calls on the ``vllm`` module and on the ``vllm.LLM``, the keywords and
the values they pass, the sleep tags, the attribute path to the engine's model, the routes and request
bodies); the tables below say only where vLLM keeps what the code cannot name. ``make setup`` installs
the pinned vLLM without its requirements (``pip install --no-deps``), so this runs on every clone.
"""

from __future__ import annotations

import ast
import importlib.machinery
import importlib.metadata
import importlib.util
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
BACKEND = ROOT / "agentgym" / "backends" / "vllm_backend.py"
SERVER = ROOT / "agentgym" / "backends" / "vllm_server.py"
OPENAI = ROOT / "agentgym" / "backends" / "openai_backend.py"
TINY = ROOT / "agentgym" / "backends" / "tiny.py"

# --- what the code cannot name: where vLLM keeps it --------------------------------------------------

#: Expressions in the backends that hold vLLM objects, and what they hold.
RECEIVERS = {"vllm": "vllm", "self.vllm": "vllm", "self.llm": "vllm.LLM"}
#: ``VLLMEngine.load_weights`` walks from the ``vllm.LLM`` to the model through these attributes (the
#: engine in this process: ``VLLM_ENABLE_V1_MULTIPROCESSING=0``); each step: the classes that hold it.
WEIGHT_PATH = [
    ("llm_engine", ["vllm.entrypoints.llm.LLM"]),
    ("model_executor", ["vllm.v1.engine.llm_engine.LLMEngine"]),
    ("driver_worker", ["vllm.v1.executor.uniproc_executor.UniProcExecutor",
                       "vllm.v1.executor.uniproc_executor.ExecutorWithExternalLauncher"]),
    ("worker", ["vllm.v1.worker.worker_base.WorkerWrapperBase"]),
    ("model_runner", ["vllm.v1.worker.gpu_worker.Worker"]),
    ("model", ["vllm.v1.worker.gpu_model_runner.GPUModelRunner",  # model runner V1
               "vllm.v1.worker.gpu.model_runner.GPUModelRunner"]),  # model runner V2
    ("load_weights", []),  # the model's own class: every architecture tiny.py builds (REGISTRY)
]
#: The module whose environment flag decides whether ``LLMEngine.model_executor`` exists.
IN_PROCESS_FLAG = ("VLLM_ENABLE_V1_MULTIPROCESSING", "vllm/v1/engine/llm_engine.py")
#: Where vLLM maps Hugging Face architectures to its model classes.
REGISTRY = ("vllm.model_executor.models.registry", "_TEXT_GENERATION_MODELS", "vllm.model_executor.models")
#: The tags ``LLM.wake_up`` takes (the executor's sleeping tags).
SLEEP_TAGS = ("vllm.v1.executor.abstract", "SLEEP_TAGS")
#: Keywords whose annotation admits any str although vLLM knows their values: keyword -> the Literal.
VALUE_LITERALS = {"distributed_executor_backend": "vllm.config.parallel.DistributedExecutorBackend"}
#: The limit ``VLLMPolicy.max_top_logprobs`` restates: vLLM's default ``--max-logprobs``.
MAX_LOGPROBS = ("vllm.config.model.ModelConfig", "max_logprobs")
#: Where the environment variables are declared, and the classes whose fields are ``vllm serve`` flags.
ENVS = ("vllm.envs", "environment_variables")
SERVE_FLAGS = ["vllm.engine.arg_utils.EngineArgs", "vllm.entrypoints.common.cli_args.FrontendArgs"]
#: Values in request bodies that name something in vLLM: (route, key) -> the class holding that method.
BODY_VALUES = {("/collective_rpc", "method"): "vllm.v1.worker.gpu_worker.Worker"}
#: The OpenAI routes ``OpenAIPolicy`` (the vllm-server generator) sends its vLLM-only fields to.
OPENAI_ROUTES = ["/v1/completions", "/v1/chat/completions"]
#: What ``generation_from_output`` reads of a ``vllm.RequestOutput``: attribute -> the class holding it.
OUTPUT_FIELDS = {"outputs": "vllm.outputs.RequestOutput", "token_ids": "vllm.outputs.CompletionOutput",
                 "logprobs": "vllm.outputs.CompletionOutput",
                 "finish_reason": "vllm.outputs.CompletionOutput",
                 "logprob": "vllm.logprobs.Logprob", "rank": "vllm.logprobs.Logprob"}


# --- vLLM's source, read without importing it --------------------------------------------------------


def vllm_root() -> Path:
    """The folder holding the installed ``vllm`` package (found, never imported)."""
    if "vllm" in sys.modules:  # a stand-in a test put there (its __spec__ is None): search the path itself
        spec = importlib.machinery.PathFinder.find_spec("vllm")
    else:
        spec = importlib.util.find_spec("vllm")
    assert spec is not None and spec.submodule_search_locations, (
        "vllm is not installed: `make setup` installs the pinned version with --no-deps (read, not imported)")
    return Path(next(iter(spec.submodule_search_locations))).parent


@dataclass(frozen=True)
class Ref:
    """Something found in vLLM's source: a module, class, function or value, in ``module``."""

    module: str
    node: ast.AST | None  # None: the module itself
    name: str

    @property
    def kind(self) -> str:
        if self.node is None:
            return "module"
        if isinstance(self.node, ast.ClassDef):
            return "class"
        if isinstance(self.node, ast.FunctionDef | ast.AsyncFunctionDef):
            return "function"
        return "value"


@dataclass
class Signature:
    """What a call accepts: positional names, keyword names, and where ``**kwargs`` go."""

    where: str
    positional: list[str]
    keywords: dict[str, ast.expr | None]  # name -> annotation
    module: str
    var_positional: bool = False
    passthrough: list[Ref] = field(default_factory=list)  # callees of **kwargs
    open_kwargs: bool = False  # **kwargs taken and not passed on: anything goes


FIELD_BASES = {"Struct", "TypedDict", "BaseModel", "NamedTuple", "OpenAIBaseModel"}


class Source:
    """The vllm package's source, parsed on demand."""

    def __init__(self, root: Path) -> None:
        self.root = root

    @cache  # noqa: B019  (one Source per session)
    def tree(self, module: str) -> ast.Module | None:
        if module != "vllm" and not module.startswith("vllm."):  # the folder holds other packages too
            return None
        base = self.root.joinpath(*module.split("."))
        for path in (base.with_suffix(".py"), base / "__init__.py"):
            if path.is_file():
                return ast.parse(path.read_text(encoding="utf-8"), str(path))
        return None

    def is_package(self, module: str) -> bool:
        return self.root.joinpath(*module.split("."), "__init__.py").is_file()

    def absolute(self, module: str, relative: str | None, level: int) -> str:
        if not level:
            return relative or ""
        package = module.split(".") if self.is_package(module) else module.split(".")[:-1]
        base = package[: len(package) - (level - 1)]
        return ".".join(base + ([relative] if relative else []))

    # -- names --

    def top_level(self, module: str) -> Iterator[ast.stmt]:
        """Module-level statements as run: into if/try bodies, past ``if TYPE_CHECKING:`` (its else runs)."""
        tree = self.tree(module)
        stack = list(reversed(tree.body)) if tree else []
        while stack:
            stmt = stack.pop()
            if isinstance(stmt, ast.If):
                checking = "TYPE_CHECKING" in ast.unparse(stmt.test)
                stack.extend(reversed(stmt.orelse if checking else stmt.body + stmt.orelse))
            elif isinstance(stmt, ast.Try):
                stack.extend(reversed(stmt.body + stmt.orelse + stmt.finalbody
                                      + [s for h in stmt.handlers for s in h.body]))
            else:
                yield stmt

    def find(self, dotted: str) -> Ref | None:
        """``vllm.a.b.Name`` or ``vllm.a.b.Class.member``: the longest module prefix, then names in it."""
        parts = dotted.split(".")
        for cut in range(len(parts), 0, -1):
            module = ".".join(parts[:cut])
            if self.tree(module) is None:
                continue
            ref: Ref | None = Ref(module, None, module)
            for name in parts[cut:]:
                ref = self.attribute(ref, name) if ref else None
            return ref
        return None

    def attribute(self, ref: Ref, name: str) -> Ref | None:
        if ref.kind == "module":
            return self.name_in(ref.module, name)
        if ref.kind == "class":
            return self.member(ref, name)
        return None

    def name_in(self, module: str, name: str, depth: int = 0) -> Ref | None:
        """What ``name`` is bound to at the top of ``module``: definitions, imports, aliases, and the lazy
        re-exports of a module ``__getattr__`` (a dict of ``name: "module:attr"``)."""
        if depth > 20 or self.tree(module) is None:
            return None
        lazy: ast.Dict | None = None
        has_getattr = False
        for stmt in self.top_level(module):
            if isinstance(stmt, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                has_getattr |= stmt.name == "__getattr__"
                if stmt.name == name:
                    return Ref(module, stmt, name)
            elif isinstance(stmt, ast.Assign | ast.AnnAssign):
                targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
                if any(isinstance(t, ast.Name) and t.id == name for t in targets) and stmt.value is not None:
                    if isinstance(stmt.value, ast.Name | ast.Attribute):
                        return self.expression(module, stmt.value, depth + 1) or Ref(module, stmt.value, name)
                    return Ref(module, stmt.value, name)
                if isinstance(stmt.value, ast.Dict) and any(
                        isinstance(k, ast.Constant) and k.value == name for k in stmt.value.keys):
                    lazy = stmt.value
            elif isinstance(stmt, ast.ImportFrom):
                for alias in stmt.names:
                    if (alias.asname or alias.name) == name:
                        source = self.absolute(module, stmt.module, stmt.level)
                        found = self.name_in(source, alias.name, depth + 1)
                        if found is None and self.tree(f"{source}.{alias.name}") is not None:
                            found = Ref(f"{source}.{alias.name}", None, alias.name)
                        return found
            elif isinstance(stmt, ast.Import):
                for alias in stmt.names:
                    if alias.asname == name:
                        return Ref(alias.name, None, name)
                    if alias.asname is None and alias.name.split(".")[0] == name:
                        return Ref(name, None, name)
        if lazy is not None and has_getattr:
            value = lazy.values[[k.value for k in lazy.keys if isinstance(k, ast.Constant)].index(name)]
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                target, _, attr = value.value.partition(":")
                level = len(target) - len(target.lstrip("."))
                source = self.absolute(module, target.lstrip(".") or None, level)
                return self.name_in(source, attr or name, depth + 1)
        if self.tree(f"{module}.{name}") is not None:
            return Ref(f"{module}.{name}", None, name)
        return None

    def expression(self, module: str, node: ast.expr, depth: int = 0) -> Ref | None:
        """A name or dotted attribute as written in ``module``."""
        if isinstance(node, ast.Name):
            return self.name_in(module, node.id, depth)
        if isinstance(node, ast.Attribute):
            base = self.expression(module, node.value, depth)
            return self.attribute(base, node.attr) if base else None
        if isinstance(node, ast.Constant) and isinstance(node.value, str):  # a forward reference
            return self.expression(module, ast.parse(node.value, mode="eval").body, depth)
        return None

    # -- classes --

    def bases(self, cls: Ref) -> Iterator[Ref]:
        assert isinstance(cls.node, ast.ClassDef)
        for base in cls.node.bases:
            found = self.expression(cls.module, base.value if isinstance(base, ast.Subscript) else base)
            if found is not None and found.kind == "class":
                yield found

    def mro(self, cls: Ref) -> list[Ref]:
        order, todo = [], [cls]
        while todo:
            current = todo.pop(0)
            if all(current.node is not seen.node for seen in order):
                order.append(current)
                todo.extend(self.bases(current))
        return order

    def member(self, cls: Ref, name: str) -> Ref | None:
        """A method, class attribute or ``self.name`` assigned in a method, of ``cls`` or its bases."""
        for klass in self.mro(cls):
            assert isinstance(klass.node, ast.ClassDef)
            for stmt in klass.node.body:
                if (isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
                        and stmt.name == name):
                    return Ref(klass.module, stmt, f"{klass.name}.{name}")
                if isinstance(stmt, ast.AnnAssign | ast.Assign):
                    targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
                    if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                        return Ref(klass.module, stmt, f"{klass.name}.{name}")
            for node in ast.walk(klass.node):
                targets = (node.targets if isinstance(node, ast.Assign)
                           else [node.target] if isinstance(node, ast.AnnAssign) else [])
                if any(isinstance(t, ast.Attribute) and t.attr == name and isinstance(t.value, ast.Name)
                       and t.value.id == "self" for t in targets):
                    return Ref(klass.module, node, f"{klass.name}.{name}")
        return None

    def is_field_class(self, cls: Ref) -> bool:
        """Constructed from its annotated fields: a dataclass, msgspec struct, TypedDict, pydantic model."""
        for klass in self.mro(cls):
            assert isinstance(klass.node, ast.ClassDef)
            decorators = {ast.unparse(d).split("(")[0].split(".")[-1] for d in klass.node.decorator_list}
            names = {ast.unparse(b).split("[")[0].split(".")[-1] for b in klass.node.bases}
            if "dataclass" in decorators or names & FIELD_BASES:
                return True
        return False

    def fields(self, cls: Ref) -> dict[str, tuple[str, ast.AnnAssign]]:
        """Annotated class-level fields over the bases (base first), ClassVars left out."""
        found: dict[str, tuple[str, ast.AnnAssign]] = {}
        for klass in reversed(self.mro(cls)):
            assert isinstance(klass.node, ast.ClassDef)
            for stmt in klass.node.body:
                if (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)
                        and "ClassVar" not in ast.unparse(stmt.annotation)):
                    found[stmt.target.id] = (klass.module, stmt)
        return found

    # -- calls --

    def signature(self, ref: Ref) -> Signature:
        """What calling ``ref`` (a class or function; a method is called on its instance) accepts."""
        if ref.kind == "class":
            init = self.member(ref, "__init__")
            if self.is_field_class(ref) and not (init and init.node in ref.node.body):  # type: ignore[union-attr]
                fields = self.fields(ref)
                return Signature(f"{ref.module}.{ref.name}", list(fields),
                                 {n: s.annotation for n, (_, s) in fields.items()}, ref.module)
            if init is None or init.kind != "function":
                return Signature(f"{ref.module}.{ref.name}", [], {}, ref.module)
            sig = self.signature(init)
            sig.where = f"{ref.module}.{ref.name}"
            return sig
        assert isinstance(ref.node, ast.FunctionDef | ast.AsyncFunctionDef), f"{ref.name} is not callable"
        args = ref.node.args
        positional = [a.arg for a in args.posonlyargs + args.args]
        decorators = {ast.unparse(d) for d in ref.node.decorator_list}
        if positional and positional[0] in ("self", "cls") and "staticmethod" not in decorators:
            positional = positional[1:]
        keywords = {a.arg: a.annotation for a in args.args + args.kwonlyargs}
        keywords.pop("self", None)
        sig = Signature(f"{ref.module}.{ref.name}", positional, keywords, ref.module,
                        var_positional=args.vararg is not None)
        if args.kwarg is not None:
            for node in ast.walk(ref.node):
                if isinstance(node, ast.Call) and any(
                        k.arg is None and isinstance(k.value, ast.Name) and k.value.id == args.kwarg.arg
                        for k in node.keywords):
                    callee = self.expression(ref.module, node.func)
                    assert callee is not None, (
                        f"{sig.where} passes **{args.kwarg.arg} to {ast.unparse(node.func)}, "
                        "which this test cannot find in vLLM's source")
                    sig.passthrough.append(callee)
            sig.open_kwargs = not sig.passthrough
        return sig

    def accepts(self, ref: Ref, keyword: str, depth: int = 0) -> tuple[Signature, ast.expr | None] | None:
        """The signature that takes ``keyword`` (following ``**kwargs`` on), and its annotation."""
        sig = self.signature(ref)
        if keyword in sig.keywords:
            return sig, sig.keywords[keyword]
        if sig.open_kwargs:
            return sig, None
        for callee in sig.passthrough if depth < 5 else []:
            found = self.accepts(callee, keyword, depth + 1)
            if found:
                return found
        return None

    def literal(self, module: str, annotation: ast.expr | None, depth: int = 0) -> set[object] | None:
        """The values a ``Literal`` annotation (also through aliases and unions) allows; None: any."""
        if annotation is None or depth > 10:
            return None
        if isinstance(annotation, ast.Constant):
            if annotation.value is None:
                return set()
            if isinstance(annotation.value, str):
                return self.literal(module, ast.parse(annotation.value, mode="eval").body, depth + 1)
        if isinstance(annotation, ast.BinOp) and isinstance(annotation.op, ast.BitOr):
            left = self.literal(module, annotation.left, depth + 1)
            right = self.literal(module, annotation.right, depth + 1)
            return None if left is None or right is None else left | right
        if isinstance(annotation, ast.Subscript):
            head = ast.unparse(annotation.value).split(".")[-1]
            items = (annotation.slice.elts if isinstance(annotation.slice, ast.Tuple) else [annotation.slice])
            if head == "Literal":
                return {ast.literal_eval(item) for item in items}
            if head in ("Union", "Optional"):
                parts = [self.literal(module, item, depth + 1) for item in items]
                return None if any(p is None for p in parts) else set().union(*parts)  # type: ignore[arg-type]
            if head == "Annotated":
                return self.literal(module, items[0], depth + 1)
            return None
        if isinstance(annotation, ast.Name | ast.Attribute):
            found = self.expression(module, annotation)
            if found is not None and found.kind == "value":
                return self.literal(found.module, found.node, depth + 1)  # type: ignore[arg-type]
        return None


@pytest.fixture(scope="module")
def source() -> Source:
    return Source(vllm_root())


# --- what the backends use, read off their code ------------------------------------------------------


@dataclass
class Call:
    """One call the backend makes on a vLLM object."""

    where: str
    target: str  # e.g. vllm.LLM, vllm.LLM.generate
    positional: int
    keywords: dict[str, ast.expr]

    def __str__(self) -> str:
        return f"{self.where}: {self.target}({', '.join(self.keywords)})"


def parse(path: Path, text: str | None = None) -> ast.Module:
    return ast.parse(text if text is not None else path.read_text(encoding="utf-8"), str(path))


def functions(tree: ast.Module) -> Iterator[ast.FunctionDef]:
    yield from (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef))


def spread_keywords(function: ast.FunctionDef, name: str) -> dict[str, ast.expr]:
    """The keys a ``**name`` spreads: ``name["key"] = value`` and ``name = {"key": value}`` in a function."""
    keys: dict[str, ast.expr] = {}
    for node in ast.walk(function):
        if isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if (isinstance(target, ast.Subscript) and ast.unparse(target.value) == name
                        and isinstance(target.slice, ast.Constant) and node.value is not None):
                    keys[target.slice.value] = node.value
                if isinstance(target, ast.Name) and target.id == name and isinstance(node.value, ast.Dict):
                    keys.update({k.value: v for k, v in zip(node.value.keys, node.value.values, strict=True)
                                 if isinstance(k, ast.Constant)})
    return keys


def vllm_calls(tree: ast.Module, filename: str) -> tuple[list[Call], list[tuple[str, str]]]:
    """Calls on vLLM objects (``RECEIVERS``), and attributes read off them without a call."""
    calls, attributes = [], []
    called = set()
    for function in functions(tree):
        for node in ast.walk(function):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            receiver = ast.unparse(node.func.value)
            if receiver not in RECEIVERS:
                continue
            called.add(id(node.func))
            keywords: dict[str, ast.expr] = {}
            for keyword in node.keywords:
                if keyword.arg is None:
                    keywords.update(spread_keywords(function, ast.unparse(keyword.value)))
                else:
                    keywords[keyword.arg] = keyword.value
            calls.append(Call(f"{filename}:{node.lineno}", f"{RECEIVERS[receiver]}.{node.func.attr}",
                              len(node.args), keywords))
    for node in ast.walk(tree):
        holder = RECEIVERS.get(ast.unparse(node.value)) if isinstance(node, ast.Attribute) else None
        if holder not in (None, "vllm") and id(node) not in called:
            attributes.append((f"{filename}:{node.lineno}", f"{holder}.{node.attr}"))  # type: ignore[union-attr]
    return calls, attributes


def settings_values(tree: ast.Module) -> dict[str, set[object] | None]:
    """``VLLMSettings`` fields: the values a field can hold (its Literal, or its str default), or None."""
    values: dict[str, set[object] | None] = {}
    classes = [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == "VLLMSettings"]
    for stmt in classes[0].body if classes else []:
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            note = stmt.annotation
            if isinstance(note, ast.Subscript) and ast.unparse(note.value) == "Literal":
                items = note.slice.elts if isinstance(note.slice, ast.Tuple) else [note.slice]
                values[stmt.target.id] = {ast.literal_eval(i) for i in items}
            elif isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str):
                values[stmt.target.id] = {stmt.value.value}
            else:
                values[stmt.target.id] = None
    return values


def passed_values(node: ast.expr, settings: dict[str, set[object] | None]) -> set[object] | None:
    """What a keyword's value can be: a constant, or a ``settings.field`` of ``VLLMSettings``."""
    if isinstance(node, ast.Constant):
        return {node.value}
    if isinstance(node, ast.Attribute) and ast.unparse(node.value) in ("settings", "self.settings"):
        return settings.get(node.attr)
    return None


def check_calls(source: Source, tree: ast.Module, filename: str) -> list[str]:
    """Every call on a vLLM object names something vLLM has and passes keywords (and values, where its
    annotation is a Literal) it takes; every attribute read off one exists."""
    problems = []
    settings = settings_values(tree) or settings_values(parse(BACKEND))
    calls, attributes = vllm_calls(tree, filename)
    for call in calls:
        ref = source.find(call.target)
        if ref is None:
            problems.append(f"{call.where}: vLLM has no {call.target}")
            continue
        sig = source.signature(ref)
        if call.positional > len(sig.positional) and not sig.var_positional:
            problems.append(f"{call.where}: {call.target} takes {len(sig.positional)} positional "
                            f"arguments ({', '.join(sig.positional)}), the backend passes {call.positional}")
        for keyword, value in call.keywords.items():
            taken = source.accepts(ref, keyword)
            if taken is None:
                problems.append(f"{call.where}: {call.target} takes no keyword {keyword!r} "
                                f"(checked {sig.where} and where its **kwargs go)")
                continue
            allowed = source.literal(taken[0].module, taken[1])
            if allowed is None and keyword in VALUE_LITERALS:
                alias = source.find(VALUE_LITERALS[keyword])
                if alias is None or alias.kind != "value":
                    problems.append(f"vLLM has no {VALUE_LITERALS[keyword]} (VALUE_LITERALS)")
                    continue
                allowed = source.literal(alias.module, alias.node)  # type: ignore[arg-type]
            passed = passed_values(value, settings)
            if allowed is not None and passed is not None and not passed <= allowed:
                problems.append(f"{call.where}: {call.target}({keyword}=...) may pass "
                                f"{sorted(map(str, passed))}; vLLM allows {sorted(map(str, allowed))}")
    for where, target in attributes:
        if source.find(target) is None:
            problems.append(f"{where}: vLLM has no {target}")
    return problems


def weight_path(tree: ast.Module) -> list[str]:
    """The attributes ``VLLMEngine.load_weights`` walks, in order (``getattr`` names included)."""
    engine = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == "VLLMEngine")
    method = next(n for n in engine.body if isinstance(n, ast.FunctionDef) and n.name == "load_weights")
    steps = []
    for node in ast.walk(method):
        if isinstance(node, ast.Attribute) and ast.unparse(node) != "self.llm":
            steps.append((node.end_lineno, node.end_col_offset, node.attr))
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr"
                and isinstance(node.args[1], ast.Constant)):
            steps.append((node.end_lineno, node.end_col_offset, node.args[1].value))
    return [name for *_, name in sorted(steps)]


def tiny_architectures() -> list[str]:
    """The Hugging Face model classes ``agentgym.backends.tiny`` builds (what the tests hand to vLLM)."""
    return sorted({a.name for n in ast.walk(parse(TINY)) if isinstance(n, ast.ImportFrom)
                   and n.module == "transformers" for a in n.names if a.name.endswith("ForCausalLM")
                   and not a.name.startswith("Auto")})


def module_constant(source: Source, module: str, name: str) -> object:
    ref = source.name_in(module, name)
    assert ref is not None and ref.kind == "value", f"vLLM has no {module}.{name}"
    node = ref.node
    if isinstance(node, ast.Call) and ast.unparse(node.func) in ("frozenset", "set", "tuple", "dict"):
        node = node.args[0] if node.args else ast.Dict([], [])
    return ast.literal_eval(node) if not isinstance(node, ast.Dict) else node  # type: ignore[arg-type]


def routes(source: Source) -> dict[str, list[tuple[str, ast.AsyncFunctionDef | ast.FunctionDef]]]:
    """Every ``@router.post("/route")``-style handler of vLLM's servers: route -> [(module, handler)]."""
    found: dict[str, list[tuple[str, ast.AsyncFunctionDef | ast.FunctionDef]]] = {}
    for path in sorted((source.root / "vllm" / "entrypoints").rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        if ".post(" not in text and ".api_route(" not in text:
            continue
        module = ".".join(path.relative_to(source.root).with_suffix("").parts).removesuffix(".__init__")
        for node in ast.walk(ast.parse(text, str(path))):
            if not isinstance(node, ast.AsyncFunctionDef | ast.FunctionDef):
                continue
            for decorator in node.decorator_list:
                if (isinstance(decorator, ast.Call) and isinstance(decorator.func, ast.Attribute)
                        and decorator.func.attr in ("post", "api_route") and decorator.args
                        and isinstance(decorator.args[0], ast.Constant)):
                    found.setdefault(decorator.args[0].value, []).append((module, node))
    return found


def body_keys(source: Source, module: str, handler: ast.AsyncFunctionDef | ast.FunctionDef) -> set[str]:
    """The request-body keys a handler reads: its pydantic model's fields, or the keys it ``.get``s."""
    for arg in handler.args.args:
        model = source.expression(module, arg.annotation) if arg.annotation is not None else None
        if model is not None and model.kind == "class":
            return set(source.fields(model))
    keys = set()
    for node in ast.walk(handler):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
                and node.args and isinstance(node.args[0], ast.Constant)):
            keys.add(node.args[0].value)
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
            keys.add(node.slice.value)
    return keys


def posts(tree: ast.Module) -> list[tuple[int, str, dict[str, object] | None]]:
    """``self._post("/route", {body})`` calls of ``vllm_server``: (line, route, body)."""
    found = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and ast.unparse(node.func) == "self._post"
                and isinstance(node.args[0], ast.Constant)):
            body = node.args[1]
            keys = ({k.value: (v.value if isinstance(v, ast.Constant) else None)
                     for k, v in zip(body.keys, body.values, strict=True) if isinstance(k, ast.Constant)}
                    if isinstance(body, ast.Dict) else None)
            found.append((node.lineno, node.args[0].value, keys))
    return found


def check_routes(source: Source, tree: ast.Module, filename: str) -> list[str]:
    problems = []
    served = routes(source)
    for line, route, body in posts(tree):
        if route not in served:
            problems.append(f"{filename}:{line}: no vLLM server answers POST {route}")
            continue
        for key, value in (body or {}).items():
            if not any(key in body_keys(source, module, handler) for module, handler in served[route]):
                problems.append(f"{filename}:{line}: POST {route} reads no {key!r} from its body")
            holder = BODY_VALUES.get((route, key))
            if holder is not None:
                cls = source.find(holder)
                if cls is None or source.member(cls, str(value)) is None:
                    problems.append(f"{filename}:{line}: POST {route} {key}={value!r}: {holder} has no "
                                    f"{value!r}")
    return problems


# --- the checks ---------------------------------------------------------------------------------------


def test_installed_vllm_is_the_pinned_one() -> None:
    """The vLLM read here is the one the ``vllm`` extra allows and ``make setup`` installs."""
    installed = importlib.metadata.version("vllm")
    line = re.search(r"^vllm = (\[.*\])$", (ROOT / "pyproject.toml").read_text(), re.MULTILINE)
    assert line, "pyproject.toml has no vllm extra"
    extra = ast.literal_eval(line.group(1))
    [requirement] = [Requirement(r) for r in extra if Requirement(r).name == "vllm"]
    assert requirement.specifier.contains(installed, prereleases=True), (
        f"vllm {installed} is installed, the vllm extra asks for {requirement}")
    pins = re.findall(r"\bvllm==([\w.]+)", (ROOT / "Makefile").read_text())
    assert pins == [installed], f"make setup installs vllm {pins}, {installed} is installed: run make setup"
    from agentgym.backends.vllm_backend import SUPPORTED_VLLM

    assert installed.startswith(f"{SUPPORTED_VLLM}."), f"the backends say vLLM {SUPPORTED_VLLM}"
    assert (vllm_root() / "vllm" / "entrypoints" / "llm.py").is_file()


def test_every_call_on_vllm_objects_exists_with_its_keywords(source: Source) -> None:
    tree = parse(BACKEND)
    calls, attributes = vllm_calls(tree, BACKEND.name)
    targets = {c.target for c in calls}
    # What the backend is known to call: a check that the walk above still sees the calls.
    assert {"vllm.LLM", "vllm.SamplingParams", "vllm.TokensPrompt", "vllm.LLM.generate", "vllm.LLM.sleep",
            "vllm.LLM.wake_up", "vllm.LLM.reset_prefix_cache"} <= targets, targets
    llm = next(c for c in calls if c.target == "vllm.LLM")
    assert "distributed_executor_backend" in llm.keywords  # spread from **extra
    assert check_calls(source, tree, BACKEND.name) == []


def test_the_server_backend_makes_no_calls_on_vllm_objects(source: Source) -> None:
    """``vllm_server`` talks HTTP (its routes are checked below); whatever it calls on vLLM is checked."""
    assert check_calls(source, parse(SERVER), SERVER.name) == []


def test_the_weight_path_to_the_engines_model(source: Source) -> None:
    steps = weight_path(parse(BACKEND))
    assert steps == [name for name, _ in WEIGHT_PATH], (
        f"VLLMEngine.load_weights walks {steps}; WEIGHT_PATH here says where vLLM keeps each step")
    for name, holders in WEIGHT_PATH:
        for holder in holders:
            cls = source.find(holder)
            assert cls is not None and cls.kind == "class", f"vLLM has no class {holder}"
            assert source.member(cls, name) is not None, f"{holder} has no {name!r}"
    flag, module = IN_PROCESS_FLAG
    assert flag in (source.root / module).read_text(), f"{module} no longer reads {flag}"
    assert flag in BACKEND.read_text()


def test_the_models_vllm_loads_take_weights(source: Source) -> None:
    """The engine's model is vLLM's class of each architecture: it takes (name, tensor) pairs."""
    registry_module, table, package = REGISTRY
    registry = module_constant(source, registry_module, table)
    assert isinstance(registry, ast.Dict)
    entries = {k.value: ast.literal_eval(v) for k, v in zip(registry.keys, registry.values, strict=True)
               if isinstance(k, ast.Constant)}
    architectures = tiny_architectures()
    assert architectures, "tiny.py builds no *ForCausalLM this test can see"
    for architecture in architectures:
        assert architecture in entries, f"vLLM does not serve {architecture}"
        module, cls_name = entries[architecture]
        cls = source.find(f"{package}.{module}.{cls_name}")
        assert cls is not None, f"vLLM's registry names {package}.{module}.{cls_name}, which is missing"
        load = source.member(cls, WEIGHT_PATH[-1][0])
        assert load is not None and load.kind == "function", f"{cls_name} has no load_weights"
        assert len(source.signature(load).positional) == 1, "load_weights takes one iterable of pairs"


def test_sleep_tags_and_the_logprob_cap(source: Source) -> None:
    tree = parse(BACKEND)
    tags = {ast.literal_eval(e) for n in ast.walk(tree) if isinstance(n, ast.Call)
            and isinstance(n.func, ast.Attribute) and n.func.attr == "wake_up"
            for a in n.args if isinstance(a, ast.List) for e in a.elts}
    assert tags == {"weights", "kv_cache"}, tags
    known = set(module_constant(source, *SLEEP_TAGS))  # type: ignore[call-overload]
    assert tags <= known, f"vLLM's sleep tags are {sorted(known)}"
    policy = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == "VLLMPolicy")
    [cap] = [s.value.value for s in policy.body if isinstance(s, ast.AnnAssign | ast.Assign)
             and "max_top_logprobs" in ast.unparse(s) and isinstance(s.value, ast.Constant)]
    holder = source.find(MAX_LOGPROBS[0])
    assert holder is not None
    member = source.member(holder, MAX_LOGPROBS[1])
    assert member is not None and isinstance(member.node, ast.AnnAssign) and member.node.value is not None
    default = member.node.value
    if isinstance(default, ast.Call):  # Field(default=20, ...)
        default = next(k.value for k in default.keywords if k.arg == "default")
    assert ast.literal_eval(default) == cap, f"vLLM's default max_logprobs is {ast.unparse(default)}"


def test_what_generation_from_output_reads(source: Source) -> None:
    tree = parse(BACKEND)
    function = next(f for f in functions(tree) if f.name == "generation_from_output")
    read = {n.attr for n in ast.walk(function) if isinstance(n, ast.Attribute)
            and not ast.unparse(n.value).startswith("params") and n.attr not in ("items",)}
    assert read == set(OUTPUT_FIELDS), f"generation_from_output reads {sorted(read)}: see OUTPUT_FIELDS"
    for name, holder in OUTPUT_FIELDS.items():
        cls = source.find(holder)
        assert cls is not None and source.member(cls, name) is not None, f"{holder} has no {name!r}"


def test_environment_variables_and_serve_flags_named_in_the_backends(source: Source) -> None:
    text = "\n".join(n.value for path in (BACKEND, SERVER) for n in ast.walk(parse(path))
                     if isinstance(n, ast.Constant) and isinstance(n.value, str))  # docstrings included
    declared = module_constant(source, *ENVS)
    assert isinstance(declared, ast.Dict)
    names = {k.value for k in declared.keys if isinstance(k, ast.Constant)}
    used = set(re.findall(r"\bVLLM_[A-Z0-9_]+", text))
    assert used and used <= names, f"not vLLM environment variables: {sorted(used - names)}"
    flags = {f.replace("-", "_") for f in re.findall(r"(?<![\w-])--([a-z][a-z0-9-]+)", text)}
    known = set()
    for holder in SERVE_FLAGS:
        cls = source.find(holder)
        assert cls is not None, f"vLLM has no {holder}"
        known |= set(source.fields(cls))
    assert flags and flags <= known, f"not `vllm serve` flags: {sorted(flags - known)}"


def test_the_server_routes_and_their_bodies(source: Source) -> None:
    tree = parse(SERVER)
    assert {route for _, route, _ in posts(tree)} == {"/v1/load_lora_adapter", "/v1/unload_lora_adapter",
                                                       "/collective_rpc", "/reset_prefix_cache"}
    assert check_routes(source, tree, SERVER.name) == []


def test_the_vllm_fields_the_server_generator_sends(source: Source) -> None:
    """``OpenAIPolicy`` (vllm-server's generation) sends vLLM-only fields in ``extra_body``."""
    function = next(f for f in functions(parse(OPENAI)) if f.name == "_sampling")
    sent = set(spread_keywords(function, "extra"))
    assert {"return_token_ids", "include_stop_str_in_output"} <= sent
    served = routes(source)
    for route in OPENAI_ROUTES:
        assert route in served, f"no vLLM server answers POST {route}"
        for key in sent:
            assert any(key in body_keys(source, m, h) for m, h in served[route]), f"POST {route}: no {key!r}"


@pytest.mark.parametrize(("old", "new", "expected"), [
    ("logprobs_mode=", "logprob_mode=", "vllm.LLM takes no keyword 'logprob_mode'"),
    ("include_stop_str_in_output=True", "include_stop_str=True", "no keyword 'include_stop_str'"),
    ("self.llm.wake_up(tags=tags)", "self.llm.wake_up(tag=tags)", "vllm.LLM.wake_up takes no keyword 'tag'"),
    ('extra["distributed_executor_backend"] = "external_launcher"',
     'extra["distributed_executor_backend"] = "torchrun"', "may pass ['torchrun']"),
    ('dtype: str = "bfloat16"', 'dtype: str = "bf16"', "may pass ['bf16']"),
    ("self.llm.reset_prefix_cache()", "self.llm.reset_cache()", "vLLM has no vllm.LLM.reset_cache"),
    ("TokensPrompt(prompt_token_ids=", "TokensPrompt(token_ids=", "no keyword 'token_ids'"),
])
def test_the_check_fails_on_what_vllm_lacks(source: Source, old: str, new: str, expected: str) -> None:
    """The check is not vacuous: the backend with one name changed fails it."""
    text = BACKEND.read_text()
    assert old in text, f"the backend no longer has {old!r}: pick another change"
    problems = check_calls(source, parse(BACKEND, text.replace(old, new)), BACKEND.name)
    assert any(expected in p for p in problems), problems


def test_the_route_check_fails_on_what_vllm_lacks(source: Source) -> None:
    text = SERVER.read_text()
    for old, new, expected in [('"lora_path":', '"adapter_path":', "reads no 'adapter_path'"),
                               ('"reload_weights"', '"reload_weight"', "has no 'reload_weight'"),
                               ('"/reset_prefix_cache"', '"/reset_cache"', "answers POST /reset_cache")]:
        assert old in text
        problems = check_routes(source, parse(SERVER, text.replace(old, new)), SERVER.name)
        assert any(expected in p for p in problems), (old, problems)
