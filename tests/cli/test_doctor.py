"""``agentgym doctor``: the versions, extras, caches and CUDA it reports are what is installed here."""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import agentgym
from agentgym.cli import doctor

pytestmark = pytest.mark.timeout(300)

AGENTGYM = str(Path(sys.executable).parent / "agentgym")
SECRET = "do-not-print-this-token"


def version_of(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


@pytest.fixture(scope="module")
def caches(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """An agentgym cache of 1000 + 234 bytes and a Hub cache of 500 bytes plus a link to them."""
    root = tmp_path_factory.mktemp("caches")
    cache, hub = root / "agentgym", root / "hub"
    (cache / "models" / "m").mkdir(parents=True)
    (cache / "models" / "m" / "weights.bin").write_bytes(b"w" * 1000)
    (cache / "textworld").mkdir()
    (cache / "textworld" / "game.z8").write_bytes(b"g" * 234)
    (hub / "blobs").mkdir(parents=True)
    (hub / "blobs" / "abc").write_bytes(b"b" * 500)
    (hub / "snapshots").mkdir()
    (hub / "snapshots" / "model.safetensors").symlink_to(hub / "blobs" / "abc")  # the Hub's layout
    return {"cache": cache, "hub": hub}


def run_doctor(*args: str, caches: dict[str, Path], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "AGENTGYM_CACHE": str(caches["cache"]), "HF_HUB_CACHE": str(caches["hub"]),
           "AGENTGYM_TOKEN": SECRET, "COLUMNS": "300"}
    return subprocess.run([AGENTGYM, "doctor", *args], capture_output=True, text=True, timeout=240, cwd=cwd,
                          env=env)


@pytest.fixture(scope="module")
def report(caches: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    result = run_doctor("--json", caches=caches, cwd=tmp_path_factory.mktemp("cwd"))
    assert result.returncode == 0, result.stderr
    assert SECRET not in result.stdout
    return json.loads(result.stdout)


def test_versions_are_the_installed_ones(report: dict[str, Any]) -> None:
    assert report["agentgym"]["version"] == agentgym.__version__ == version_of("agentgym-rl")
    assert report["agentgym"]["location"] == str(Path(agentgym.__file__).resolve().parent)
    assert report["python"] == {"version": platform.python_version(),
                                "implementation": platform.python_implementation(),
                                "executable": sys.executable}
    assert report["platform"] == platform.platform()
    assert report["packages"] == {"torch": version_of("torch"), "transformers": version_of("transformers"),
                                  "vLLM": version_of("vllm")}


def test_every_extra_and_requirement_is_reported_as_installed(report: dict[str, Any]) -> None:
    metadata = importlib.metadata.distribution("agentgym-rl").metadata
    assert set(report["extras"]) == set(metadata.get_all("Provides-Extra"))
    for name, extra in report["extras"].items():
        assert extra["requirements"], name
        for requirement in extra["requirements"]:
            assert requirement["installed"] == version_of(requirement["name"]), (name, requirement)
        holds = all(r["installed"] and r["satisfied"] is not False and all(r["modules"].values())
                    for r in extra["requirements"])
        assert extra["ok"] == holds, (name, extra)
    server = {r["name"]: r for r in report["extras"]["server"]["requirements"]}
    assert server["fastapi"]["modules"] == {"fastapi": True}  # the tests run with the server extra


def test_caches_cuda_backends_and_environment(report: dict[str, Any], caches: dict[str, Path]) -> None:
    assert report["cache"] == {"path": str(caches["cache"]), "variable": "AGENTGYM_CACHE", "exists": True,
                               "size_bytes": 1234}
    assert report["hf_cache"] == {"path": str(caches["hub"]), "variable": "HF_HUB_CACHE", "exists": True,
                                  "size_bytes": 500}
    assert report["environment"]["AGENTGYM_TOKEN"] == "(set, hidden)"
    assert set(report["sandbox_backends"]) == {"bwrap", "docker", "subprocess"}
    from agentgym.sandbox.backends import BwrapBackend

    assert report["sandbox_backends"]["bwrap"]["available"] == BwrapBackend.available()
    if version_of("torch") is None:
        assert report["cuda"] == {"checked": False, "reason": "torch is not installed"}
    else:
        import torch

        assert report["cuda"]["checked"] and report["cuda"]["torch_cuda"] == torch.version.cuda
        assert report["cuda"]["available"] == torch.cuda.is_available()
        devices = torch.cuda.device_count() if torch.cuda.is_available() else 0
        assert len(report["cuda"]["devices"]) == devices


def test_the_table_names_each_version(caches: dict[str, Path], tmp_path: Path) -> None:
    result = run_doctor(caches=caches, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert SECRET not in out and "Traceback" not in out
    rows = {cells[0]: cells[1:] for cells in ([c.strip() for c in line.strip().strip("│").split("│")]
                                              for line in out.splitlines() if line.startswith("│"))}
    for label, distribution in (("agentgym", "agentgym-rl"), ("torch", "torch"),
                                ("transformers", "transformers"), ("vLLM", "vllm")):
        expected = version_of(distribution) or "not installed"
        assert rows[label][0].startswith(expected), rows[label]
    assert platform.python_version() in out and "1.2 KB" in out  # the agentgym cache's 1234 bytes
    for section in ("extras", "sandbox backends", "CUDA", "Hugging Face cache"):
        assert section in out


def test_a_missing_requirement_and_a_version_below_the_pin(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    # A real distribution's metadata on sys.path: an extra asking for a package that is not installed,
    # one asking for a PyYAML newer than any, and one that holds.
    info = tmp_path / "doctor_probe-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: doctor-probe\nVersion: 1.0\n"
        "Provides-Extra: absent\nProvides-Extra: old\nProvides-Extra: fine\n"
        'Requires-Dist: pyyaml>=6\n'
        'Requires-Dist: no-such-package-for-doctor>=1; extra == "absent"\n'
        'Requires-Dist: pyyaml>=999; extra == "old"\n'
        'Requires-Dist: PyYAML[extra]>=5; extra == "fine"\n')
    monkeypatch.syspath_prepend(str(tmp_path))
    extras = doctor.extras_report("doctor-probe")
    assert set(extras) == {"absent", "old", "fine"}
    [absent] = extras["absent"]["requirements"]
    assert absent["installed"] is None and not extras["absent"]["ok"]
    assert "no-such-package-for-doctor not installed" in doctor._extra_line(extras["absent"])
    [old] = extras["old"]["requirements"]
    assert old["installed"] == version_of("pyyaml") and old["satisfied"] is False and not extras["old"]["ok"]
    [fine] = extras["fine"]["requirements"]
    assert fine["modules"] == {"yaml": True} and extras["fine"]["ok"]
