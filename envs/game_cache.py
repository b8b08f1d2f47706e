"""The on-disk cache of generated games (TextWorld, ALFWorld): where it lives, and atomic, checked entries.

An entry is a folder. It is built in a temporary folder next to it and renamed into place, with a
``meta.json`` holding the checksums of its files written last, so a reader sees either a complete
entry or none; an entry whose files do not match their checksums counts as missing and is rebuilt.
Two processes building the same entry at once both succeed, and the first one's entry stays.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable
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
    """Hex SHA-256 of a file's bytes."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def entry_complete(entry: Path) -> bool:
    """True when ``entry/meta.json`` exists and every file it lists matches its checksum."""
    try:
        meta = json.loads((entry / "meta.json").read_text(encoding="utf-8"))
        digests = meta["sha256"]
        return bool(digests) and all(sha256_file(entry / name) == digest for name, digest in digests.items())
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


def read_meta(entry: Path) -> dict[str, Any]:
    """The ``meta.json`` of a complete entry."""
    return json.loads((entry / "meta.json").read_text(encoding="utf-8"))


def build_entry(entry: Path, build: Callable[[Path], tuple[Iterable[str], dict[str, Any]]]) -> None:
    """Build ``entry`` atomically unless it is complete already.

    Args:
        entry: the folder to create.
        build: called with an empty temporary folder; fills it and returns the paths (relative to
            it) to checksum and the other ``meta.json`` fields. Whatever it raises propagates, and
            the temporary folder is removed.
    """
    if entry_complete(entry):
        return
    entry.parent.mkdir(parents=True, exist_ok=True)
    if entry.exists():  # corrupt or half-deleted: rebuild
        shutil.rmtree(entry, ignore_errors=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{entry.name}-", dir=entry.parent))
    try:
        names, meta = build(tmp)
        digests = {name: sha256_file(tmp / name) for name in names}
        (tmp / "meta.json").write_text(json.dumps({**meta, "sha256": digests}, sort_keys=True), encoding="utf-8")
        try:
            os.rename(tmp, entry)
        except OSError:  # another process put the same entry in place first; keep theirs
            if not entry_complete(entry):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
