"""agentgym's on-disk cache: where it lives, and atomic, checked entries.

Generated games (TextWorld, ALFWorld) and models converted from GGUF files are cached here. An entry is
a folder. It is built in a temporary folder next to it and renamed into place, with a ``meta.json``
holding the checksums of its files written last, so a reader sees either a complete entry or none; an
entry whose files do not match their checksums counts as missing and is rebuilt. Two processes
building the same entry at once both succeed, and the first one's entry stays.
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
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

#: The environment variable that moves the cache (default ``~/.cache/agentgym``).
CACHE_ENV_VAR = "AGENTGYM_CACHE"


def cache_dir(kind: str) -> Path:
    """``$AGENTGYM_CACHE/<kind>`` when the variable is set, else ``~/.cache/agentgym/<kind>``.

    Example:
        >>> import os
        >>> os.environ["AGENTGYM_CACHE"] = "/tmp/agentgym-cache-example"
        >>> str(cache_dir("textworld"))
        '/tmp/agentgym-cache-example/textworld'
        >>> del os.environ["AGENTGYM_CACHE"]
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


_LOCKS: dict[str, threading.Lock] = {}
_LOCKS_GUARD = threading.Lock()


@contextlib.contextmanager
def _entry_lock(entry: Path) -> Iterator[None]:
    """Exclusive right to build ``entry``: across threads (a lock per path) and processes (flock)."""
    key = str(entry.resolve())
    with _LOCKS_GUARD:
        lock = _LOCKS.setdefault(key, threading.Lock())
    # Lock files live outside the cache, which then holds nothing but entries.
    lock_dir = Path(tempfile.gettempdir()) / "agentgym-cache-locks"
    lock_dir.mkdir(exist_ok=True)
    name = hashlib.sha256(key.encode()).hexdigest()[:32] + ".lock"
    with lock, open(lock_dir / name, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield  # the flock goes with the file's close


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
        return
    entry.parent.mkdir(parents=True, exist_ok=True)
    with _entry_lock(entry):
        if complete(entry):  # built by whoever held the lock before
            return
        if entry.exists():  # corrupt or half-deleted: rebuild
            shutil.rmtree(entry, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{entry.name}-", dir=entry.parent))
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
