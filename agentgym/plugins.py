"""``load_plugins``: imports a built-in package and runs every entry point of a plug-in group."""

from __future__ import annotations

import importlib
import warnings
from importlib import metadata


def load_plugins(builtin_module: str, group: str) -> None:
    """Import ``builtin_module`` (its import registers the built-ins), then load ``group``'s entry points.

    Each entry point names a module to import or a zero-argument function to call (which then
    registers). A plug-in that fails to load is reported as a warning: one broken third-party
    package must not take the built-ins down.
    """
    importlib.import_module(builtin_module)
    for entry in metadata.entry_points(group=group):
        try:
            loaded = entry.load()
            if callable(loaded):
                loaded()
        except Exception as exc:
            warnings.warn(f"agentgym plug-in {entry.name!r} ({entry.value}) of {group!r} failed to load: {exc}",
                          RuntimeWarning, stacklevel=3)
