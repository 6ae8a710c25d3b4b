"""The Helm chart renders clean: `helm lint --strict` and kubeconform -strict for the defaults and
every ci/*-values.yaml, the objects each set of values makes, standard labels and name
overrides, values.schema.json, documented values, NOTES.txt, and the tools' installers.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from chart_support import (
    ALL_FEATURES,
    CHART,
    CI_VALUES,
    REPO,
    SCHEMAS,
    STANDARD_LABELS,
    config_map,
    container,
    dashboard_config_map,
    kinds,
    one,
    render,
    render_text,
    run,
    template_args,
    tool,
    workload,
)


def _values_id(path: Path | None) -> str:
    return "defaults" if path is None else path.name.removesuffix("-values.yaml")


VALUE_SETS = [None, *CI_VALUES]


@pytest.mark.parametrize("values", VALUE_SETS, ids=_values_id)
def test_chart_lints_clean(helm: str, values: Path | None) -> None:
    """`helm lint --strict` passes with the defaults and with each ci/*-values.yaml."""
    args = [helm, "lint", "--strict", str(CHART)] + (["--values", str(values)] if values else [])
    result = run(args)
    assert result.returncode == 0, result.stdout + result.stderr


def kubeconform(manifests: str, kube_version: str) -> tuple[int, dict[str, Any]]:
    """kubeconform -strict over the manifests: (exit code, JSON report) with the local schemas."""
    result = run(
        [
            tool("kubeconform"),
            "-strict",
            "-summary",
            "-output",
            "json",
            "-kubernetes-version",
            kube_version.removeprefix("v"),
            "-schema-location",
            str(SCHEMAS / "kubernetes")
            + "/{{ .NormalizedKubernetesVersion }}-local{{ .StrictSuffix }}"
            + "/{{ .ResourceKind }}{{ .KindSuffix }}.json",
            "-schema-location",
            str(SCHEMAS / "crds") + "/{{ .Group }}/{{ .ResourceKind }}_{{ .ResourceAPIVersion }}.json",
            "-",
        ],
        stdin=manifests,
    )
    return result.returncode, json.loads(result.stdout)


@pytest.mark.parametrize("values", VALUE_SETS, ids=_values_id)
def test_rendered_manifests_pass_kubeconform_strict(
    helm: str, kube_version: str, values: Path | None
) -> None:
    """Every rendered object validates against the Kubernetes/CRD schemas; none is skipped."""
    text = render_text(helm, [values] if values else [])
    count = sum(1 for doc in yaml.safe_load_all(text) if doc)
    returncode, report = kubeconform(text, kube_version)
    assert returncode == 0, json.dumps(report["resources"], indent=1)
    assert report["summary"] == {"valid": count, "invalid": 0, "errors": 0, "skipped": 0}


@pytest.mark.parametrize(
    ("line", "kind"),
    [
        ("      serviceAccountName: t-logstream\n", "Deployment"),
        ("  pollingInterval: 30\n", "ScaledObject"),
        ("      scrapeTimeout: 10s\n", "ServiceMonitor"),
        ("          for: 10m\n", "PrometheusRule"),
    ],
)
def test_kubeconform_rejects_an_unknown_field(helm: str, kube_version: str, line: str, kind: str) -> None:
    """Validation is strict for core kinds and CRDs alike: a misspelt field fails it."""
    values = ["keda-values.yaml", "servicemonitor-values.yaml", "prometheusrule-values.yaml"]
    text = render_text(helm, [CHART / "ci" / name for name in values])
    typo = line.replace(":", "x:", 1)  # the same key with one letter more, at the same place
    assert line in text
    returncode, report = kubeconform(text.replace(line, line + typo, 1), kube_version)
    assert returncode == 1
    invalid = [r for r in report["resources"] if r["status"] == "statusInvalid"]
    assert [r["kind"] for r in invalid] == [kind]
    assert typo.split(":")[0].strip() in invalid[0]["msg"]


def test_defaults_render_only_the_core_objects(helm: str) -> None:
    """Defaults: Deployment, ConfigMap, metrics Service, ServiceAccount, PDB; nothing optional."""
    objects = render(helm)
    assert kinds(objects) == {
        "Deployment",
        "ConfigMap",
        "Service",
        "ServiceAccount",
        "PodDisruptionBudget",
    }


def test_all_features_render_every_optional_object(helm: str) -> None:
    """all-features: GPU, KEDA + auth, ServiceMonitor, PrometheusRule, Grafana dashboard, PDB,
    existing Secret, init-container model, outbox on a claim (StatefulSet)."""
    objects = render(helm, [ALL_FEATURES])
    optional = {"ScaledObject", "TriggerAuthentication", "ServiceMonitor", "PrometheusRule", "ConfigMap"}
    assert optional | {"PodDisruptionBudget", "StatefulSet"} <= kinds(objects)
    assert "HorizontalPodAutoscaler" not in kinds(objects)
    assert "Deployment" not in kinds(objects)
    assert "Secret" not in kinds(objects)  # the existing one is referenced, not made
    pod = one(objects, "StatefulSet")["spec"]["template"]["spec"]
    assert container(objects)["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert [c["name"] for c in pod["initContainers"]] == ["model"]
    assert {"secretRef": {"name": "logstream-credentials"}} in container(objects)["envFrom"]
    assert dashboard_config_map(objects)["metadata"]["name"] == "t-detector-dashboard"


def test_every_object_carries_the_standard_labels(helm: str) -> None:
    """app.kubernetes.io/* and helm.sh/chart on every object and on the pod template."""
    objects = render(helm, [ALL_FEATURES])
    labelled = [*objects, workload(objects)["spec"]["template"]]
    for obj in labelled:
        labels = obj["metadata"]["labels"]
        assert all(key in labels for key in STANDARD_LABELS), obj["metadata"]
        assert labels["app.kubernetes.io/instance"] == "t"


def test_name_overrides_apply_to_every_object(helm: str) -> None:
    """fullnameOverride names every object; nameOverride sets app.kubernetes.io/name."""
    objects = render(helm, [ALL_FEATURES], ["fullnameOverride=ls"])
    assert {obj["metadata"]["name"] for obj in objects} == {"ls", "ls-dashboard"}
    named = render(helm, sets=["nameOverride=detector"])  # defaults: no dashboard
    assert {obj["metadata"]["name"] for obj in named} == {"t-detector"}
    assert {obj["metadata"]["labels"]["app.kubernetes.io/name"] for obj in named} == {"detector"}


@pytest.mark.parametrize(
    ("setting", "field"),
    [
        ("replicaCount=two", "replicaCount"),
        ("gpu.enabledd=true", "enabledd"),
        ("keda.lagThreshold=lots", "lagThreshold"),
        ("model.source=s3", "source"),
        ("config.serve.incidents.k=0", "incidents/k"),
        ("config.serve.incidents.retention=forever", "incidents/retention"),
    ],
)
def test_bad_values_fail_at_render_time(helm: str, setting: str, field: str) -> None:
    """values.schema.json rejects wrong types, unknown keys and unknown choices."""
    result = run(template_args(helm, [], [setting]))
    assert result.returncode != 0
    assert field in result.stderr


def _value_keys() -> Iterator[tuple[int, str, list[str]]]:
    """(line number, key, comment block above it) for each key line of values.yaml."""
    lines = (CHART / "values.yaml").read_text(encoding="utf-8").splitlines()
    for number, line in enumerate(lines, start=1):
        match = re.match(r"^(\s*)([A-Za-z][\w.-]*):", line)
        if not match:
            continue
        comments = []
        for previous in reversed(lines[: number - 1]):
            if not previous.strip().startswith("#"):
                break
            comments.insert(0, previous.strip())
        yield number, match.group(1) + match.group(2), comments


def test_every_values_key_is_documented() -> None:
    """Each key of values.yaml has a comment above it, except inside a documented (`# --`) value."""
    undocumented = []
    documented_indent: int | None = None  # indent of the enclosing `# --` value, if any
    for number, key, comments in _value_keys():
        indent = len(key) - len(key.lstrip())
        if documented_indent is not None and indent > documented_indent:
            continue
        documented_indent = None
        if not comments:
            undocumented.append(f"values.yaml:{number}: {key.strip()}")
        elif comments[0].startswith("# --"):
            documented_indent = indent
    assert undocumented == []


def _switches(values: dict[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(dotted path, value) of every `enabled` key, at any depth."""
    for key, value in values.items():
        if isinstance(value, dict):
            if "enabled" in value:
                yield prefix + key, value["enabled"]
            yield from _switches(value, f"{prefix}{key}.")


def test_every_optional_feature_has_a_ci_values_file() -> None:
    """Each `enabled:` switch of values.yaml (at any depth) is turned on by some ci/*-values.yaml."""
    defaults = yaml.safe_load((CHART / "values.yaml").read_text(encoding="utf-8"))
    switches = {path for path, _ in _switches(defaults)}
    enabled_by_ci = set()
    for path in CI_VALUES:
        values = yaml.safe_load(path.read_text(encoding="utf-8"))
        enabled_by_ci |= {switch for switch, enabled in _switches(values) if enabled is True}
    expected = {"gpu", "keda", "keda.authentication", "autoscaling", "serviceMonitor", "prometheusRule"}
    expected |= {"grafanaDashboard", "networkPolicy"}
    assert expected | {"podDisruptionBudget", "state.persistence"} <= switches
    assert switches == enabled_by_ci & switches


def render_notes(helm: str, tmp_path: Path, sets: list[str] | None = None) -> str:
    """NOTES.txt as `helm install` would print it.

    `helm template` never renders NOTES.txt and `helm install --dry-run` needs a cluster, so this
    renders it through the real template engine (`tpl`) from a copy of the chart.
    """
    chart = tmp_path / "logstream"
    shutil.copytree(CHART, chart)
    shutil.copy(chart / "templates" / "NOTES.txt", chart / "files" / "NOTES.txt")
    (chart / "templates" / "notes-under-test.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: notes\n"
        'data:\n  notes: {{ tpl (.Files.Get "files/NOTES.txt") . | quote }}\n',
        encoding="utf-8",
    )
    args = template_args(helm, [], sets or [], chart)
    result = run([*args, "--show-only", "templates/notes-under-test.yaml"])
    assert result.returncode == 0, result.stderr
    return yaml.safe_load(result.stdout)["data"]["notes"]


def test_notes_name_the_group_the_model_claim_and_the_needed_secrets(helm: str, tmp_path: Path) -> None:
    """NOTES.txt tells the user the consumer group, the model PVC and the Secret keys needed."""
    sets = ["config.serve.kafka.group_id=detectors", "config.serve.sink.kind=alerts"]
    notes = render_notes(helm, tmp_path, sets)
    assert 'consumer group "detectors"' in notes
    assert 'PersistentVolumeClaim "t-logstream-model"' in notes
    routes = config_map(render(helm))["data"]["alerts.yaml"]
    env_refs = re.findall(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", routes)
    assert env_refs  # the default routes do need secrets
    for name in env_refs:
        assert f"  {name}  (environment variable)" in notes


@pytest.mark.parametrize(
    ("brokers", "warned"),
    [("127.0.0.1:9092", True), ("kafka:9092\\,localhost:9093", True), ("kafka-0.kafka:9092", False)],
)
def test_notes_warn_when_kafka_is_the_pod_itself(
    helm: str, tmp_path: Path, brokers: str, warned: bool
) -> None:
    """A loopback bootstrap server (the local default of configs/serve.yaml) gets a warning."""
    notes = render_notes(helm, tmp_path, [f"config.serve.kafka.bootstrap_servers={brokers}"])
    assert ("WARNING: kafka.bootstrap_servers points at the pod itself" in notes) is warned


def test_notes_say_when_anomalies_do_not_reach_on_call(helm: str, tmp_path: Path) -> None:
    """With the jsonl sink (configs/serve.yaml's default) NOTES say how to route to on-call."""
    notes = render_notes(helm, tmp_path)
    assert "set config.serve.sink.kind=alerts" in notes
    assert "(environment variable)" not in notes


def test_tool_install_is_idempotent(helm: str, kube_version: str) -> None:
    """A second .ci/helm-tools.sh run finds every pinned piece in place and installs nothing."""
    result = run(["bash", str(REPO / ".ci" / "helm-tools.sh")])
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 1 and lines[0].startswith("helm-tools: ready:"), result.stdout


def test_promtool_install_is_idempotent(promtool: str) -> None:
    """A second .ci/promtool.sh run finds promtool in place and downloads nothing."""
    result = run(["bash", str(REPO / ".ci" / "promtool.sh")])
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 1 and lines[0].startswith("promtool: ready: promtool, version"), result.stdout
