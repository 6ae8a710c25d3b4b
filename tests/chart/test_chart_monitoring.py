"""What the chart gives on-call: the PrometheusRule (checked and unit-tested with promtool on a
scenario per alert, reading only metrics serve exports) and the Grafana dashboard.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from chart_support import (
    CHART,
    dashboard_config_map,
    one,
    render,
    run,
    template_args,
)

RULE_VALUES = CHART / "ci" / "prometheusrule-values.yaml"


SERIES = 'job="t-logstream",namespace="obs"'  # the default selector for release t in namespace obs


def rule_groups(helm: str, values: list[Path] | None = None, sets: list[str] | None = None) -> dict[str, Any]:
    """The PrometheusRule's spec: a Prometheus rule file (`groups: [...]`)."""
    return one(render(helm, values or [RULE_VALUES], sets), "PrometheusRule")["spec"]


def alerts_of(groups: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {rule["alert"]: rule for group in groups["groups"] for rule in group["rules"]}


def test_prometheus_rule_passes_promtool_check(helm: str, promtool: str, tmp_path: Path) -> None:
    """`promtool check rules` accepts the rendered rules (PromQL parses, durations are valid)."""
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump(rule_groups(helm)), encoding="utf-8")
    result = run([promtool, "check", "rules", str(rules)])
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 6 rules found" in result.stdout


def test_promtool_check_rejects_a_broken_expression(helm: str, promtool: str, tmp_path: Path) -> None:
    """The promtool check can fail: an expression with a PromQL syntax error is refused."""
    groups = rule_groups(helm)
    groups["groups"][0]["rules"][0]["expr"] += " and ("
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump(groups), encoding="utf-8")
    result = run([promtool, "check", "rules", str(rules)])
    assert result.returncode != 0
    assert "parse error" in result.stdout + result.stderr


def _exposed_metric_names() -> set[str]:
    """Series names that the serve process exports (its modules' metrics in the default registry)."""
    import prometheus_client

    import logstream.serve  # noqa: F401  (registers every metric serve exports)

    names = set()
    for family in prometheus_client.REGISTRY.collect():
        suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"]}.get(family.type, [""])
        names |= {family.name + suffix for suffix in suffixes}
    return names


def test_prometheus_rule_reads_metrics_that_serve_exports(helm: str) -> None:
    """Every logstream_* series an alert reads is a metric the code registers (a name it does not
    register would never fire)."""
    exprs = " ".join(rule["expr"] for rule in alerts_of(rule_groups(helm)).values())
    used = set(re.findall(r"\b(logstream_[a-z_]+)\{", exprs))
    assert len(used) == 7
    assert used <= _exposed_metric_names()


def test_prometheus_rule_can_leave_out_an_alert_and_scope_its_series(helm: str) -> None:
    """prometheusRule.disabled drops an alert; prometheusRule.selector replaces the job/namespace one."""
    sets = ["prometheusRule.disabled.LogstreamBadRecords=true", 'prometheusRule.selector=cluster="eu"']
    alerts = alerts_of(rule_groups(helm, sets=sets))
    assert "LogstreamBadRecords" not in alerts and len(alerts) == 5
    assert all('{cluster="eu"' in rule["expr"] and "job=" not in rule["expr"] for rule in alerts.values())


def test_unknown_alert_name_in_disabled_fails(helm: str) -> None:
    """values.schema.json refuses a misspelt alert name under prometheusRule.disabled."""
    result = run(template_args(helm, [RULE_VALUES], ["prometheusRule.disabled.LogstreamNoLines=true"]))
    assert result.returncode != 0
    assert "LogstreamNoLines" in result.stderr


def _series(values: str | list[int]) -> str:
    return values if isinstance(values, str) else " ".join(str(v) for v in values)


# alert -> (input series when it must fire, when all is well, labels of the firing alert). One
# sample a minute for 60 minutes; `for:` durations are those of ci/prometheusrule-values.yaml.
SCENARIOS: dict[str, tuple[dict[str, str], dict[str, str], dict[str, str]]] = {
    "LogstreamNoLinesScored": (
        {
            f'logstream_lines_total{{{SERIES},instance="p0"}}': "500+0x60",  # flat: nothing scored
            f'logstream_assigned_partitions{{{SERIES},instance="p0"}}': "2x60",
        },
        {
            f'logstream_lines_total{{{SERIES},instance="p0"}}': "0+600x60",
            f'logstream_assigned_partitions{{{SERIES},instance="p0"}}': "2x60",
        },
        {"job": "t-logstream", "namespace": "obs", "instance": "p0"},
    ),
    "LogstreamConsumerLagGrowing": (
        {
            f'logstream_consumer_lag{{{SERIES},instance="p0",topic="logs",partition="0"}}': "0+300x60",
            f'logstream_consumer_lag{{{SERIES},instance="p1",topic="logs",partition="1"}}': "0+300x60",
        },
        {
            f'logstream_consumer_lag{{{SERIES},instance="p0",topic="logs",partition="0"}}': "40x60",
            f'logstream_consumer_lag{{{SERIES},instance="p1",topic="logs",partition="1"}}': "9000-150x60",
        },
        {"namespace": "obs", "topic": "logs"},
    ),
    "LogstreamOutboxPending": (
        {f'logstream_alerts_outbox_pending{{{SERIES},instance="p0"}}': "3x60"},
        # alerts come and go: pending for a minute, then delivered
        {
            f'logstream_alerts_outbox_pending{{{SERIES},instance="p0"}}': _series(
                [3 if i % 5 == 0 else 0 for i in range(61)]
            )
        },
        {"job": "t-logstream", "namespace": "obs", "instance": "p0"},
    ),
    "LogstreamAlertsDeadLettered": (
        {
            f'logstream_alerts_sent_total{{{SERIES},instance="p0",channel="webhook",outcome="dead"}}': "0x40 1x20",
            f'logstream_alerts_sent_total{{{SERIES},instance="p0",channel="webhook",outcome="delivered"}}': "0+1x60",
        },
        {
            f'logstream_alerts_sent_total{{{SERIES},instance="p0",channel="webhook",outcome="dead"}}': "0x60",
            f'logstream_alerts_sent_total{{{SERIES},instance="p0",channel="webhook",outcome="delivered"}}': "0+1x60",
        },
        {"namespace": "obs", "channel": "webhook"},
    ),
    "LogstreamDeliveryWorkerDown": (
        {f'logstream_delivery_worker_up{{{SERIES},instance="p0"}}': "1x50 0x10"},
        # one short restart after an error is not an outage
        {f'logstream_delivery_worker_up{{{SERIES},instance="p0"}}': "1x55 0 1x4"},
        {"job": "t-logstream", "namespace": "obs", "instance": "p0"},
    ),
    "LogstreamBadRecords": (
        {f'logstream_bad_records_total{{{SERIES},instance="p0",kind="bad_json"}}': "0+4x60"},
        # one poison message: counted, but not a sustained problem
        {f'logstream_bad_records_total{{{SERIES},instance="p0",kind="bad_json"}}': "0x10 1x50"},
        {"namespace": "obs", "kind": "bad_json"},
    ),
}


def promtool_test(
    promtool: str,
    tmp_path: Path,
    groups: dict[str, Any],
    series: dict[str, str],
    firing: str | None,
    labels: dict[str, str],
) -> subprocess.CompletedProcess[str]:
    """`promtool test rules`: at minute 60, exactly `firing` (or no alert) is active."""
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(groups), encoding="utf-8")
    alerts = alerts_of(groups)
    checks = []
    for name, rule in alerts.items():
        expected = []
        if name == firing:
            expected = [{"exp_labels": {**labels, **rule["labels"]}, "exp_annotations": rule["annotations"]}]
        checks.append({"eval_time": "60m", "alertname": name, "exp_alerts": expected})
    unit = {
        "rule_files": ["rules.yaml"],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [{"series": name, "values": values} for name, values in series.items()],
                "alert_rule_test": checks,
            }
        ],
    }
    (tmp_path / "unit.yaml").write_text(yaml.safe_dump(unit), encoding="utf-8")
    return run([promtool, "test", "rules", str(tmp_path / "unit.yaml")])


def test_every_alert_has_a_scenario(helm: str) -> None:
    """The rule's alerts are exactly the scenarios below: a new alert must come with its test."""
    assert set(alerts_of(rule_groups(helm))) == set(SCENARIOS)


@pytest.mark.parametrize("alert", list(SCENARIOS))
def test_alert_fires_on_its_failure_and_no_other_does(
    helm: str, promtool: str, tmp_path: Path, alert: str
) -> None:
    """`promtool test rules`: the failure's series make this alert (and only it) fire, with its
    severity, the chart's alertLabels and the labels that locate the problem."""
    failing, _, labels = SCENARIOS[alert]
    result = promtool_test(promtool, tmp_path, rule_groups(helm), failing, alert, labels)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("alert", list(SCENARIOS))
def test_alert_stays_quiet_when_all_is_well(helm: str, promtool: str, tmp_path: Path, alert: str) -> None:
    """`promtool test rules`: the healthy variant of each scenario fires no alert at all."""
    _, healthy, _ = SCENARIOS[alert]
    result = promtool_test(promtool, tmp_path, rule_groups(helm), healthy, None, {})
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_test_catches_a_missing_alert(helm: str, promtool: str, tmp_path: Path) -> None:
    """The scenario check can fail: the healthy series do not satisfy a 'must fire' expectation."""
    _, healthy, labels = SCENARIOS["LogstreamDeliveryWorkerDown"]
    result = promtool_test(
        promtool, tmp_path, rule_groups(helm), healthy, "LogstreamDeliveryWorkerDown", labels
    )
    assert result.returncode != 0
    assert "LogstreamDeliveryWorkerDown" in result.stdout + result.stderr


# --- Grafana dashboard (templates/grafana-dashboard.yaml, files/grafana-dashboard.json) ---------
DASHBOARD_VALUES = CHART / "ci" / "grafana-dashboard-values.yaml"


DASHBOARD_PANELS = {
    "Lines scored per second",
    "Anomalies by severity",
    "Line score distribution vs threshold",
    "Consumer lag",
    "Alert outbox pending",
    "Alert delivery outcomes",
    "KV cache bytes",
    "Active streams",
}


# Grafana's own variables, as a query of the dashboard would see them, so that promtool reads it.
GRAFANA_VARIABLES = {"$__rate_interval": "5m", "$job": ".*", "$namespace": ".*"}


def rendered_dashboard(helm: str, sets: list[str] | None = None) -> dict[str, Any]:
    return json.loads(dashboard_config_map(render(helm, [DASHBOARD_VALUES], sets))["data"]["logstream.json"])


def dashboard_exprs(dashboard: dict[str, Any]) -> list[str]:
    """Every PromQL expression of the dashboard: panel targets and variable queries."""
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    for variable in dashboard["templating"]["list"]:
        query = variable.get("query")
        if isinstance(query, dict):
            exprs.append(re.sub(r"^label_values\((.*), \w+\)$", r"\1", query["query"]))
    return exprs


def test_dashboard_config_map_carries_the_sidecar_label(helm: str) -> None:
    """grafanaDashboard.enabled: a ConfigMap labelled grafana_dashboard="1" (the sidecar's
    convention), in the chosen namespace, with the folder annotation; off by default."""
    assert not [o for o in render(helm) if "logstream.json" in o.get("data", {})]
    found = dashboard_config_map(render(helm, [DASHBOARD_VALUES]))
    assert found["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert found["metadata"]["namespace"] == "monitoring"
    assert found["metadata"]["annotations"] == {"grafana_folder": "Logs"}
    relabelled = dashboard_config_map(
        render(
            helm,
            [DASHBOARD_VALUES],
            ["grafanaDashboard.label=dashboards", "grafanaDashboard.labelValue=logs"],
        )
    )
    assert relabelled["metadata"]["labels"]["dashboards"] == "logs"


def test_dashboard_has_the_panels_on_call_needs(helm: str) -> None:
    """Lines/s, anomalies by severity, scores vs threshold, lag, outbox, deliveries, cache, streams;
    every panel queries the chosen data source and has a unique id."""
    dashboard = rendered_dashboard(helm)
    titles = {panel["title"] for panel in dashboard["panels"]}
    assert titles >= DASHBOARD_PANELS
    assert len({panel["id"] for panel in dashboard["panels"]}) == len(dashboard["panels"])
    assert all(panel["datasource"]["uid"] == "${datasource}" for panel in dashboard["panels"])
    (threshold,) = [p for p in dashboard["panels"] if p["title"] == "Line score distribution vs threshold"]
    assert any("logstream_threshold" in t["expr"] for t in threshold["targets"])


def test_every_metric_the_dashboard_queries_is_exported(helm: str) -> None:
    """Each logstream_* series in the dashboard's expressions is one serve registers, and the
    dashboard uses the score histogram, threshold, active streams, build info and latency."""
    used = set(re.findall(r"\b(logstream_[a-z_]+)\b", " ".join(dashboard_exprs(rendered_dashboard(helm)))))
    exported = _exposed_metric_names()
    assert used - exported == set()
    new = {
        "logstream_line_score_bucket",
        "logstream_threshold",
        "logstream_active_streams",
        "logstream_build_info",
        "logstream_alert_notification_latency_seconds_bucket",
    }
    assert new <= used


def test_dashboard_queries_parse_with_promtool(helm: str, promtool: str, tmp_path: Path) -> None:
    """Every dashboard expression is valid PromQL (checked by promtool as recording rules)."""
    exprs = dashboard_exprs(rendered_dashboard(helm))
    for variable, value in GRAFANA_VARIABLES.items():
        exprs = [e.replace(variable, value) for e in exprs]
    assert not [e for e in exprs if "$" in e], "an unknown Grafana variable"
    rules = {
        "groups": [
            {
                "name": "dashboard",
                "rules": [{"record": f"dashboard:q{i}", "expr": e} for i, e in enumerate(exprs)],
            }
        ]
    }
    path = tmp_path / "dashboard-rules.yaml"
    path.write_text(yaml.safe_dump(rules), encoding="utf-8")
    result = run([promtool, "check", "rules", str(path)])
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"{len(exprs)} rules found" in result.stdout
