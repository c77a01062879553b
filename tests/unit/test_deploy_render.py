"""deploy/kubernetes as an operator applies it: rendered by a real kustomize, validated by kubeconform against the
Kubernetes API's schemas (strict: an unknown field is an error, so is a kind without a schema), one image set
the way docs/deployment.md says, and one Secret and one Cassandra role per process.

The tools are built by tests/gotools.py (``go install`` through the Go module proxy, cached in .tools/); when they
cannot be installed these tests fail, they are never skipped."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from stack.secure import KAFKA_USERS, ROLES
from tests import gotools
from tests.unit.test_deploy_files import _setting_exists

ROOT = Path(__file__).resolve().parents[2]
KUBERNETES = ROOT / "deploy" / "kubernetes"
# Each process and the Cassandra role docs/security.md gives it (the roles the secured stack creates).
PROCESS_ROLES = {"schema": "countersink_schema", "consume": "countersink_consumer", "gc": "countersink_gc",
                 "serve": "countersink_reader"}
# serve's second role, for resets over HTTP only: set in its Secret when they are turned on.
SERVE_ADMIN_ROLE = "countersink_serve_admin"


@pytest.fixture(scope="module")
def kustomize() -> Path:
    return gotools.go_tool("kustomize")


def build(kustomize: Path, directory: Path) -> list[dict[str, Any]]:
    done = subprocess.run([str(kustomize), "build", str(directory)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


@pytest.fixture(scope="module")
def rendered(kustomize: Path) -> list[dict[str, Any]]:
    return build(kustomize, KUBERNETES)


def kubeconform(documents: list[dict[str, Any]], version: str, tmp_path: Path) -> tuple[int, dict[str, Any]]:
    """kubeconform's exit code and JSON report on ``documents`` for Kubernetes ``version``."""
    manifest = tmp_path / "rendered.yaml"
    manifest.write_text(yaml.safe_dump_all(documents))
    schemas = gotools.kubernetes_schemas()
    done = subprocess.run(
        [str(gotools.go_tool("kubeconform")), "-strict", "-summary", "-output", "json",
         "-kubernetes-version", version, "-schema-location", f"{schemas}/{gotools.SCHEMA_LOCATION_TEMPLATE}",
         str(manifest)], capture_output=True, text=True, check=False)
    return done.returncode, json.loads(done.stdout)


def containers(documents: list[dict[str, Any]]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(workload, container) for every container of every Deployment, Job and CronJob."""
    out = []
    for doc in documents:
        spec = doc.get("spec", {})
        pod = (spec.get("jobTemplate", {}).get("spec", {}) or spec).get("template", {}).get("spec", {})
        out += [(doc, container) for container in pod.get("containers", [])]
    return out


@pytest.mark.parametrize("version", gotools.KUBERNETES_VERSIONS)
def test_rendered_manifests_are_valid_kubernetes_objects(rendered: list[dict[str, Any]], version: str,
                                                         tmp_path: Path) -> None:
    """Every object kustomize renders, and the example Secrets, validate against that Kubernetes version's
    schema: none invalid, none without a schema, none skipped."""
    kinds = {doc["kind"] for doc in rendered}
    assert kinds == {"Namespace", "ConfigMap", "Service", "Deployment", "Job", "CronJob", "PodDisruptionBudget"}
    secrets = [d for d in yaml.safe_load_all((KUBERNETES / "secret.example.yaml").read_text()) if d]
    assert len(secrets) == len(PROCESS_ROLES)
    code, report = kubeconform(rendered + secrets, version, tmp_path)
    assert report["summary"] == {"valid": len(rendered) + len(secrets), "invalid": 0, "errors": 0, "skipped": 0}
    assert code == 0


def test_the_validator_refuses_what_the_api_server_would(rendered: list[dict[str, Any]], tmp_path: Path) -> None:
    """The same validation fails on a misspelt field, a wrong type and an unknown kind: it is not a no-op."""
    broken = json.loads(json.dumps(rendered))
    (consumer,) = [d for d in broken if d["kind"] == "Deployment" and d["metadata"]["name"] == "countersink-consumer"]
    consumer["spec"]["replicas"] = "three"
    (cronjob,) = [d for d in broken if d["kind"] == "CronJob"]
    cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]["restartPolicyy"] = "Never"
    broken.append({"apiVersion": "v1", "kind": "ConfigMapp", "metadata": {"name": "x"}})
    code, report = kubeconform(broken, gotools.KUBERNETES_VERSIONS[-1], tmp_path)
    assert code != 0
    assert report["summary"]["invalid"] == 2
    assert report["summary"]["errors"] == 1  # no schema for the unknown kind
    messages = " ".join(r.get("msg", "") for r in report["resources"])
    assert "/spec/replicas" in messages
    assert "restartPolicyy" in messages
    assert "ConfigMapp" in messages


def images_entry() -> dict[str, str]:
    (entry,) = yaml.safe_load((KUBERNETES / "kustomization.yaml").read_text())["images"]
    return entry  # type: ignore[no-any-return]


def test_every_pod_runs_the_image_of_the_images_entry(rendered: list[dict[str, Any]]) -> None:
    """The manifests name the image "countersink" only; kustomize writes the images: entry in its place: a
    registry host, and this release's version as the tag (never latest)."""
    entry = images_entry()
    assert entry["name"] == "countersink"
    registry = entry["newName"].split("/")[0]
    assert "." in registry or ":" in registry, "the image name must start with a registry host"
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert entry["newTag"] == version
    for path in ("schema-job.yaml", "consumer-deployment.yaml", "gc-cronjob.yaml", "serve-deployment.yaml"):
        for _, container in containers(list(yaml.safe_load_all((KUBERNETES / path).read_text()))):
            assert container["image"] == "countersink", path
    images = {container["image"] for _, container in containers(rendered)}
    assert images == {f"{entry['newName']}:{version}"}
    assert all(c.get("imagePullPolicy") in (None, "IfNotPresent") for _, c in containers(rendered))


def test_setting_the_image_as_the_docs_say(kustomize: Path, tmp_path: Path) -> None:
    """docs/deployment.md's `kustomize edit set image` line, run in a copy of deploy/kubernetes, puts that image
    in every pod and nothing else."""
    docs = (ROOT / "docs" / "deployment.md").read_text()
    (line,) = re.findall(r"^kustomize edit set image countersink=\S+$", docs, re.M)
    copy = tmp_path / "kubernetes"
    shutil.copytree(KUBERNETES, copy)
    image = "ghcr.io/example/countersink@sha256:" + "ab" * 32
    command = [*line.split()[:-1], f"countersink={image}"]
    done = subprocess.run([str(kustomize), *command[1:]], cwd=copy, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert {c["image"] for _, c in containers(build(kustomize, copy))} == {image}


def example_secrets() -> dict[str, dict[str, str]]:
    docs = yaml.safe_load_all((KUBERNETES / "secret.example.yaml").read_text())
    return {d["metadata"]["name"]: d["stringData"] for d in docs if d and d["kind"] == "Secret"}


def test_each_process_has_its_own_secret_and_role(rendered: list[dict[str, Any]]) -> None:
    """Each of the four processes reads one Secret of its own, which it requires, and the example of that Secret
    logs in as the process's own Cassandra role (docs/security.md's least privilege, the roles stack/secure.py
    creates); only the consumer, the one process that talks to Kafka, gets Kafka credentials."""
    by_process, mounts = {}, {}
    for workload, container in containers(rendered):
        refs = [s["secretRef"] for s in container.get("envFrom", []) if "secretRef" in s]
        assert len(refs) == 1, workload["metadata"]["name"]
        assert not refs[0].get("optional"), workload["metadata"]["name"]
        assert not [e for e in container.get("env", []) if "valueFrom" in e]  # no other Secret read
        assert not [v for v in (workload["spec"].get("template") or {}).get("spec", {}).get("volumes", [])
                    if "secret" in v]
        by_process[container["args"][0]] = refs[0]["name"]
        mounts[container["args"][0]] = container.get("volumeMounts", [])
    assert set(by_process) == set(PROCESS_ROLES)
    assert len(set(by_process.values())) == len(by_process)
    secrets = example_secrets()
    assert set(secrets) == set(by_process.values())
    assert set(PROCESS_ROLES.values()) | {SERVE_ADMIN_ROLE} == set(ROLES)
    for process, secret in by_process.items():
        data = secrets[secret]
        assert all(_setting_exists(name) for name in data), secret
        assert data["COUNTERSINK_CASSANDRA__USERNAME"] == PROCESS_ROLES[process]
        kafka = {name for name in data if name.startswith("COUNTERSINK_KAFKA__")}
        if process == "consume":
            assert data["COUNTERSINK_KAFKA__SASL_USERNAME"] in KAFKA_USERS
            assert "COUNTERSINK_KAFKA__SASL_PASSWORD" in kafka
        else:
            assert kafka == set(), secret  # serve's (for /trace and resets) are commented out: yours to set
        # A file a setting names is in a volume every pod of the process mounts (the authorities' ConfigMap).
        for name in ("COUNTERSINK_CASSANDRA__SSL_TRUSTED_CERT", "COUNTERSINK_KAFKA__SSL_CAFILE"):
            if name in data:
                assert any(data[name].startswith(mount["mountPath"] + "/") for mount in mounts[process]), (secret,
                                                                                                           name)
    # nothing secret in the ConfigMap every process shares
    (config,) = [d for d in rendered if d["kind"] == "ConfigMap"]
    assert not [name for name in config["data"] if re.search(r"PASSWORD|USERNAME|TOKEN|KEYFILE|PRIVATE_KEY", name)]


def test_the_serve_secret_shows_how_to_turn_resets_on() -> None:
    """The serve Secret's example names, commented out, the settings that turn resets over HTTP on: real
    settings, logging in as serve's admin role (the one stack/secure.py grants the resets tables)."""
    text = (KUBERNETES / "secret.example.yaml").read_text()
    serve = text[text.index("name: countersink-serve-credentials"):]
    commented = dict(re.findall(r"^  # (COUNTERSINK_[A-Z_]+): \"([^\"]*)\"$", serve, re.M))
    assert all(_setting_exists(name) for name in commented), commented
    assert commented["COUNTERSINK_SERVE__ADMIN_CASSANDRA_USERNAME"] == SERVE_ADMIN_ROLE
    assert {"COUNTERSINK_SERVE__ADMIN_TOKENS", "COUNTERSINK_KAFKA__SASL_PASSWORD"} <= set(commented)
