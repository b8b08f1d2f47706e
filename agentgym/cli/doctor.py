"""``agentgym doctor``: what a bug report needs, as a table or ``--json``.

It reports the versions of agentgym, Python and the platform, of torch, transformers and vLLM, which
extras are installed with the versions they ask for and whose modules can be found, the sandbox backends
that run here, CUDA as torch sees it, and where the agentgym and Hugging Face caches are and how large.
Nothing here imports the heavy packages in this process: versions come from the installed metadata,
modules are looked up with ``importlib.util.find_spec``, and CUDA is asked in a child Python with a
deadline, so a broken driver or a slow import costs seconds, not a hung command. ``--import`` really
imports each installed extra's modules, each extra in its own child Python with the same deadline.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import typer
from rich.markup import escape
from rich.table import Table

from agentgym.cli.app import app, console
from agentgym.cli.caching import _size

#: The distribution agentgym installs as (the name ``agentgym`` on PyPI is another project).
DISTRIBUTION = "agentgym-rl"
#: Packages a bug report names by version, with the distribution each is installed as.
PACKAGES = {"torch": "torch", "transformers": "transformers", "vLLM": "vllm"}
#: Environment variables that change what agentgym does; values of those naming a secret are hidden.
ENV_VARS = ("AGENTGYM_CACHE", "AGENTGYM_TOKEN", "AGENTGYM_SANDBOX_TOKEN", "AGENTGYM_RETRIEVAL_TOKEN",
            "AGENTGYM_SANDBOX_URL", "AGENTGYM_ALLOW_NO_TOKEN", "HF_HOME", "HF_HUB_CACHE", "HF_HUB_OFFLINE",
            "TRANSFORMERS_OFFLINE", "CUDA_VISIBLE_DEVICES", "PYTHONPATH")
#: Seconds a child Python may take to import torch (or an extra's modules) before it counts as failed.
CHILD_TIMEOUT_S = 120.0

_CUDA_PROBE = """
import json, torch
mps = getattr(torch.backends, "mps", None)
info = {"torch_cuda": torch.version.cuda, "available": torch.cuda.is_available(), "devices": [],
        "mps": bool(mps is not None and mps.is_available())}
if info["available"]:
    info["devices"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
print(json.dumps(info))
"""


def installed_version(distribution: str) -> str | None:
    """The installed version of ``distribution``, None when it is not installed."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def _requirement(line: str) -> tuple[str, str, str | None]:
    """``(name, specifier, extra)`` of a ``Requires-Dist`` line (extra None for a core requirement)."""
    spec, _, marker = line.partition(";")
    extra = re.search(r"""extra\s*==\s*["']([^"']+)["']""", marker)
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(\[[^\]]*\])?\s*(.*)", spec)
    name, specifier = (match.group(1), match.group(3).strip()) if match else (spec.strip(), "")
    return name, specifier, extra.group(1) if extra else None


def _satisfies(version: str, specifier: str) -> bool | None:
    """Whether ``version`` meets ``specifier``; None when ``packaging`` is not there to tell."""
    if not specifier:
        return True
    try:
        from packaging.specifiers import InvalidSpecifier, SpecifierSet
        from packaging.version import InvalidVersion
    except ImportError:
        return None
    try:
        return SpecifierSet(specifier).contains(version, prereleases=True)
    except (InvalidSpecifier, InvalidVersion):
        return None


def top_level_modules(distribution: str) -> list[str]:
    """The modules a distribution installs at the top level; the one named like it, when there is one."""
    try:
        dist = importlib.metadata.distribution(distribution)
    except importlib.metadata.PackageNotFoundError:
        return []
    listed = (dist.read_text("top_level.txt") or "").split()
    if not listed:
        for file in dist.files or ():
            first = file.parts[0]
            if first.endswith((".dist-info", ".egg-info", ".data", ".pth")) or first in ("..", "__pycache__"):
                continue
            if len(file.parts) > 1 or first.endswith(".py"):
                listed.append(first.removesuffix(".py"))
    modules = sorted({m for m in listed if m.isidentifier() and not m.startswith("_")})
    own = re.sub(r"[-.]", "_", distribution).lower()
    return [own] if own in modules else modules


def _findable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def extras_report(distribution: str = DISTRIBUTION) -> dict[str, dict[str, Any]]:
    """Per extra of the installed ``distribution``: each requirement's installed version, whether it meets
    the extra's specifier and whether its modules are found; ``ok`` when every requirement holds."""
    try:
        dist = importlib.metadata.distribution(distribution)
    except importlib.metadata.PackageNotFoundError:
        return {}
    extras: dict[str, dict[str, Any]] = {name: {"ok": True, "requirements": []}
                                         for name in dist.metadata.get_all("Provides-Extra") or ()}
    for line in dist.requires or ():
        name, specifier, extra = _requirement(line)
        if extra not in extras:
            continue
        version = installed_version(name)
        modules = {m: _findable(m) for m in top_level_modules(name)} if version else {}
        satisfied = _satisfies(version, specifier) if version else False
        extras[extra]["requirements"].append({"name": name, "specifier": specifier, "installed": version,
                                             "satisfied": satisfied, "modules": modules})
        if not version or satisfied is False or not all(modules.values()):
            extras[extra]["ok"] = False
    return extras


def _child_python(code: str, timeout_s: float) -> tuple[bool, str]:
    """Run ``code`` in a child of this interpreter, from a neutral folder (none of the user's modules
    shadows a package there): (succeeded, its output or why not)."""
    try:
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout_s,
                              cwd=tempfile.gettempdir(), check=False)
    except subprocess.TimeoutExpired:
        return False, f"did not finish within {timeout_s:g} s"
    except OSError as exc:
        return False, str(exc)
    if done.returncode != 0:
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        return False, lines[-1] if lines else f"exit status {done.returncode}"
    return True, done.stdout


def import_extras(extras: dict[str, dict[str, Any]], timeout_s: float = CHILD_TIMEOUT_S) -> None:
    """Import each installed extra's modules in a child Python; store ``imports`` (True or the error)."""
    wanted = {name: sorted({m for r in extra["requirements"] for m in r["modules"]})
              for name, extra in extras.items() if extra["ok"]}

    def attempt(modules: list[str]) -> bool | str:
        if not modules:
            return True
        ok, said = _child_python("import " + ", ".join(modules), timeout_s)
        return True if ok else said

    with ThreadPoolExecutor(max_workers=max(1, min(4, os.cpu_count() or 1))) as pool:
        results = dict(zip(wanted, pool.map(attempt, wanted.values()), strict=True))
    for name, result in results.items():
        extras[name]["imports"] = result
        extras[name]["ok"] = result is True


def cuda_report(timeout_s: float = CHILD_TIMEOUT_S) -> dict[str, Any]:
    """CUDA as torch sees it, asked in a child Python (a broken driver can hang an import)."""
    if installed_version("torch") is None:
        return {"checked": False, "reason": "torch is not installed"}
    ok, said = _child_python(_CUDA_PROBE, timeout_s)
    if not ok:
        return {"checked": False, "reason": f"importing torch failed: {said}"}
    return {"checked": True, **json.loads(said.strip().splitlines()[-1])}


def sandbox_report() -> dict[str, dict[str, Any]]:
    """Each sandbox backend: whether it runs here, and why not."""
    from agentgym.sandbox.backends import BwrapBackend, DockerBackend

    bwrap = BwrapBackend.available()
    docker = DockerBackend.available()
    return {
        "bwrap": {"available": bwrap, "secure": True,
                  "reason": "" if bwrap else BwrapBackend.unavailable_reason()},
        "docker": {"available": docker, "secure": True,
                   "reason": "" if docker else "no Docker engine answered `docker info` within 5 s"},
        "subprocess": {"available": True, "secure": False, "reason": "not a security boundary (opt-in only)"},
    }


def folder_size(folder: Path) -> int:
    """Bytes of the files under ``folder``; links are not followed (the Hub cache links into its blobs)."""
    total = 0
    for root, _dirs, files in os.walk(folder):
        for name in files:
            try:
                stat = os.lstat(os.path.join(root, name))
            except OSError:
                continue  # removed while walking
            if not os.path.islink(os.path.join(root, name)):
                total += stat.st_size
    return total


def hf_cache_dir() -> Path:
    """Where the Hugging Face Hub keeps downloads, as ``huggingface_hub`` decides it."""
    if importlib.util.find_spec("huggingface_hub") is not None:
        from huggingface_hub import constants

        return Path(constants.HF_HUB_CACHE)
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    cache_home = os.environ.get("XDG_CACHE_HOME", "~/.cache")
    return Path(os.environ.get("HF_HOME") or os.path.join(cache_home, "huggingface")).expanduser() / "hub"


def _cache_entry(folder: Path, variables: tuple[str, ...]) -> dict[str, Any]:
    """A cache folder, the environment variable that placed it (None: the default place), its size."""
    variable = next((name for name in variables if os.environ.get(name)), None)
    return {"path": str(folder), "variable": variable, "exists": folder.is_dir(),
            "size_bytes": folder_size(folder) if folder.is_dir() else 0}


def _environment() -> dict[str, str]:
    secret = re.compile(r"TOKEN|KEY|SECRET|PASSWORD")
    return {name: "(set, hidden)" if secret.search(name) else os.environ[name]
            for name in ENV_VARS if name in os.environ}


def doctor_report(*, try_imports: bool = False) -> dict[str, Any]:
    """Everything ``agentgym doctor`` prints, as plain data (the ``--json`` output)."""
    import agentgym
    from agentgym.cache import CACHE_ENV_VAR, cache_dir

    location = Path(agentgym.__file__).resolve().parent
    editable = None
    try:
        direct = importlib.metadata.distribution(DISTRIBUTION).read_text("direct_url.json")
        editable = bool(json.loads(direct).get("dir_info", {}).get("editable")) if direct else False
    except (importlib.metadata.PackageNotFoundError, ValueError):
        pass
    extras = extras_report()
    if try_imports:
        import_extras(extras)
    return {
        "agentgym": {"version": agentgym.__version__, "distribution": installed_version(DISTRIBUTION),
                     "location": str(location), "editable": editable},
        "python": {"version": platform.python_version(), "implementation": platform.python_implementation(),
                   "executable": sys.executable},
        "platform": platform.platform(),
        "packages": {name: installed_version(dist) for name, dist in PACKAGES.items()},
        "cuda": cuda_report(),
        "extras": extras,
        "sandbox_backends": sandbox_report(),
        "cache": _cache_entry(cache_dir(""), (CACHE_ENV_VAR,)),
        "hf_cache": _cache_entry(hf_cache_dir(), ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME")),
        "environment": _environment(),
    }


def _cuda_line(cuda: dict[str, Any]) -> str:
    if not cuda["checked"]:
        return cuda["reason"]
    if cuda["available"]:
        devices = ", ".join(cuda["devices"])
        return f"available: {len(cuda['devices'])} device(s): {devices} (torch for CUDA {cuda['torch_cuda']})"
    built = f"built for CUDA {cuda['torch_cuda']}" if cuda["torch_cuda"] else "built without CUDA"
    return f"not available (torch {built})" + ("; Apple MPS available" if cuda.get("mps") else "")


def _extra_line(extra: dict[str, Any]) -> str:
    parts = []
    for req in extra["requirements"]:
        if req["installed"] is None:
            parts.append(f"{req['name']} not installed")
            continue
        wanted = f" (wants {req['specifier']})" if req["satisfied"] is False else ""
        lost = [m for m, found in req["modules"].items() if not found]
        missing = f" (module {', '.join(lost)} not found)" if lost else ""
        parts.append(f"{req['name']} {req['installed']}{wanted}{missing}")
    if isinstance(extra.get("imports"), str):
        parts.append(f"import failed: {extra['imports']}")
    return ", ".join(parts)


def print_report(report: dict[str, Any]) -> None:
    """The report as tables a bug report can paste."""
    ag = report["agentgym"]
    how = {True: ", editable", False: "", None: ""}[ag["editable"]]
    about = Table(title="agentgym doctor", show_header=False, title_justify="left")
    about.add_column(style="bold cyan")
    about.add_column()
    about.add_row("agentgym", f"{ag['version']} ({ag['location']}{how})")
    py = report["python"]
    about.add_row("Python", f"{py['version']} {py['implementation']} ({py['executable']})")
    about.add_row("platform", report["platform"])
    for name, version in report["packages"].items():
        about.add_row(name, version or "not installed")
    about.add_row("CUDA", _cuda_line(report["cuda"]))
    for key, label in (("cache", "agentgym cache"), ("hf_cache", "Hugging Face cache")):
        cache = report[key]
        where = f"${cache['variable']}" if cache["variable"] else "default"
        size = _size(cache["size_bytes"]) if cache["exists"] else "does not exist yet"
        about.add_row(label, f"{cache['path']} ({where}), {size}")
    for name, value in report["environment"].items():
        about.add_row(f"${name}", value)
    console.print(about, highlight=False)

    extras = Table("extra", "status", "requirements", title="extras", title_justify="left")
    for name, extra in report["extras"].items():
        status = "[green]ok[/]" if extra["ok"] else "[yellow]incomplete[/]"
        if isinstance(extra.get("imports"), str):
            status = "[bold red]import fails[/]"
        extras.add_row(name, status, escape(_extra_line(extra)))
    console.print(extras, highlight=False)

    backends = Table("sandbox backend", "status", title="sandbox backends", title_justify="left")
    for name, backend in report["sandbox_backends"].items():
        state = "[green]available[/]" if backend["available"] else "[yellow]unavailable[/]"
        backends.add_row(name, f"{state}: {escape(backend['reason'])}" if backend["reason"] else state)
    console.print(backends, highlight=False)


@app.command()
def doctor(
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
    try_imports: bool = typer.Option(False, "--import",
                                     help="Also import each installed extra's modules, each extra in a child "
                                          "Python (a minute or two: torch is among them)."),
) -> None:
    """Print what a bug report needs: versions (agentgym, Python, platform, torch, transformers, vLLM), the
    extras installed, the sandbox backends, CUDA, and the caches with their sizes."""
    report = doctor_report(try_imports=try_imports)
    if as_json:
        print(json.dumps(report, indent=2))
        return
    print_report(report)
