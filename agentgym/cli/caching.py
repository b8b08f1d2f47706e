"""Cache commands: ``cache list`` and ``cache prune`` (``agentgym.cache``)."""

from __future__ import annotations

import difflib
import time
from pathlib import Path

import typer
from rich.table import Table

from agentgym.cache import CACHE_ENV_VAR, KINDS, cache_dir, entries, prune
from agentgym.cli.app import app, console, err_console, fail
from agentgym.errors import ConfigError

cache_app = typer.Typer(help="What agentgym keeps on disk (converted models, generated games, warm starts): "
                             "list it, remove what is no longer used.", no_args_is_help=True)
app.add_typer(cache_app, name="cache")

_ROOT_HELP = f"The cache folder (default: ${CACHE_ENV_VAR}, else ~/.cache/agentgym)."


def _check_kind(kind: str | None) -> None:
    if kind is not None and kind not in KINDS:
        near = difflib.get_close_matches(kind, KINDS, n=1)
        hint = f"did you mean {near[0]!r}? " if near else ""
        fail(ConfigError(f"--kind {kind!r} is not a kind of cache entry; {hint}kinds: {', '.join(KINDS)}"))


def _size(size: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1000 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    raise AssertionError("unreachable")


def _age(seconds_since: float) -> str:
    age = time.time() - seconds_since
    if age < 3600:
        return f"{age / 60:.0f} min ago"
    if age < 86400:
        return f"{age / 3600:.1f} h ago"
    return f"{age / 86400:.1f} days ago"


@cache_app.command("list")
def cache_list(
    kind: str | None = typer.Option(None, help="List this kind's entries: models, textworld, alfworld, "
                                               "warm_starts."),
    show_entries: bool = typer.Option(False, "--entries", help="List every entry of every kind."),
    root: Path | None = typer.Option(None, help=_ROOT_HELP),
) -> None:
    """What the cache holds: per kind, its entries, their size and how many no run can use any more; with
    --kind or --entries, each entry (its folder, size, last build or use, and why no run can use it)."""
    _check_kind(kind)
    folder = root if root is not None else cache_dir("")
    found = [e for e in entries(folder) if kind is None or e.kind == kind]
    if found and (kind is not None or show_entries):
        table = Table("kind", "entry", "size", "last used", "usable")
        for entry in found:
            usable = "yes" if entry.unusable is None else f"no: {entry.unusable}"
            name = str(entry.path.relative_to(folder))
            table.add_row(entry.kind, name, _size(entry.size), _age(entry.last_used), usable)
        console.print(table)
    elif found:
        table = Table("kind", "entries", "size", "last used", "no run can use")
        for name in sorted({e.kind for e in found}):
            of_kind = [e for e in found if e.kind == name]
            unusable = [e for e in of_kind if e.unusable]
            table.add_row(name, str(len(of_kind)), _size(sum(e.size for e in of_kind)),
                          _age(max(e.last_used for e in of_kind)),
                          f"{len(unusable)} ({_size(sum(e.size for e in unusable))})" if unusable else "0")
        console.print(table)
    unusable = [e for e in found if e.unusable]
    console.print(f"{len(found)} entries, {_size(sum(e.size for e in found))} in {folder}"
                  + (f"; {len(unusable)} no run can use ({_size(sum(e.size for e in unusable))}): "
                     f"agentgym cache prune" if unusable else ""), highlight=False)


@cache_app.command("prune")
def cache_prune(
    kind: str | None = typer.Option(None, help="Only this kind: models, textworld, alfworld, warm_starts."),
    unused_days: float | None = typer.Option(
        None, "--unused-days", min=0, help="Also remove entries not built or used for this many days."),
    everything: bool = typer.Option(False, "--all", help="Remove every entry (of --kind, if given)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Only print what would be removed."),
    root: Path | None = typer.Option(None, help=_ROOT_HELP),
) -> None:
    """Remove what no run can use again: folders of builds that died, converted models whose source file
    is gone or changed; with --unused-days or --all, more. A build under way is never touched; an entry
    removed is rebuilt when a run next needs it."""
    _check_kind(kind)
    folder = root if root is not None else cache_dir("")
    if not folder.is_dir():
        err_console.print(f"{folder} does not exist: nothing is cached there", highlight=False)
        return
    removed = prune(folder, kind=kind, unused_days=unused_days, everything=everything, dry_run=dry_run)
    verb = "would remove" if dry_run else "removed"
    for removal in removed:
        console.print(f"{verb} {removal.path.relative_to(folder)} ({_size(removal.size)}): {removal.reason}",
                      highlight=False)
    console.print(f"{verb} {len(removed)} folders, {_size(sum(r.size for r in removed))}", highlight=False)
