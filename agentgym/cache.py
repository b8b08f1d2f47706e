"""agentgym's on-disk cache: where it lives, and atomic, checked entries.

Generated games (TextWorld, ALFWorld) and models converted from GGUF files are cached here. An entry is
a folder. It is built in a temporary folder next to it and renamed into place, with a ``meta.json``
holding the checksums of its files written last, so a reader sees either a complete entry or none; an
entry whose files do not match their checksums counts as missing and is rebuilt. Two processes
building the same entry at once both succeed, and the first one's entry stays.

Entries are never removed by a run. ``entries`` lists them with their sizes and when each was last built
or used; ``prune`` removes what no run can use again (the temporary folders of builds that died, entries
whose source file is gone or changed) and, when asked, what has not been used for some days
(``agentgym cache list|prune``).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: The environment variable that moves the cache (default ``~/.cache/agentgym``).
CACHE_ENV_VAR = "AGENTGYM_CACHE"
#: The cache's subfolders: models converted from GGUF, generated TextWorld and ALFWorld games, and the
#: warm starts ``benchmarks/algorithms.py`` shares between its runs.
KINDS = ("models", "textworld", "alfworld", "warm_starts")


def cache_dir(kind: str) -> Path:
    """``$AGENTGYM_CACHE/<kind>`` when the variable is set, else ``~/.cache/agentgym/<kind>``.

    Example:
        >>> from unittest import mock
        >>> with mock.patch.dict("os.environ", {"AGENTGYM_CACHE": "/tmp/agentgym-cache-example"}):
        ...     str(cache_dir("textworld"))
        '/tmp/agentgym-cache-example/textworld'
    """
    root = os.environ.get(CACHE_ENV_VAR)
    return Path(root) / kind if root else Path.home() / ".cache" / "agentgym" / kind


def sha256_file(path: Path) -> str:
    """Hex SHA-256 of a file's bytes (read in 1 MiB blocks: model weights are hundreds of MB)."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def entry_complete(entry: Path) -> bool:
    """True when ``entry/meta.json`` exists and every file it lists matches its checksum."""
    try:
        meta = json.loads((entry / "meta.json").read_text(encoding="utf-8"))
        digests = meta["sha256"]
        return bool(digests) and all(sha256_file(entry / name) == digest for name, digest in digests.items())
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


def entry_present(entry: Path) -> bool:
    """True when ``entry/meta.json`` exists and every file it lists has the size it was written with: the
    quick check for entries too big to checksum on every use (a model's weights); an entry is renamed into
    place whole, so only a later change on disk could make it differ."""
    try:
        meta = json.loads((entry / "meta.json").read_text(encoding="utf-8"))
        sizes = meta["sizes"]
        return bool(sizes) and all((entry / name).stat().st_size == size for name, size in sizes.items())
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


#: Folders named ``.tmp-<entry>-<8 characters>`` beside an entry are builds (or removals) under way; one
#: left by a process that died is garbage (``prune``).
TMP_PREFIX = ".tmp-"

_LOCKS: dict[str, threading.Lock] = {}
_LOCKS_GUARD = threading.Lock()


@contextlib.contextmanager
def entry_lock(entry: Path, *, wait: bool = True) -> Iterator[bool]:
    """Exclusive right to build (or remove) ``entry``: across threads (a lock per path) and processes
    (flock). Yields whether it was got: always with ``wait``, else only when nobody held it."""
    key = str(entry.resolve())
    with _LOCKS_GUARD:
        lock = _LOCKS.setdefault(key, threading.Lock())
    # Lock files live outside the cache, which then holds nothing but entries.
    lock_dir = Path(tempfile.gettempdir()) / "agentgym-cache-locks"
    lock_dir.mkdir(exist_ok=True)
    name = hashlib.sha256(key.encode()).hexdigest()[:32] + ".lock"
    if not lock.acquire(blocking=wait):
        yield False
        return
    try:
        with open(lock_dir / name, "a") as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                yield False
                return
            yield True  # the flock goes with the file's close
    finally:
        lock.release()


def build_entry(entry: Path, build: Callable[[Path], tuple[Iterable[str], dict[str, Any]]], *,
                complete: Callable[[Path], bool] = entry_complete) -> None:
    """Build ``entry`` atomically unless it is complete already.

    Args:
        entry: the folder to create.
        build: called with an empty temporary folder; fills it and returns the paths (relative to
            it) to checksum and the other ``meta.json`` fields. It runs at most once at a time per
            entry. Whatever it raises propagates, and the temporary folder is removed.
        complete: what counts as complete: every checksum matches (``entry_complete``), or, for entries
            too big to checksum on every use, every size does (``entry_present``).
    """
    if complete(entry):
        mark_used(entry)
        return
    entry.parent.mkdir(parents=True, exist_ok=True)
    with entry_lock(entry):
        if complete(entry):  # built by whoever held the lock before
            mark_used(entry)
            return
        if entry.exists():  # corrupt or half-deleted: rebuild
            shutil.rmtree(entry, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(prefix=f"{TMP_PREFIX}{entry.name}-", dir=entry.parent))
        try:
            names, meta = build(tmp)
            names = list(names)
            digests = {name: sha256_file(tmp / name) for name in names}
            sizes = {name: (tmp / name).stat().st_size for name in names}
            record = {**meta, "sha256": digests, "sizes": sizes}
            (tmp / "meta.json").write_text(json.dumps(record, sort_keys=True), encoding="utf-8")
            os.rename(tmp, entry)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


def mark_used(entry: Path) -> None:
    """Record that a run used ``entry`` now: its folder's modification time, which nothing else changes
    once the entry is in place (``prune --unused-days`` reads it)."""
    with contextlib.suppress(OSError):
        os.utime(entry)


@dataclass(frozen=True)
class Entry:
    """One cached entry, as ``entries`` finds it."""

    path: Path
    #: The cache's subfolder it is in: ``models``, ``textworld``, ``alfworld``, ``warm_starts``.
    kind: str
    #: Bytes on disk, every file counted.
    size: int
    #: When it was built or last used (seconds since the epoch).
    last_used: float
    #: Why no run can use it again (``None`` while one can): a source file it recorded gone or changed.
    unusable: str | None


def _folder_size(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and not p.is_symlink())


def _unusable(meta: dict[str, Any]) -> str | None:
    """An entry converted from a file (``source``, with ``source_stat`` = [size, mtime_ns]) is keyed by where
    that file is and which version of it, so once the file is gone or changed no lookup finds the entry."""
    source = meta.get("source")
    if not isinstance(source, str):
        return None
    try:
        stat = os.stat(source)
    except OSError:
        return f"its source {source} is gone"
    recorded = meta.get("source_stat")
    if isinstance(recorded, list) and recorded != [stat.st_size, stat.st_mtime_ns]:
        return f"its source {source} has changed since"
    return None


def entries(root: Path | None = None) -> list[Entry]:
    """Every entry under the cache ``root`` (default: the cache's own folder), sorted by kind and path.

    An entry is a folder holding a ``meta.json`` (nothing inside one is looked at further); temporary
    build folders are not entries (``unfinished_builds``).
    """
    root = Path(root) if root is not None else cache_dir("")
    found: list[Entry] = []
    taken: set[Path] = set()
    for meta_file in sorted(root.rglob("meta.json"), key=lambda p: (len(p.parts), p)):  # outer entries first
        folder = meta_file.parent
        relative = folder.relative_to(root)
        if any(part.startswith(TMP_PREFIX) for part in relative.parts) or taken.intersection(folder.parents):
            continue  # a build under way, or a file inside an entry
        taken.add(folder)
        try:
            meta = json.loads(meta_file.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            meta = {}
        found.append(Entry(path=folder, kind=relative.parts[0] if len(relative.parts) > 1 else "",
                           size=_folder_size(folder), last_used=folder.stat().st_mtime,
                           unusable=_unusable(meta) if isinstance(meta, dict) else None))
    return sorted(found, key=lambda e: e.path)


def unfinished_builds(root: Path | None = None) -> list[Path]:
    """Temporary folders under ``root`` whose build (or removal) no live process is doing: what a killed
    process left behind. A build under way holds its entry's lock, so its folder is not listed."""
    root = Path(root) if root is not None else cache_dir("")
    left: list[Path] = []
    for tmp in sorted(root.rglob(f"{TMP_PREFIX}*")):
        if not tmp.is_dir() or any(parent in left for parent in tmp.parents):
            continue
        entry = tmp.parent / tmp.name[len(TMP_PREFIX):-9]  # mkdtemp appends "-" and 8 characters
        with entry_lock(entry, wait=False) as got:
            if got:
                left.append(tmp)
    return left


def remove_entry(entry: Path) -> bool:
    """Remove ``entry`` unless a build of it is under way (then False). It is first renamed out of the
    way, so a reader sees the whole entry or none, and an interrupted removal leaves only a temporary
    folder that the next ``prune`` takes."""
    with entry_lock(entry, wait=False) as got:
        if not got:
            return False
        doomed = entry.parent / f"{TMP_PREFIX}{entry.name}-{uuid.uuid4().hex[:8]}"
        try:
            os.rename(entry, doomed)
        except FileNotFoundError:
            return True
        shutil.rmtree(doomed, ignore_errors=True)
        return True


@dataclass(frozen=True)
class Removal:
    """One folder ``prune`` removed (or, with ``dry_run``, would remove)."""

    path: Path
    size: int
    reason: str


def prune(root: Path | None = None, *, kind: str | None = None, unused_days: float | None = None,
          everything: bool = False, dry_run: bool = False) -> list[Removal]:
    """Remove from the cache what no run can use again, and optionally more.

    Args:
        root: The cache folder (default: the cache's own).
        kind: Only entries of this kind (``models``, ``textworld``, ...).
        unused_days: Also entries not built or used for this many days.
        everything: Every entry (of ``kind``, if given).
        dry_run: Only report what would go.

    Always taken: temporary folders of builds that died, and entries whose recorded source file is gone
    or changed. A build under way is never touched.
    """
    root = Path(root) if root is not None else cache_dir("")
    removals: list[Removal] = []
    for tmp in unfinished_builds(root):
        if kind is None or tmp.relative_to(root).parts[0] == kind:
            removals.append(Removal(tmp, _folder_size(tmp), "an unfinished build"))
            if not dry_run:
                shutil.rmtree(tmp, ignore_errors=True)
    cutoff = None if unused_days is None else time.time() - unused_days * 86400
    for entry in entries(root):
        if kind is not None and entry.kind != kind:
            continue
        if everything:
            reason = "asked for every entry"
        elif entry.unusable:
            reason = entry.unusable
        elif cutoff is not None and entry.last_used < cutoff:
            reason = f"unused for {(time.time() - entry.last_used) / 86400:.1f} days"
        else:
            continue
        if dry_run or remove_entry(entry.path):
            removals.append(Removal(entry.path, entry.size, reason))
    return removals
