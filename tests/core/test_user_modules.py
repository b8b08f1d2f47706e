"""A user's own ``module:attr`` (a harness ``my_agent:run``, a reward function) imports from the folder they
run agentgym in, in the command and in the env workers it starts, while agentgym itself still comes from the
installed package even when that folder holds an ``agentgym/`` source tree; a module that is really missing
is named with the folder searched and the fix."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from agentgym.errors import ConfigError
from agentgym.plugins import import_object
from agentgym.service_kit.launcher import free_port, start_service, stop_service

pytestmark = pytest.mark.timeout(300)

AGENTGYM = Path(sys.executable).parent / "agentgym"
#: What the working folder's ``agentgym/`` does if anything imports it instead of the installed package.
SHADOW = 'raise ImportError("imported the agentgym/ folder of the working directory")\n'
#: The user's harness: asks its endpoint once, and scores 1 when it got a reply.
MY_AGENT = '''
import httpx

def run(task, base_url, api_key, model):
    reply = httpx.post(f"{base_url}/chat/completions", headers={"Authorization": f"Bearer {api_key}"},
                       json={"model": model, "messages": [{"role": "user", "content": task["prompt"]}]},
                       timeout=60).json()
    return 1.0 if reply["choices"][0]["message"] else 0.0
'''
TASKS = [{"id": "t1", "prompt": "Say hi."}, {"id": "t2", "prompt": "Say bye."}]


@pytest.fixture
def user_folder(tmp_path: Path) -> Path:
    """A user's working folder: their agent, their tasks, and an ``agentgym/`` tree that is never imported."""
    (tmp_path / "agentgym").mkdir()
    (tmp_path / "agentgym" / "__init__.py").write_text(SHADOW)
    (tmp_path / "my_agent.py").write_text(MY_AGENT)
    (tmp_path / "tasks.jsonl").write_text("".join(json.dumps(t) + "\n" for t in TASKS))
    return tmp_path


def _agentgym(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(AGENTGYM), *args], cwd=cwd, capture_output=True, text=True, timeout=240,
                          check=False, env={"PATH": str(AGENTGYM.parent), "HOME": str(cwd), "COLUMNS": "300"})


def test_the_command_imports_the_users_harness_from_their_folder(user_folder: Path) -> None:
    done = _agentgym("eval", "--policy", "random", "--harness", "my_agent:run", "--tasks", "tasks.jsonl",
                     "--episodes", "2", "--out", "out", cwd=user_folder)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    rows = json.loads((user_folder / "out" / "results.json").read_text())["results"]
    assert [(row["env"], row["success_rate"]) for row in rows] == [("harness-v0", 1.0)]


def test_a_missing_module_is_named_with_the_folder_searched(user_folder: Path) -> None:
    done = _agentgym("eval", "--policy", "random", "--harness", "their_agent:run", "--tasks", "tasks.jsonl",
                     "--episodes", "1", "--out", "out", cwd=user_folder)
    assert done.returncode != 0
    said = " ".join(done.stderr.split())
    assert (f"module 'their_agent' cannot be imported: there is no their_agent.py or their_agent/ in the "
            f"working folder {user_folder}") in said, said
    assert "run agentgym from the folder that holds it, add that folder to PYTHONPATH" in said


def test_env_workers_import_the_users_harness_from_the_folder_serve_ran_in(user_folder: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    service = start_service([str(AGENTGYM), "serve", "harness-v0", "--port", str(port), "--workers", "2",
                             "--log-level", "error"], url, timeout_s=120, cwd=user_folder)
    try:
        with httpx.Client(base_url=url, timeout=60) as http:
            workers = set()
            for _ in range(4):
                made = http.post("/sessions", json={"env_id": "harness-v0",
                                                    "kwargs": {"harness": "my_agent:run", "tasks": TASKS}})
                assert made.status_code == 201, made.text
                workers.add(made.json()["session_id"].split("g")[0])
            assert workers == {"w0", "w1"}  # both worker processes imported it
            missing = http.post("/sessions", json={"env_id": "harness-v0",
                                                   "kwargs": {"harness": "their_agent:run", "tasks": TASKS}})
            assert missing.status_code == 422 and "their_agent.py" in missing.json()["error"]["message"]
    finally:
        stop_service(service)


def test_import_object_finds_the_working_folder_after_the_installed_packages(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(sys, "path", [entry for entry in sys.path if entry not in ("", ".")])
    monkeypatch.chdir(tmp_path)
    (tmp_path / "scoring_for_test.py").write_text("def score(task, transcript):\n    return 1.0\n")
    (tmp_path / "json.py").write_text("def score(task, transcript):\n    return 1.0\n")
    assert import_object("scoring_for_test:score", what="reward")({}, []) == 1.0
    assert sys.path[-1] == str(tmp_path)  # appended: the folder never comes before the installed packages
    monkeypatch.delitem(sys.modules, "scoring_for_test")
    with pytest.raises(ConfigError, match=r"module 'json' has no attribute 'score' \(found at .*\); the "
                                          r"working folder's json.py is hidden by that installed module"):
        import_object("json:score", what="reward")
    with pytest.raises(ConfigError, match="is not 'module:attr'"):
        import_object("scoring_for_test.score", what="reward")
