"""deploy/prometheus checked by Prometheus's own promtool: the rules and the example configuration load, and
`promtool test rules` runs every rule on simulated series (deploy/prometheus/alerts_test.yaml): a dead consumer
group and a stuck GC fire the rules that must fire, a healthy deployment fires none.

promtool is built by tests/gotools.py (``go install`` through the Go module proxy, cached in .tools/); when it
cannot be installed these tests fail, they are never skipped."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests import gotools

PROMETHEUS = Path(__file__).resolve().parents[2] / "deploy" / "prometheus"


@pytest.fixture(scope="module")
def promtool() -> Path:
    return gotools.go_tool("promtool")


def run(promtool: Path, *args: str, cwd: Path = PROMETHEUS) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(promtool), *args], cwd=cwd, capture_output=True, text=True, check=False, timeout=300)


def rules() -> list[dict[str, Any]]:
    groups = yaml.safe_load((PROMETHEUS / "alerts.yaml").read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


def rule_tests() -> list[dict[str, Any]]:
    return yaml.safe_load((PROMETHEUS / "alerts_test.yaml").read_text())["tests"]  # type: ignore[no-any-return]


def test_rules_and_configuration_load(promtool: Path) -> None:
    """promtool checks the rules (and lints them) and the example configuration that loads them."""
    checked = run(promtool, "check", "rules", "--lint-fatal", "alerts.yaml")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(rules())} rules found" in checked.stdout
    config = run(promtool, "check", "config", "--lint-fatal", "prometheus.yaml")
    assert config.returncode == 0, config.stdout + config.stderr
    assert "SUCCESS: prometheus.yaml is valid" in config.stdout


def test_rules_fire_on_a_dead_group_and_a_stuck_gc_and_not_when_healthy(promtool: Path) -> None:
    """`promtool test rules`: every expected alert fires with its labels and annotations, at its time."""
    tested = run(promtool, "test", "rules", "alerts_test.yaml")
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "SUCCESS" in tested.stdout


def test_every_rule_is_tested_both_ways() -> None:
    """The healthy case lists every rule with nothing firing, and each rule fires in some other case: a new
    rule cannot go untested, and none can fire on a healthy deployment."""
    names = [rule["alert"] for rule in rules()]
    assert len(names) == len(set(names))
    (healthy,) = [t for t in rule_tests() if t["name"] == "healthy"]
    assert sorted(c["alertname"] for c in healthy["alert_rule_test"] if c["exp_alerts"] == []) == sorted(names)
    fired = {c["alertname"] for t in rule_tests() for c in t["alert_rule_test"] if c["exp_alerts"]}
    # two rules on countersink's own series are exercised by the healthy case and shown silent in the dead-group
    # case (a dead group silences them); the flush age's also fires in a case of its own, at the minute it says
    assert fired == set(names) - {"CountersinkGcNotCompleted", "CountersinkPartitionsStopped"}
    # consumers and the GC each have an absent()-style rule, and the GC's read nothing countersink exports
    absent = {rule["alert"] for rule in rules() if "absent(" in rule["expr"] or " unless " in rule["expr"]}
    assert {"CountersinkConsumersDown", "CountersinkGcCronJobAbsent", "CountersinkGcNeverSucceeded"} <= absent
    for rule in rules():
        if rule["alert"].startswith("CountersinkGc") and rule["alert"] != "CountersinkGcNotCompleted":
            assert "countersink_" not in rule["expr"], rule["alert"]


def test_the_rule_tests_can_fail(promtool: Path, tmp_path: Path) -> None:
    """Without the absent() rule for the consumers, or with the GC rule on countersink's own series only, the
    same tests fail: they check what the rules say."""
    for broken_rule, replacement in (
            ('absent(up{namespace="countersink", component="consumer"} == 1)',
             'max(up{namespace="countersink", component="consumer"}) < 1'),
            ('time() - max by (namespace, cronjob)\n            (kube_cronjob_status_last_successful_time{namespace='
             '"countersink", cronjob="countersink-gc"}) > 86400',
             'min by (namespace, cronjob) (countersink_gc_last_complete_age_seconds) > 86400')):
        text = (PROMETHEUS / "alerts.yaml").read_text()
        assert broken_rule in text
        (tmp_path / "alerts.yaml").write_text(text.replace(broken_rule, replacement))
        shutil.copy(PROMETHEUS / "alerts_test.yaml", tmp_path)
        tested = run(promtool, "test", "rules", "alerts_test.yaml", cwd=tmp_path)
        assert tested.returncode != 0
        assert "FAILED" in tested.stdout + tested.stderr
