"""Experiment tracking (``tracking:``): real short runs log to the installed MLflow (a SQLite store in the run
folder) and W&B (offline), read back with MLflow's client and W&B's own record format; a resumed run continues
both runs; a tracking config that cannot work fails in one line naming the field."""

from __future__ import annotations

import json
import re
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from learning import small

from agentgym.errors import ConfigError
from agentgym.run_folder import RunFolder
from agentgym.training.config.loading import load_config
from agentgym.training.run.loop import train

mlflow = pytest.importorskip("mlflow", reason="the tracking extra: pip install 'agentgym-rl[tracking]'")
wandb_proto = pytest.importorskip("wandb.proto.wandb_internal_pb2",
                                  reason="the tracking extra: pip install 'agentgym-rl[tracking]'")

ROOT = Path(__file__).resolve().parents[3]
INSTALL = "pip install 'agentgym-rl[tracking]'"


@pytest.fixture(autouse=True)
def no_wandb_account(monkeypatch: pytest.MonkeyPatch) -> None:
    """W&B set to go online, to a server that is not there, with no account: a run not offline fails."""
    monkeypatch.setenv("WANDB_MODE", "online")
    monkeypatch.setenv("WANDB_BASE_URL", "http://127.0.0.1:9")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)


def run_config(*overrides: str) -> Any:
    return load_config(None, small("iterations=3", "checkpoint_every=1", "model.device=cpu", *overrides))


# --- reading back what the trackers wrote -----------------------------------------------------------


def mlflow_client(folder: RunFolder) -> Any:
    from mlflow.tracking import MlflowClient

    return MlflowClient(f"sqlite:///{(folder.mlruns / 'mlflow.db').resolve()}")


def steps(client: Any, run_id: str, key: str) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))


def logged(folder: RunFolder, key: str) -> list[tuple[int, float]]:
    """``key`` per iteration, as metrics.jsonl has it."""
    return [(m["iteration"], m[key]) for m in map(json.loads, folder.metrics.read_text().splitlines())]


def wandb_records(path: Path) -> list[Any]:
    """The records of a ``.wandb`` file, parsed with W&B's own ``Record`` message. The file is a LevelDB
    log (32 KiB blocks of records with a 7-byte header: CRC, length, type; a record split over blocks is
    FIRST, MIDDLE..., LAST) after W&B's 7-byte header."""
    data = path.read_bytes()
    assert data[:4] == b":W&B", data[:7]
    records, pos, pending = [], 7, b""
    while pos + 7 <= len(data):
        if 32768 - pos % 32768 < 7:  # a block's tail too short for a header is padding
            pos += 32768 - pos % 32768
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        pending += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # FULL or LAST
            record = wandb_proto.Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
    return records


def wandb_items(entries: Any) -> dict[str, Any]:
    """W&B's key/value items as a dict; a key W&B keeps as a path (``rollout/success_rate``) joined back."""
    return {entry.key or "/".join(entry.nested_key): json.loads(entry.value_json) for entry in entries}


def wandb_run(folder: RunFolder, run_id: str) -> list[dict[str, Any]]:
    """Each offline W&B file of ``run_id`` in the run folder (one per session: a resumed run writes
    another), oldest first, as its run record, history steps, summary and exit code."""
    found = []
    for path in sorted(folder.wandb.glob(f"offline-run-*-{run_id}/run-{run_id}.wandb")):
        run: dict[str, Any] = {"history": [], "summary": {}, "exit_code": None, "console": 0}
        for record in wandb_records(path):
            kind = record.WhichOneof("record_type")
            if kind == "run":
                run["id"], run["project"] = record.run.run_id, record.run.project
                run["name"] = record.run.display_name
                run["config"] = {item.key: json.loads(item.value_json) for item in record.run.config.update}
            elif kind == "history":
                run["history"].append((record.history.step.num, wandb_items(record.history.item)))
            elif kind == "summary":
                run["summary"].update(wandb_items(record.summary.update))
            elif kind == "exit":
                run["exit_code"] = record.exit.exit_code
            elif kind == "output_raw":
                run["console"] += 1
        found.append(run)
    return found


def wandb_steps(run: dict[str, Any], key: str) -> list[tuple[int, float]]:
    return [(step, items[key]) for step, items in run["history"]]


# --- the tests ----------------------------------------------------------------------------------------


def test_a_run_logs_params_every_iteration_and_the_final_numbers_to_mlflow_and_wandb(tmp_path: Path) -> None:
    folder = RunFolder(tmp_path / "tracked")
    cfg = run_config("tracking.mlflow=true", "tracking.wandb=true", "tracking.project=agentgym-tests")
    report = train(cfg, folder.path)
    ids = json.loads(folder.tracking.read_text())
    before, after = report["eval"]["before"]["success_rate"], report["eval"]["after"]["success_rate"]
    success = logged(folder, "rollout/success_rate")
    assert [step for step, _ in success] == [1, 2, 3]

    client = mlflow_client(folder)
    run_id = ids["mlflow"]["run_id"]
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.info.run_name == "tracked"
    assert client.get_experiment(run.info.experiment_id).name == "agentgym-tests"
    params = run.data.params
    assert (params["iterations"], params["rollout.group_size"]) == ("3", "4")
    assert params["algorithm.name"] == cfg.algorithm.name
    assert params["model.device"] == "cpu" and params["tracking.mlflow"] == "true"
    assert json.loads(params["rollout.stop_strings"]) == list(cfg.rollout.stop_strings)
    assert steps(client, run_id, "rollout/success_rate") == success
    assert steps(client, run_id, "perf/lr") == logged(folder, "perf/lr")
    assert "iteration" not in run.data.metrics
    assert steps(client, run_id, "eval/before_success_rate") == [(3, before)]
    assert steps(client, run_id, "eval/after_success_rate") == [(3, after)]
    assert steps(client, run_id, "eval/before_sft_success_rate") == [
        (3, report["eval"]["before_sft"]["success_rate"])]

    [wandb] = wandb_run(folder, ids["wandb"]["run_id"])
    assert (wandb["project"], wandb["name"], wandb["exit_code"]) == ("agentgym-tests", "tracked", 0)
    assert wandb["config"]["iterations"] == 3 and wandb["config"]["rollout"]["group_size"] == 4
    assert wandb_steps(wandb, "rollout/success_rate") == success
    assert wandb["summary"]["eval/before_success_rate"] == before
    assert wandb["summary"]["eval/after_success_rate"] == after
    assert wandb["console"] == 0  # the run's own output is not captured


def test_a_resumed_run_continues_its_tracker_runs_and_a_tracker_turned_on_gets_the_history(
        tmp_path: Path) -> None:
    folder = RunFolder(tmp_path / "resumed")
    stopped = train(run_config("tracking.mlflow=true"), folder.path, stop_after=1)
    assert stopped["stopped_after"] == 1
    client = mlflow_client(folder)
    run_id = json.loads(folder.tracking.read_text())["mlflow"]["run_id"]
    assert client.get_run(run_id).info.status == "KILLED"

    # Resumed with W&B turned on (tracking may change on resume): W&B starts with the history so far.
    train(run_config("tracking.mlflow=true", "tracking.wandb=true"), folder.path, resume=True, stop_after=2)
    ids = json.loads(folder.tracking.read_text())
    assert ids["mlflow"]["run_id"] == run_id
    assert client.get_run(run_id).info.status == "KILLED"
    [first] = wandb_run(folder, ids["wandb"]["run_id"])
    assert first["exit_code"] == 130
    assert wandb_steps(first, "rollout/success_rate") == logged(folder, "rollout/success_rate")[:2]

    report = train(run_config("tracking.mlflow=true", "tracking.wandb=true"), folder.path, resume=True)
    assert json.loads(folder.tracking.read_text()) == ids
    runs = client.search_runs([client.get_run(run_id).info.experiment_id])
    assert [r.info.run_id for r in runs] == [run_id]
    assert client.get_run(run_id).info.status == "FINISHED"
    assert steps(client, run_id, "rollout/success_rate") == logged(folder, "rollout/success_rate")
    assert steps(client, run_id, "eval/after_success_rate") == [(3, report["eval"]["after"]["success_rate"])]
    first, second = wandb_run(folder, ids["wandb"]["run_id"])
    assert second["id"] == first["id"] and second["exit_code"] == 0
    assert wandb_steps(second, "rollout/success_rate") == logged(folder, "rollout/success_rate")[2:]
    assert second["summary"]["eval/after_success_rate"] == report["eval"]["after"]["success_rate"]
    assert [entry["changes"] for entry in folder.config_history()] == [
        {"tracking.wandb": {"from": False, "to": True}}]


def test_a_run_that_fails_leaves_its_tracker_runs_failed_not_running(tmp_path: Path) -> None:
    folder = RunFolder(tmp_path / "failed")

    def fail(metrics: dict[str, Any]) -> None:
        raise RuntimeError(f"display broke at iteration {metrics['iteration']}")

    with pytest.raises(RuntimeError, match="iteration 1"):
        train(run_config("tracking.mlflow=true", "tracking.wandb=true"), folder.path, on_iteration=fail)
    ids = json.loads(folder.tracking.read_text())
    assert mlflow_client(folder).get_run(ids["mlflow"]["run_id"]).info.status == "FAILED"
    [wandb] = wandb_run(folder, ids["wandb"]["run_id"])
    assert wandb["exit_code"] == 1


def test_a_run_without_trackers_writes_none_of_their_files(tmp_path: Path) -> None:
    folder = RunFolder(tmp_path / "plain")
    train(run_config("iterations=1", "tracking.tensorboard=false"), folder.path)
    for entry in (folder.tracking, folder.mlruns, folder.wandb, folder.tensorboard):
        assert not entry.exists(), entry
    assert folder.report.is_file()


@pytest.mark.parametrize(("overrides", "blocked", "field", "says"), [
    (["tracking.mlflow=true"], "mlflow", "tracking.mlflow", INSTALL),
    (["tracking.wandb=true"], "wandb", "tracking.wandb", INSTALL),
    (["tracking.mlflow=true"], "sqlalchemy", "tracking.mlflow", "sqlalchemy and alembic"),
    (["tracking.mlflow_uri=sqlite:///elsewhere.db"], None, "tracking.mlflow_uri", "tracking.mlflow=true"),
    (["tracking.mlflow=true", "tracking.mlflow_uri=''"], None, "tracking.mlflow_uri", "tracking URI"),
    (["tracking.project=team/agents"], None, "tracking.project", "/"),
    (["tracking.run_name=' '"], None, "tracking.run_name", "non-empty"),
    (["tracking.mlfow=true"], None, "tracking.mlfow", "Did you mean tracking.mlflow?"),
    (["tracking.wandb=yes please"], None, "tracking.wandb", "true or false"),
])
def test_a_tracking_config_that_cannot_work_fails_in_one_line_naming_the_field(
        monkeypatch: pytest.MonkeyPatch, overrides: list[str], blocked: str | None, field: str,
        says: str) -> None:
    if blocked is not None:  # as if not installed: nothing can find or import it
        monkeypatch.setitem(sys.modules, blocked, None)
    with pytest.raises(ConfigError) as caught:
        load_config(None, overrides)
    message = str(caught.value)
    assert "\n" not in message
    assert re.search(re.escape(field) + r"(?!\w)", message) and says in message, message


def test_checking_a_tracking_config_imports_no_tracker_and_no_torch() -> None:
    probe = ("import sys, json; sys.modules['torch'] = None\n"
             "from agentgym.training import load_config\n"
             "cfg = load_config(None, ['tracking.mlflow=true', 'tracking.wandb=true'])\n"
             "print(json.dumps([cfg.tracking.mlflow, cfg.tracking.wandb,"
             " sorted(m for m in ('mlflow', 'wandb', 'torch', 'sqlalchemy') if sys.modules.get(m))]))")
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == [True, True, []]
