"""The deployment files (compose, Kubernetes, Grafana) agree with the code: every command parses with the real
command line, every COUNTERSINK_* variable is a real setting, every metric on the dashboard exists, probes
point at the ports the processes listen on."""

from __future__ import annotations

import argparse
import importlib
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import generate_latest

from countersink.cli import SUBCOMMANDS
from countersink.metrics import Metrics
from countersink.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
KUBERNETES = ROOT / "deploy" / "kubernetes"
DEFAULT_PORTS = {"consume": Settings().consumer.health_port, "gc": Settings().gc.health_port,
                 "serve": Settings().serve.port}


def documents() -> list[tuple[str, dict[str, Any]]]:
    found = [("compose.yaml", yaml.safe_load((ROOT / "compose.yaml").read_text()))]
    for path in sorted(KUBERNETES.glob("*.yaml")):
        found += [(path.name, doc) for doc in yaml.safe_load_all(path.read_text()) if doc]
    return found


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
    names: set[str] = set()
    for _, doc in documents():
        names |= set(re.findall(r"COUNTERSINK_[A-Z0-9_]+", json.dumps(doc)))
    assert len(names) > 10
    unknown = sorted(n for n in names if not _setting_exists(n))
    assert unknown == []


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
    resources = yaml.safe_load((KUBERNETES / "kustomization.yaml").read_text())["resources"]
    assert all((KUBERNETES / r).is_file() for r in resources)
    assert not [r for r in resources if "secret" in r]
    assert {p.name for p in KUBERNETES.glob("*.yaml")} - set(resources) == {"kustomization.yaml",
                                                                           "secret.example.yaml"}


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
    return set(re.findall(r"\bcountersink_[a-z_]+", " ".join(exprs)))


def test_dashboard_uses_only_real_metrics() -> None:
    """The Grafana dashboard queries only metrics the processes export."""
    used = dashboard_metrics()
    assert len(used) >= 20
    assert sorted(used - exposed_names()) == []
    assert "countersink_events_applied" not in exposed_names()  # counters only exist with their suffix
