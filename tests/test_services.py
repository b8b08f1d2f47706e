"""services/: the Dockerfile's stages and compose.yaml agree with each other and with the project, and
each image's entry point, run here as it would run in its container, serves a healthy service.

No Docker engine runs here, so the images are not built; instead every stage's ENTRYPOINT (with the
compose ``command``) is started as a real process with only host and port changed.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import tomllib
import yaml

from agentgym.errors import RemoteEnvError
from agentgym.http.launcher import free_port, stop_service, wait_healthy

pytestmark = pytest.mark.timeout(180)

ROOT = Path(__file__).resolve().parent.parent
SERVICES = ROOT / "services"
BIN = Path(sys.executable).parent  # the venv's agentgym console script lives next to its python


def dockerfile_stages() -> dict[str, dict[str, object]]:
    """Per ``FROM ... AS name`` stage: its instructions (continuation lines joined), entrypoint, cmd,
    expose."""
    text = re.sub(r"\\\n\s*", " ", (SERVICES / "Dockerfile").read_text())
    stages: dict[str, dict[str, object]] = {}
    current: dict[str, object] | None = None
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        word, _, rest = line.partition(" ")
        if word == "FROM":
            name = rest.split(" AS ")[-1].strip() if " AS " in rest else rest
            base = rest.split(" AS ")[0].strip()
            current = {"base": base, "lines": [], "expose": [], "entrypoint": None, "cmd": None}
            stages[name] = current
        elif current is not None:
            current["lines"].append(line)  # type: ignore[union-attr]
            if word == "EXPOSE":
                current["expose"] = [int(p) for p in rest.split()]
            elif word in ("ENTRYPOINT", "CMD"):
                current[word.lower()] = json.loads(rest)  # exec form only: signals reach the server
    return stages


def compose() -> dict:
    return yaml.safe_load((SERVICES / "compose.yaml").read_text())


def test_dockerfile_stages_copy_real_paths_and_install_real_extras() -> None:
    stages = dockerfile_stages()
    assert {"base", "env", "retrieval", "sandbox"} <= set(stages)
    extras = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])
    for name, stage in stages.items():
        for line in stage["lines"]:
            if line.startswith("COPY "):
                *sources, _dest = line.split()[1:]
                for source in sources:
                    assert (ROOT / source).exists(), f"stage {name}: COPY of missing {source}"
            for group in re.findall(r'pip install "\.\[([a-z,]+)\]"', line):
                unknown = set(group.split(",")) - extras
                assert not unknown, f"stage {name} installs unknown extras {unknown}"
        if name != "base":
            assert stage["entrypoint"], f"stage {name} has no exec-form ENTRYPOINT"
            assert stage["expose"], f"stage {name} exposes no port"


def test_compose_services_build_existing_stages_and_publish_the_exposed_port() -> None:
    stages, spec = dockerfile_stages(), compose()
    assert set(spec["services"]) == {"env", "retrieval", "sandbox"}
    for name, service in spec["services"].items():
        build = service["build"]
        assert (SERVICES / build["context"] / build["dockerfile"]).resolve() == SERVICES / "Dockerfile"
        stage = stages[build["target"]]
        published = [int(p.rsplit(":", 1)[1]) for p in service["ports"]]
        assert published == stage["expose"], f"{name}: publishes {published}, image exposes {stage['expose']}"
        for dependency in service.get("depends_on", {}):
            assert dependency in spec["services"]
    for volume in (v.split(":")[0] for s in spec["services"].values() for v in s.get("volumes", [])):
        assert volume in spec["volumes"]


def run_entrypoint(stage: str, args: list[str], port: int,
                   env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """Start a stage's ENTRYPOINT + ``args`` as a local process, bound to 127.0.0.1:``port``."""
    argv = list(dockerfile_stages()[stage]["entrypoint"]) + args  # type: ignore[arg-type]
    exposed = str(dockerfile_stages()[stage]["expose"][0])  # type: ignore[index]
    argv = ["127.0.0.1" if a == "0.0.0.0" else str(port) if a == exposed else a for a in argv]
    if argv[0] == "agentgym":
        argv[0] = str(BIN / "agentgym")
    elif argv[0].endswith("retrieval-entrypoint.sh"):
        argv[0] = str(SERVICES / "retrieval-entrypoint.sh")
    environ = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", **(env or {})}
    return subprocess.Popen(argv, env=environ, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def healthy(proc: subprocess.Popen[bytes], url: str) -> dict:
    """``wait_healthy``, with the service's output in the failure message when it exited."""
    try:
        return wait_healthy(url, proc, timeout_s=90.0, poll_s=0.2)
    except RemoteEnvError as exc:
        output = proc.stdout.read().decode()[-3000:] if proc.poll() is not None else ""
        raise AssertionError(f"{exc}\n{output}") from exc


def test_env_image_entrypoint_serves_the_listed_env_ids() -> None:
    port = free_port()
    proc = run_entrypoint("env", ["maze-v0", "wordle-v0"], port)
    try:
        url = f"http://127.0.0.1:{port}"
        healthy(proc, url)
        assert sorted(e["id"] for e in httpx.get(f"{url}/envs").json()) == ["maze-v0", "wordle-v0"]
        session = httpx.post(f"{url}/sessions", json={"env_id": "maze-v0"}).json()
        reset = httpx.post(f"{url}/sessions/{session['session_id']}/reset", json={"seed": 3})
        assert reset.status_code == 200 and "observation" in reset.json()
    finally:
        stop_service(proc, timeout_s=20)


def test_retrieval_image_entrypoint_builds_the_synthetic_index_then_serves_it(tmp_path: Path) -> None:
    port = free_port()
    index = tmp_path / "data" / "index"
    env = {"AGENTGYM_INDEX": str(index), "AGENTGYM_SYNTHETIC_ENTITIES": "60", "AGENTGYM_HOST": "127.0.0.1",
           "AGENTGYM_PORT": str(port)}
    proc = run_entrypoint("retrieval", [], port, env)
    try:
        url = f"http://127.0.0.1:{port}"
        healthy(proc, url)
        questions_file = tmp_path / "data" / "synthetic" / "questions.jsonl"
        questions = [json.loads(line) for line in questions_file.read_text().splitlines()]
        query = questions[0]["metadata"]["search_queries"][0]
        hits = httpx.post(f"{url}/retrieve", json={"queries": [query], "k": 2}).json()["results"][0]
        assert hits and hits[0]["title"] == query
    finally:
        stop_service(proc, timeout_s=20)
    assert (index / "meta.json").is_file()  # a restart serves the built index instead of rebuilding it


def test_sandbox_image_entrypoint_runs_code_on_bwrap() -> None:
    port = free_port()
    proc = run_entrypoint("sandbox", compose()["services"]["sandbox"]["command"], port)
    try:
        url = f"http://127.0.0.1:{port}"
        assert healthy(proc, url)["backend"] == "bwrap"
        result = httpx.post(f"{url}/run", json={"code": "print(6 * 7)"}, timeout=30).json()
        assert result["stdout"] == "42\n" and result["exit_code"] == 0
    finally:
        stop_service(proc, timeout_s=20)


def test_synthetic_cli_writes_the_corpus_and_questions(tmp_path: Path) -> None:
    out = subprocess.run([str(BIN / "agentgym"), "retrieval", "synthetic", str(tmp_path), "--entities", "40",
                          "--seed", "2"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    corpus = (tmp_path / "corpus.jsonl").read_text().splitlines()
    assert len(corpus) == 40 and all({"id", "title", "text"} <= set(json.loads(line)) for line in corpus)
    bad = subprocess.run([str(BIN / "agentgym"), "retrieval", "synthetic", str(tmp_path), "--entities", "3"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0 and "num_entities must be an integer in [20" in bad.stdout + bad.stderr


# --- Kubernetes manifests ---------------------------------------------------------------------------

K8S = SERVICES / "k8s"
#: compose's security_opt entries and the pod securityContext fields that say the same.
SECURITY_OPTS = {"seccomp=unconfined": ("seccompProfile", {"type": "Unconfined"}),
                 "apparmor=unconfined": ("appArmorProfile", {"type": "Unconfined"}),
                 "systempaths=unconfined": ("procMount", "Unmasked")}


def manifests() -> dict[str, list[dict]]:
    return {path.name: [d for d in yaml.safe_load_all(path.read_text()) if d]
            for path in sorted(K8S.glob("*.yaml"))}


def workloads() -> list[tuple[str, dict, dict]]:
    """(file, workload, its Service) for every Deployment and StatefulSet."""
    found = []
    for name, docs in manifests().items():
        services = [d for d in docs if d["kind"] == "Service"]
        for doc in docs:
            if doc["kind"] in ("Deployment", "StatefulSet"):
                labels = doc["spec"]["template"]["metadata"]["labels"]
                [service] = [s for s in services if s["spec"]["selector"].items() <= labels.items()]
                found.append((name, doc, service))
    return found


def compose_service_for(image: str) -> tuple[str, dict]:
    [(name, service)] = [(n, s) for n, s in compose()["services"].items() if s["image"] == image]
    return name, service


def test_every_image_has_a_kubernetes_workload_behind_a_service() -> None:
    images = {doc["spec"]["template"]["spec"]["containers"][0]["image"] for _, doc, _ in workloads()}
    assert images == {s["image"] for s in compose()["services"].values()}


def test_kubernetes_workloads_match_the_images_and_compose() -> None:
    stages = dockerfile_stages()
    uid = int(re.search(r"useradd .*--uid (\d+)", " ".join(stages["base"]["lines"])).group(1))  # type: ignore[arg-type]
    for name, doc, service in workloads():
        pod = doc["spec"]["template"]["spec"]
        [container] = pod["containers"]
        compose_name, compose_service = compose_service_for(container["image"])
        stage = stages[compose_service["build"]["target"]]
        where = f"{name}: {doc['kind']} {doc['metadata']['name']}"
        ports = [p["containerPort"] for p in container["ports"]]
        assert ports == stage["expose"], f"{where}: container ports {ports}, image exposes {stage['expose']}"
        for probe in ("readinessProbe", "livenessProbe"):
            assert container[probe]["httpGet"] == {"path": "/health", "port": ports[0]}, where
        assert {"cpu", "memory"} <= set(container["resources"]["requests"]), where
        assert "memory" in container["resources"]["limits"], where
        security = {**pod.get("securityContext", {}), **container["securityContext"]}
        assert security["runAsNonRoot"] is True and security["runAsUser"] == uid, where
        assert security["allowPrivilegeEscalation"] is False, where
        assert security["capabilities"] == {"drop": ["ALL"]}, where
        assert security["readOnlyRootFilesystem"] is True, where
        mounts = {m["mountPath"] for m in container.get("volumeMounts", [])}
        assert "/tmp" in mounts, f"{where}: a read-only root needs a writable /tmp"
        for volume in compose_service.get("volumes", []):
            assert volume.split(":")[1] in mounts, f"{where}: compose mounts {volume}, the pod does not"
        env_names = {e["name"] for e in container.get("env", [])}
        if doc["kind"] == "Deployment":  # the fleet's pods serve envs only, without tool services
            missing = set(compose_service.get("environment", {})) - env_names
            assert not missing, f"{where}: compose sets {missing}, the pod does not"
        if compose_service.get("command"):
            assert container["args"] == compose_service["command"], where
        for opt in compose_service.get("security_opt", []):
            field, value = SECURITY_OPTS[opt]
            assert security.get(field) == value, f"{where}: compose has {opt}, the pod lacks {field}: {value}"
        if compose_service.get("read_only"):
            assert any(v.get("emptyDir", {}).get("medium") == "Memory" for v in pod["volumes"]), where
        if not compose_service.get("security_opt"):
            assert security.get("seccompProfile") == {"type": "RuntimeDefault"}, where
        assert [p["targetPort"] for p in service["spec"]["ports"]] == ports, where
        if doc["kind"] == "StatefulSet":  # one address per pod: a headless Service, named by serviceName
            assert doc["spec"]["serviceName"] == service["metadata"]["name"]
            assert service["spec"]["clusterIP"] == "None"
        else:
            assert compose_name in doc["metadata"]["name"]


def test_the_env_manifest_runs_as_written_and_its_probe_answers() -> None:
    [(_, doc, _)] = [(n, d, s) for n, d, s in workloads() if d["metadata"]["name"] == "agentgym-env"]
    container = doc["spec"]["template"]["spec"]["containers"][0]
    args = list(container["args"])
    port = free_port()
    proc = run_entrypoint("env", args, port)
    try:
        url = f"http://127.0.0.1:{port}"
        healthy(proc, url)
        probe = container["readinessProbe"]["httpGet"]
        health = httpx.get(f"{url}{probe['path']}").json()
        assert len(health["workers"]) == int(args[args.index("--workers") + 1])
    finally:
        stop_service(proc, timeout_s=20)
