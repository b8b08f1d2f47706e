"""services/: the Dockerfile's stages, compose.yaml and the Kubernetes manifests agree with each other and
with the project, and each service starts as the files declare it.

No Docker engine or cluster runs here, so the images are not built. Instead each service's command line
and environment are read from the files (the stage's ENTRYPOINT and ENV, compose's ``command`` and
``environment``, a manifest's ``args`` and ``env``) and run as a process, as the container would run it:
bound to 0.0.0.0, with the agentgym of a wheel installed in a fresh venv, from a folder holding the
sources (the images' ``WORKDIR /src``). Only three things are substituted: what the files leave to the user
(the tokens, set by the commands docs/services.md gives), a container path (under a folder standing for the
container's root) and the port (a free one: services that declare the same port run side by side here).
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import installed
import pytest
import tomllib
import yaml

from agentgym.errors import RemoteEnvError
from agentgym.service_kit.launcher import free_port, stop_service, wait_healthy

pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parents[2]
SERVICES = ROOT / "services"
DOCS = ROOT / "docs" / "services.md"
AGENTGYM = str(Path(sys.executable).parent / "agentgym")  # this venv's console script
#: Each image's own token: without it, a service listening on the container's address refuses to start.
OWN_TOKEN = {"env": "AGENTGYM_TOKEN", "retrieval": "AGENTGYM_RETRIEVAL_TOKEN",
             "sandbox": "AGENTGYM_SANDBOX_TOKEN"}


def dockerfile_stages() -> dict[str, dict]:
    """Per ``FROM ... AS name`` stage: its instructions (continuation lines joined), entrypoint, cmd,
    expose, ENV (with what it inherits from an earlier stage), USER and COPY destinations."""
    text = re.sub(r"\\\n\s*", " ", (SERVICES / "Dockerfile").read_text())
    stages: dict[str, dict] = {}
    current: dict | None = None
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        word, _, rest = line.partition(" ")
        if word == "FROM":
            name = rest.split(" AS ")[-1].strip() if " AS " in rest else rest
            base = rest.split(" AS ")[0].strip()
            parent = stages.get(base, {})
            current = {"base": base, "lines": [], "expose": [], "entrypoint": None, "cmd": None,
                       "env": dict(parent.get("env", {})), "user": parent.get("user"), "copies": {}}
            stages[name] = current
        elif current is not None:
            current["lines"].append(line)
            if word == "EXPOSE":
                current["expose"] = [int(p) for p in rest.split()]
            elif word in ("ENTRYPOINT", "CMD"):
                current[word.lower()] = json.loads(rest)  # exec form only: signals reach the server
            elif word == "ENV":
                current["env"].update(item.split("=", 1) for item in shlex.split(rest))
            elif word == "USER":
                current["user"] = rest
            elif word == "COPY" and not rest.startswith("--"):
                *sources, dest = rest.split()
                if len(sources) == 1:
                    current["copies"][dest] = sources[0]
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
    # `pip install .` in the image builds from what the base stage copied: every folder the wheel maps.
    copied = {source for line in stages["base"]["lines"] if line.startswith("COPY ")
              for source in line.split()[1:-1]}
    package_dirs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    assert set(package_dirs.values()) - copied == set(), "the base stage must COPY every package-dir folder"


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


def test_synthetic_cli_writes_the_corpus_and_questions(tmp_path: Path) -> None:
    out = subprocess.run([AGENTGYM, "retrieval", "synthetic", str(tmp_path), "--entities", "40",
                          "--seed", "2"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    corpus = (tmp_path / "corpus.jsonl").read_text().splitlines()
    assert len(corpus) == 40 and all({"id", "title", "text"} <= set(json.loads(line)) for line in corpus)
    bad = subprocess.run([AGENTGYM, "retrieval", "synthetic", str(tmp_path), "--entities", "3"],
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


# --- each service as declared, from a wheel in a fresh venv -----------------------------------------


def docs_line(prefix: str) -> str:
    """The one line of docs/services.md that starts with ``prefix`` (a command the page gives a user)."""
    [line] = [line.strip() for line in DOCS.read_text().splitlines() if line.strip().startswith(prefix)]
    return line


def user_variables() -> dict[str, str]:
    """The variables the docs tell a compose user to export, set by running that line in bash."""
    line = docs_line("export AGENTGYM_TOKEN=")
    names = re.findall(r"\b([A-Z_]+)=", line)
    script = line + "\n" + "".join(f'printf "%s\\n" "${name}"\n' for name in names)
    values = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True).stdout.split()
    return dict(zip(names, values, strict=True))


def secret_keys() -> tuple[str, dict[str, str]]:
    """The Secret the docs tell a Kubernetes user to create: its name and keys, made by running that
    ``kubectl create secret`` line in bash (with ``kubectl`` printing its arguments)."""
    line = docs_line("kubectl create secret generic")
    script = 'kubectl() { printf "%s\\n" "$@"; }\n' + line
    args = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True).stdout.split()
    literals = dict(arg.removeprefix("--from-literal=").split("=", 1) for arg in args
                    if arg.startswith("--from-literal="))
    return args[3], literals


def interpolate(value: str, variables: dict[str, str]) -> str:
    """Compose's ``${VAR}``, ``${VAR:-default}`` and ``${VAR:?error}``; a missing required variable raises
    ``LookupError`` with compose's message."""
    def one(match: re.Match[str]) -> str:
        name, op, arg = match.group(1), match.group(2) or "", match.group(3) or ""
        if variables.get(name):
            return variables[name]
        if op == ":?":
            raise LookupError(f"required variable {name} is missing a value: {arg}")
        return arg if op == ":-" else ""
    return re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(:[-?])?([^}]*)\}", one, value)


@dataclass
class Deployment:
    """One service as a deploy file declares it."""

    where: str
    """The file and service or workload."""
    stage: str
    """The Dockerfile target its image is built from."""
    argv: list[str]
    """ENTRYPOINT + compose ``command`` / the manifest's ``args`` (or the image's CMD)."""
    environment: dict[str, str]
    """The image's ENV with the file's environment over it, user-supplied values filled in."""
    supplied: set[str] = field(default_factory=set)
    """Names in ``environment`` whose value the file leaves to the user (a token)."""
    mounts: list[str] = field(default_factory=list)
    """Container folders given a volume."""


def deployments() -> list[Deployment]:
    stages, spec = dockerfile_stages(), compose()
    variables = user_variables()
    found = []
    for name, service in spec["services"].items():
        stage = stages[service["build"]["target"]]
        argv = stage["entrypoint"] + (service["command"] if "command" in service else stage["cmd"] or [])
        environment, supplied = dict(stage["env"]), set()
        for key, raw in service.get("environment", {}).items():
            environment[key] = interpolate(str(raw), variables)
            if re.search(r"\$\{[A-Z_]+:\?", str(raw)):
                supplied.add(key)
        mounts = [v.split(":")[1] for v in service.get("volumes", [])]
        found.append(Deployment(f"compose.yaml {name}", service["build"]["target"], argv, environment,
                                supplied, mounts))
    secret, literals = secret_keys()
    for file, doc, _ in workloads():
        [container] = doc["spec"]["template"]["spec"]["containers"]
        target = compose_service_for(container["image"])[1]["build"]["target"]
        stage = stages[target]
        argv = container.get("command") or stage["entrypoint"]
        argv = argv + (container["args"] if "args" in container else [] if "command" in container
                       else stage["cmd"] or [])
        environment, supplied = dict(stage["env"]), set()
        for entry in container.get("env", []):
            if "value" in entry:
                environment[entry["name"]] = entry["value"]
                continue
            ref = entry["valueFrom"]["secretKeyRef"]
            assert ref["name"] == secret and ref["key"] in literals, f"{file}: the docs' Secret lacks {ref}"
            environment[entry["name"]] = literals[ref["key"]]
            supplied.add(entry["name"])
        mounts = [m["mountPath"] for m in container.get("volumeMounts", [])]
        found.append(Deployment(f"k8s/{file} {doc['metadata']['name']}", target, argv, environment, supplied,
                                mounts))
    return found


DEPLOYMENTS = deployments()


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with agentgym from a wheel of this checkout (``installed.overlay_venv``: the wheel alone,
    its requirements from the development venv)."""
    env_dir = installed.overlay_venv(tmp_path_factory, tmp_path_factory.mktemp("wheel") / "venv")
    # The console script, run from the folder holding the sources as the images' WORKDIR /src does,
    # imports the wheel's agentgym.
    where = subprocess.run([str(env_dir / "bin" / "agentgym"), "doctor", "--json"], capture_output=True,
                           text=True, cwd=ROOT, timeout=240)
    assert where.returncode == 0, where.stderr
    location = Path(json.loads(where.stdout)["agentgym"]["location"])
    assert location.is_relative_to(env_dir) and location.name == "agentgym", location
    return env_dir


def launch(deployment: Deployment, venv: Path, root: Path, *,
           without: str | None = None) -> tuple[subprocess.Popen[str], int]:
    """Start ``deployment`` as its container would run it; the container's filesystem is ``root``."""
    stage = dockerfile_stages()[deployment.stage]
    home = Path("/home") / stage["user"]
    for folder in [*deployment.mounts, str(home)]:
        (root / folder.lstrip("/")).mkdir(parents=True, exist_ok=True)
    environ = {"PATH": f"{venv / 'bin'}:/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8",
               "HOME": str(root / str(home).lstrip("/"))}
    for key, value in deployment.environment.items():
        if key != without:
            environ[key] = str(root / value.lstrip("/")) if value.startswith("/") else value
    argv = list(deployment.argv)
    if argv[0] in stage["copies"]:  # a script the image copied in: the file it copied
        argv[0] = str(ROOT / stage["copies"][argv[0]])
    # A free port stands in for the declared one (which the static tests above check against EXPOSE and the
    # manifests): services declaring the same port start side by side in the test workers, and a probe for
    # "is it free" before the start races with them.
    declared, port = stage["expose"][0], free_port("0.0.0.0")
    if "--port" in argv and argv[argv.index("--port") + 1] == str(declared):
        argv[argv.index("--port") + 1] = str(port)
    else:
        environ["AGENTGYM_PORT"] = str(port)  # retrieval-entrypoint.sh's port
    process = subprocess.Popen(argv, env=environ, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True)
    return process, port


def healthy(process: subprocess.Popen[str], url: str) -> dict:
    """``wait_healthy``, with the service's output in the failure message when it exited."""
    try:
        return wait_healthy(url, process, timeout_s=180.0, poll_s=0.2)
    except RemoteEnvError as exc:
        output = process.stdout.read()[-3000:] if process.poll() is not None else ""  # type: ignore[union-attr]
        raise AssertionError(f"{exc}\n{output}") from exc


def test_the_docs_give_the_commands_the_files_name() -> None:
    """Every token a deploy file leaves to the user is set by the docs' commands, which the files repeat."""
    demanded = set(re.findall(r"\$\{([A-Z_]+):\?[^}]*\1", (SERVICES / "compose.yaml").read_text()))
    assert demanded == set(user_variables()) == set(OWN_TOKEN.values())
    assert docs_line("export AGENTGYM_TOKEN=") in (SERVICES / "compose.yaml").read_text()
    for name, docs in manifests().items():
        if "secretKeyRef" in (K8S / name).read_text():
            assert docs_line("kubectl create secret generic") in (K8S / name).read_text(), name
        for doc in docs:
            for container in doc.get("spec", {}).get("template", {}).get("spec", {}).get("containers", []):
                for entry in container.get("env", []):
                    ref = entry.get("valueFrom", {}).get("secretKeyRef")
                    assert ref is None or not ref.get("optional"), f"{name}: {entry['name']} may be unset"
    for deployment in DEPLOYMENTS:
        assert OWN_TOKEN[deployment.stage] in deployment.supplied, deployment.where


@pytest.mark.parametrize("deployment", DEPLOYMENTS, ids=lambda d: d.where.replace(" ", ":"))
def test_each_service_starts_as_declared(deployment: Deployment, venv: Path, tmp_path: Path) -> None:
    process, port = launch(deployment, venv, tmp_path / "container")
    url = f"http://127.0.0.1:{port}"  # the service listens on 0.0.0.0, as in its container
    token = deployment.environment[OWN_TOKEN[deployment.stage]]
    auth = {"Authorization": f"Bearer {token}"}
    try:
        health = healthy(process, url)  # as the probes and the HEALTHCHECK ask: without the token
        if deployment.stage == "env":
            assert httpx.get(f"{url}/envs", timeout=30).status_code == 401
            ids = {e["id"] for e in httpx.get(f"{url}/envs", headers=auth, timeout=30).json()}
            assert {"maze-v0", "search-qa-v0"} <= ids  # every registered env (no ids listed)
            if "--workers" in deployment.argv:
                workers = int(deployment.argv[deployment.argv.index("--workers") + 1])
                assert len(health["workers"]) == workers
        elif deployment.stage == "retrieval":
            body = {"queries": ["capital"], "k": 2}
            assert httpx.post(f"{url}/retrieve", json=body, timeout=30).status_code == 401
            hits = httpx.post(f"{url}/retrieve", json=body, headers=auth, timeout=30).json()["results"][0]
            assert len(hits) == 2
        else:
            assert health["backend"] == "bwrap"
            code = {"code": "print(6 * 7)"}
            assert httpx.post(f"{url}/run", json=code, timeout=30).status_code == 401
            result = httpx.post(f"{url}/run", json=code, headers=auth, timeout=60).json()
            assert result["stdout"] == "42\n" and result["exit_code"] == 0
    finally:
        stop_service(process, timeout_s=20)
    if deployment.stage == "retrieval":  # a restart serves the built index instead of rebuilding it
        index = deployment.environment["AGENTGYM_INDEX"]
        assert (tmp_path / "container" / index.lstrip("/") / "meta.json").is_file()


@pytest.mark.parametrize("deployment", DEPLOYMENTS, ids=lambda d: d.where.replace(" ", ":"))
def test_without_its_token_a_service_says_which_variable_to_set(deployment: Deployment, venv: Path,
                                                                  tmp_path: Path) -> None:
    variable = OWN_TOKEN[deployment.stage]
    process, _ = launch(deployment, venv, tmp_path / "container", without=variable)
    try:
        output, _ = process.communicate(timeout=120)
    finally:
        stop_service(process)
    lines = [line for line in output.splitlines() if line.strip()]
    assert process.returncode == 2, output
    assert len(lines) == 1 and lines[0].startswith("error: ") and f"set {variable} to" in lines[0], lines
    assert not list((tmp_path / "container").rglob("meta.json"))  # nothing was built first


def test_compose_without_a_token_names_the_variable() -> None:
    """What ``docker compose up`` says when a token is not exported: compose's own one-line message."""
    variables = user_variables()
    for missing in variables:
        given = {k: v for k, v in variables.items() if k != missing}
        said = f"required variable {missing} is missing a value: set {missing} "
        with pytest.raises(LookupError, match=said):
            for service in compose()["services"].values():
                for raw in service.get("environment", {}).values():
                    interpolate(str(raw), given)
