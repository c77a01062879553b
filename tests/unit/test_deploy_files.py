"""The deployment files (compose, Kubernetes, Grafana, Prometheus rules, Dockerfile) agree with the code and with
what an operator needs: every command parses with the real command line, every COUNTERSINK_* variable is a real
setting, every metric on the dashboard and in the alert rules exists, probes point at the ports the processes
listen on, pods meet the "restricted" Pod Security Standard, disruptions and GC deferrals are handled as the
comments say, and the image installs what CI tests."""

from __future__ import annotations

import argparse
import importlib
import itertools
import json
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml
from packaging.requirements import Requirement
from prometheus_client import generate_latest

from countersink.cli import SUBCOMMANDS
from countersink.metrics import Metrics
from countersink.settings import Settings
from gc_worker.cli import EXIT_DEFERRED
from schemas.definitions import load_definitions

ROOT = Path(__file__).resolve().parents[2]
KUBERNETES = ROOT / "deploy" / "kubernetes"
DEFAULT_PORTS = {"consume": Settings().consumer.health_port, "gc": Settings().gc.health_port,
                 "serve": Settings().serve.port}


def documents() -> list[tuple[str, dict[str, Any]]]:
    found = [("compose.yaml", yaml.safe_load((ROOT / "compose.yaml").read_text()))]
    for path in sorted(KUBERNETES.glob("*.yaml")):
        found += [(path.name, doc) for doc in yaml.safe_load_all(path.read_text()) if doc]
    return found


def kustomization() -> dict[str, Any]:
    return yaml.safe_load((KUBERNETES / "kustomization.yaml").read_text())  # type: ignore[no-any-return]


def generated_settings() -> dict[str, str]:
    """The variables of the generated ConfigMap (kustomize's env files: KEY=VALUE lines, # comments)."""
    values = {}
    for generator in kustomization()["configMapGenerator"]:
        for env_file in generator.get("envs", []):
            for line in (KUBERNETES / env_file).read_text().splitlines():
                if line.strip() and not line.startswith("#"):
                    name, _, value = line.partition("=")
                    values[name] = value
    return values


def pods() -> list[tuple[str, dict[str, Any]]]:
    """(where, pod spec) of every Kubernetes workload."""
    out = []
    for name, doc in documents():
        if name == "compose.yaml" or doc.get("kind") not in ("Deployment", "Job", "CronJob"):
            continue
        spec = doc["spec"]
        out.append((f"{name}:{doc['kind']}", (spec.get("jobTemplate", {}).get("spec", {}) or spec)["template"]["spec"]))
    return out


def workloads(kind: str) -> list[dict[str, Any]]:
    return [doc for name, doc in documents() if name != "compose.yaml" and doc.get("kind") == kind]


def containers() -> list[tuple[str, dict[str, Any]]]:
    """(where, container) for every countersink container: Kubernetes pod specs and compose services."""
    out = []
    for name, doc in documents():
        if name == "compose.yaml":
            out += [(f"compose:{service}", {"args": spec["command"], "env": spec.get("environment", {}),
                                            "healthcheck": spec.get("healthcheck")})
                    for service, spec in doc["services"].items() if spec.get("image", "").startswith("countersink")]
            continue
        spec = doc.get("spec", {})
        pod = (spec.get("jobTemplate", {}).get("spec", {}) or spec).get("template", {}).get("spec", {})
        out += [(f"{name}:{c['name']}", c) for c in pod.get("containers", [])]
    return out


def parser() -> argparse.ArgumentParser:
    """The command line exactly as ``countersink.cli.main`` builds it."""
    root = argparse.ArgumentParser(prog="countersink")
    sub = root.add_subparsers(dest="command", required=True)
    for name, (module_name, _) in SUBCOMMANDS.items():
        module = importlib.import_module(module_name)
        ident = name.replace("-", "_")
        (getattr(module, f"add_{ident}_arguments", None) or module.add_arguments)(sub.add_parser(name))
    return root


def test_there_is_something_to_check() -> None:
    """Every deployment file is found, and together they run all four commands."""
    where = {w.split(":")[0] for w, _ in containers()}
    assert {"compose", "consumer-deployment.yaml", "gc-cronjob.yaml", "serve-deployment.yaml",
            "schema-job.yaml"} <= where
    commands = {c["args"][0] for _, c in containers()}
    assert commands == {"schema", "consume", "gc", "serve"}


@pytest.mark.parametrize(("where", "container"), containers(), ids=lambda v: v if isinstance(v, str) else "")
def test_every_command_parses(where: str, container: dict[str, Any]) -> None:
    """Every container's arguments parse as a countersink command line."""
    parser().parse_args(container["args"])


def _setting_exists(name: str) -> bool:
    fields = Settings.model_fields
    path = name.removeprefix("COUNTERSINK_").lower().split("__")
    if len(path) == 1:
        return path[0] in fields
    section = fields.get(path[0])
    return section is not None and len(path) == 2 and path[1] in section.annotation.model_fields  # type: ignore[union-attr]


def test_every_variable_is_a_setting() -> None:
    """Every COUNTERSINK_ variable the deployment files set names a real setting."""
    names: set[str] = set(generated_settings())
    for _, doc in documents():
        names |= set(re.findall(r"COUNTERSINK_[A-Z0-9_]+", json.dumps(doc)))
    assert len(names) > 10
    unknown = sorted(n for n in names if not _setting_exists(n))
    assert unknown == []


def test_the_image_opens_the_health_servers_to_probes() -> None:
    """The health servers listen on loopback by default; the image sets every interface for both (real
    settings), so that probes and Prometheus reach a container."""
    assert (Settings().consumer.health_host, Settings().gc.health_host) == ("127.0.0.1", "127.0.0.1")
    env = dict(re.findall(r"(COUNTERSINK_[A-Z_]+)=(\S+)", "\n".join(
        line for line in (ROOT / "Dockerfile").read_text().splitlines() if line.startswith("ENV "))))
    assert {name: env.get(name) for name in ("COUNTERSINK_CONSUMER__HEALTH_HOST", "COUNTERSINK_GC__HEALTH_HOST")} == {
        "COUNTERSINK_CONSUMER__HEALTH_HOST": "0.0.0.0", "COUNTERSINK_GC__HEALTH_HOST": "0.0.0.0"}  # noqa: S104
    assert all(_setting_exists(name) for name in env)


def test_a_misspelt_variable_would_be_caught() -> None:
    """The setting check tells a real variable from a misspelt one."""
    assert _setting_exists("COUNTERSINK_CONSUMER__GROUP_ID")
    assert not _setting_exists("COUNTERSINK_CONSUMER__GROUPID")
    assert not _setting_exists("COUNTERSINK_NOSUCH__GROUP_ID")


def test_probes_use_the_default_ports() -> None:
    """Every probe and health check asks the port its command serves by default."""
    checked = 0
    for where, container in containers():
        port = DEFAULT_PORTS.get(container["args"][0])
        for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
            if probe in container:
                assert container[probe]["httpGet"]["port"] == port, (where, probe)
                checked += 1
        if container.get("healthcheck"):
            assert f"127.0.0.1:{port}/" in " ".join(container["healthcheck"]["test"]), where
            checked += 1
    assert checked >= 8


def test_kustomization_lists_existing_files_and_no_secret() -> None:
    """The kustomization lists every manifest that exists and no secret."""
    resources = kustomization()["resources"]
    assert all((KUBERNETES / r).is_file() for r in resources)
    assert not [r for r in resources if "secret" in r]
    assert {p.name for p in KUBERNETES.glob("*.yaml")} - set(resources) == {"kustomization.yaml",
                                                                           "secret.example.yaml"}


def test_configuration_changes_roll_the_pods() -> None:
    """The settings ConfigMap is generated with a content hash in its name (kustomize rewrites every reference
    to it), so a change gives the pods a new template; every pod takes its settings from it by that name."""
    (generator,) = kustomization()["configMapGenerator"]
    assert generator["name"] == "countersink"
    assert not generator.get("options", {}).get("disableNameSuffixHash")
    assert not kustomization().get("generatorOptions", {}).get("disableNameSuffixHash")
    assert all((KUBERNETES / f).is_file() for f in generator.get("envs", []) + generator.get("files", []))
    assert not [d for _, d in documents() if d.get("kind") == "ConfigMap"]  # a hand-written one would not roll
    load_definitions(KUBERNETES / "counters.toml")  # the definitions it carries are valid
    for where, pod in pods():
        sources = [s["configMapRef"]["name"] for c in pod["containers"] for s in c.get("envFrom", [])
                   if "configMapRef" in s]
        assert sources == ["countersink"], where
        for volume in pod.get("volumes", []):
            if "configMap" in volume:  # the settings, or the authorities' certificates (yours, not generated)
                assert (volume["configMap"]["name"] == "countersink"
                        or volume["configMap"] == {"name": "countersink-ca", "optional": True}), where


def test_pods_meet_the_restricted_pod_security_standard() -> None:
    """Every pod runs as non-root with the RuntimeDefault seccomp profile and no service-account token; every
    container drops all capabilities, cannot escalate, and has a read-only root file system."""
    checked = 0
    for where, pod in pods():
        assert pod.get("automountServiceAccountToken") is False, where
        context = pod["securityContext"]
        assert context["runAsNonRoot"] is True, where
        assert context["runAsUser"] >= 10000, where
        assert context["seccompProfile"] == {"type": "RuntimeDefault"}, where
        for container in pod["containers"]:
            own = container["securityContext"]
            assert own["allowPrivilegeEscalation"] is False, where
            assert own["readOnlyRootFilesystem"] is True, where
            assert own["capabilities"]["drop"] == ["ALL"], where
            assert not own.get("privileged"), where
            assert not own["capabilities"].get("add"), where
            checked += 1
    assert checked == 4


def test_processes_that_read_protobuf_schemas_have_a_writable_tmp() -> None:
    """The consumer and serve compile a topic's .proto schemas with protoc, which reads files: on their read-only
    root file system, /tmp is an emptyDir (without it a Protobuf topic stopped them)."""
    checked = 0
    for where, pod in pods():
        for container in pod["containers"]:
            if container["args"][0] not in ("consume", "serve"):
                continue
            (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == "/tmp"]
            assert not mount.get("readOnly"), where
            (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
            assert "emptyDir" in volume, where
            checked += 1
    assert checked == 2


def test_a_process_without_a_writable_temporary_folder_says_so_when_compiling_a_proto(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """compile_proto where no temporary folder can be written raises OSError naming what to mount (the
    process's fault: not a SchemaError, which would make the records dead letters)."""
    import tempfile

    from schemas.formats import compile_proto

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "absent"))
    with pytest.raises(OSError, match=r"no writable temporary folder to compile a \.proto schema in"):
        compile_proto('syntax = "proto3";\nmessage M { string a = 1; }\n')


def test_gc_deferral_waits_for_the_next_schedule() -> None:
    """Exit 3 (deferred) ends the GC Job (FailJob): no pod is started again at once to read at CL ALL while a
    replica is down. Ignore, which starts another pod without counting this one, applies only to disruptions."""
    (cronjob,) = workloads("CronJob")
    job = cronjob["spec"]["jobTemplate"]["spec"]
    rules = job["podFailurePolicy"]["rules"]

    def action_for_exit(code: int) -> str | None:
        for rule in rules:
            on = rule.get("onExitCodes")
            if on and (code in on["values"]) == (on["operator"] == "In"):
                return str(rule["action"])
        return None

    assert action_for_exit(EXIT_DEFERRED) == "FailJob"
    assert action_for_exit(2) == "FailJob"
    assert action_for_exit(1) is None  # counted against backoffLimit: retried a few times
    assert [r for r in rules if r["action"] == "Ignore" and "onExitCodes" in r] == []
    assert cronjob["spec"]["concurrencyPolicy"] == "Forbid"


def test_long_running_pods_have_a_disruption_budget_and_spread() -> None:
    """Each Deployment has a PodDisruptionBudget selecting its pods, and spreads them across nodes and zones."""
    budgets = workloads("PodDisruptionBudget")
    deployments = workloads("Deployment")
    assert len(deployments) == 2
    for deployment in deployments:
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        name = deployment["metadata"]["name"]
        matching = [b for b in budgets if b["spec"]["selector"]["matchLabels"].items() <= labels.items()]
        assert len(matching) == 1, name
        budget = matching[0]["spec"]
        assert budget.get("maxUnavailable") == 1 or budget.get("minAvailable", 0) >= 1, name
        spread = deployment["spec"]["template"]["spec"]["topologySpreadConstraints"]
        assert {c["topologyKey"] for c in spread} == {"kubernetes.io/hostname", "topology.kubernetes.io/zone"}, name
        assert all(c["labelSelector"]["matchLabels"].items() <= labels.items() for c in spread), name
    (consumer_budget,) = [b for b in budgets if b["metadata"]["name"] == "countersink-consumer"]
    assert consumer_budget["spec"]["maxUnavailable"] == 1  # one member leaves the group at a time


def test_compose_app_profile_creates_the_topics_it_consumes() -> None:
    """compose's app profile creates every topic demo/counters.toml reads before the consumer starts."""
    services = yaml.safe_load((ROOT / "compose.yaml").read_text())["services"]
    topics = services["topics"]
    assert topics["profiles"] == ["app"]
    script = " ".join(topics["command"])
    assert "--create" in script
    assert "--if-not-exists" in script
    for topic in load_definitions(ROOT / "demo" / "counters.toml").topics:
        assert re.search(rf"\b{re.escape(topic)}\b", script), topic
    assert services["consumer"]["depends_on"]["topics"] == {"condition": "service_completed_successfully"}


def pyproject() -> dict[str, Any]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_image_runs_the_python_ci_tests_with_the_pinned_versions() -> None:
    """The image's base is pinned to a patch release of the minor version CI type-checks and tests, and both the
    image and `make venv` install from constraints.txt."""
    dockerfile = (ROOT / "Dockerfile").read_text()
    (version,) = re.findall(r"^ARG PYTHON_VERSION=(\S+)$", dockerfile, re.M)
    assert re.fullmatch(r"\d+\.\d+\.\d+", version), "pin a patch release"
    assert version.rsplit(".", 1)[0] == pyproject()["tool"]["mypy"]["python_version"]
    bases = re.findall(r"^FROM (\S+)", dockerfile, re.M)
    assert bases
    assert all(b.startswith("python:${PYTHON_VERSION}-slim-") for b in bases)
    installs = [i for i in instructions() if i[0] == "RUN" and re.search(r"pip (?:wheel|install)", i[1])]
    assert len(installs) == 3
    # every dependency at its pin: the dependency wheels and the install; countersink's own wheel takes none
    assert ["-c " in line for _, line in installs] == [True, False, True]
    assert "--no-deps" in installs[1][1]
    makefile = (ROOT / "Makefile").read_text()
    assert "pip install --quiet -c constraints.txt -e '.[dev]'" in makefile


def instructions() -> list[tuple[str, str]]:
    """The Dockerfile's instructions, (keyword, arguments), continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n", " ", "\n".join(line for line in (ROOT / "Dockerfile").read_text().splitlines()
                                         if not line.lstrip().startswith("#")))
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in text.splitlines() if line.strip()]


SOURCES = {"README.md", "LICENSE", "schemas", "countersink", "consumer", "gc_worker"}


def test_dependency_layer_survives_source_edits(tmp_path: Path) -> None:
    """In the build stage, the dependencies' wheels are built by a RUN whose only inputs are pyproject.toml and
    constraints.txt: every file of the source is copied after it, so an edit of the source (or the README)
    reuses the layer and rebuilds only countersink's own wheel. The layer's command, run here, names exactly
    pyproject.toml's dependencies."""
    build_stage = list(itertools.takewhile(lambda i: not (i[0] == "FROM" and " AS " not in i[1]),
                                           instructions()[1:]))
    assert build_stage[0][0] == "FROM"
    assert build_stage[0][1].endswith(" AS build")
    steps = build_stage[1:]
    (dependencies,) = [n for n, (kind, line) in enumerate(steps) if kind == "RUN" and "-r requirements.txt" in line]
    copied_before = {name for kind, line in steps[:dependencies] if kind == "COPY" for name in line.split()[:-1]}
    assert copied_before == {"pyproject.toml", "constraints.txt"}
    copied_after = {name for kind, line in steps[dependencies:] if kind == "COPY" for name in line.split()[:-1]}
    assert copied_after == SOURCES
    packages = {p.rstrip("*") for p in pyproject()["tool"]["setuptools"]["packages"]["find"]["include"]}
    assert packages <= copied_after  # every package the wheel holds is copied in
    # the command writing requirements.txt, run on the real pyproject.toml
    command = steps[dependencies][1].split("&&")[0]
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    subprocess.run(["sh", "-c", command.replace("python ", f"{sys.executable} ", 1)], cwd=tmp_path, check=True)
    assert (tmp_path / "requirements.txt").read_text().splitlines() == pyproject()["project"]["dependencies"]


def test_constraints_pin_every_dependency() -> None:
    """constraints.txt pins every runtime and development dependency to one version its specifier accepts."""
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            requirement = Requirement(line)
            (spec,) = requirement.specifier
            assert spec.operator == "==", line
            pins[requirement.name.lower().replace("_", "-")] = spec.version
    project = pyproject()["project"]
    for line in project["dependencies"] + project["optional-dependencies"]["dev"]:
        requirement = Requirement(line)
        name = requirement.name.lower().replace("_", "-")
        assert name in pins, f"{name} is not pinned"
        assert requirement.specifier.contains(pins[name]), (name, pins[name])


def test_license_file_and_spdx_expression() -> None:
    """pyproject.toml names the license as an SPDX expression, and LICENSE holds that license's text."""
    assert pyproject()["project"]["license"] == "Apache-2.0"
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text.split("\n\n")[0]
    assert "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text


def exposed_names() -> set[str]:
    """Every sample name a fresh registry can expose, labelled families included."""
    names = set()
    for line in generate_latest(Metrics().registry).decode().splitlines():
        if line.startswith("# TYPE "):
            _, _, family, kind = line.split()
            # some prometheus_client versions name a counter's family with its _total suffix, some without
            family = family.removesuffix("_total") if kind == "counter" else family
            suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"],
                        "gauge": [""]}[kind]
            names |= {family + s for s in suffixes}
    return names


def dashboard_metrics() -> set[str]:
    dashboard = json.loads((ROOT / "deploy" / "grafana" / "countersink.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    return set(re.findall(r"\b(?:countersink|process|python)_[a-z_]+", " ".join(exprs)))


def alert_rules() -> list[dict[str, Any]]:
    groups = yaml.safe_load((ROOT / "deploy" / "prometheus" / "alerts.yaml").read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


def test_alert_rules_use_real_metrics_and_watch_gc() -> None:
    """The example alert rules query only exported metrics, and one fires when GC has not completed."""
    rules = alert_rules()
    used = set(re.findall(r"\bcountersink_[a-z_]+", " ".join(r["expr"] for r in rules)))
    assert sorted(used - exposed_names()) == []
    assert all({"alert", "expr", "for", "labels", "annotations"} <= set(r) for r in rules)
    (gc,) = [r for r in rules if "countersink_gc_last_complete_age_seconds" in r["expr"]]
    assert gc["alert"] == "CountersinkGcNotCompleted"
    assert "countersink_partition_flush_age_seconds" in used


def test_dashboard_uses_only_real_metrics() -> None:
    """The Grafana dashboard queries only metrics the processes export."""
    used = dashboard_metrics()
    assert len(used) >= 20
    assert sorted(used - exposed_names()) == []
    assert {"countersink_gc_last_complete_age_seconds", "countersink_partition_flush_age_seconds"} <= used
    assert "countersink_events_applied" not in exposed_names()  # counters only exist with their suffix


def test_every_extra_installs_at_the_pinned_versions() -> None:
    """`make bench` installs the bench extra into .venv beside countersink: an extra whose requirements exclude a
    version constraints.txt pins would replace it there (Quix Streams once brought older pydantic releases), and
    every later target would run on versions no test chose. pip's resolver, asked for a dry run, must find every
    extra compatible with the pins (PyPI, as `make venv` reaches it)."""
    extras = ",".join(pyproject()["project"]["optional-dependencies"])
    result = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--disable-pip-version-check",
         "-c", "constraints.txt", f".[{extras}]"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]


def test_quix_streams_runs_from_an_environment_of_its_own() -> None:
    """The bench's Quix Streams is pinned in bench/quix-requirements.txt and installed into .venv-quix, which the
    bench's Quix run is pointed at; the bench extra holds none of it."""
    makefile = (ROOT / "Makefile").read_text()
    requirements = (ROOT / "bench" / "quix-requirements.txt").read_text()
    assert re.search(r"^quixstreams==\d", requirements, re.M)
    assert not any("quixstreams" in r for r in pyproject()["project"]["optional-dependencies"]["bench"])
    assert "$(QUIX_VENV)/bin/python -m pip install --quiet -r bench/quix-requirements.txt" in makefile
    assert re.search(r"^bench: .*\$\(QUIX_STAMP\)", makefile, re.M)
    assert "--quix-python $(QUIX_VENV)/bin/python" in makefile
