"""The generated-game disk cache: atomic, checked entries built once under concurrency."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from agentgym.cache import build_entry, entry_complete


def test_concurrent_builders_build_an_entry_once_and_keep_it(tmp_path: Path) -> None:
    entry = tmp_path / "game-1"
    calls = []

    def build(tmp: Path) -> tuple[list[str], dict]:
        calls.append(1)
        time.sleep(0.2)  # long enough for every other thread to arrive while this one builds
        (tmp / "game.bin").write_bytes(b"compiled")
        return ["game.bin"], {"seed": 1}

    threads = [threading.Thread(target=build_entry, args=(entry, build)) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(calls) == 1 and entry_complete(entry)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["game-1"]  # no temp folders or lock files left
    (entry / "game.bin").write_bytes(b"corrupt")  # a checksum mismatch makes the entry count as missing
    build_entry(entry, build)
    assert len(calls) == 2 and (entry / "game.bin").read_bytes() == b"compiled"
