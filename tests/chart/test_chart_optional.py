"""The chart's optional objects: the KEDA ScaledObject (and the HPA it excludes), the
PodDisruptionBudget, the ServiceMonitor, the repartition stage's Deployment, the
NetworkPolicy, and the feedback port with its tokens.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from chart_support import (
    CHART,
    config_map,
    container,
    kinds,
    one,
    render,
    run,
    serve_config,
    template_args,
    workload,
)

from logstream.settings import load_settings


def test_each_pod_is_one_consumer_and_replicas_follow_the_autoscaler(helm: str) -> None:
    """replicaCount sets the replicas; with KEDA or an HPA the Deployment leaves them to it."""
    fixed = one(render(helm, sets=["replicaCount=3"]), "Deployment")
    assert fixed["spec"]["replicas"] == 3
    for values in ("keda-values.yaml", "hpa-values.yaml"):
        scaled = one(render(helm, [CHART / "ci" / values]), "Deployment")
        assert "replicas" not in scaled["spec"], values


def test_keda_trigger_watches_the_serve_consumer_group(helm: str) -> None:
    """The ScaledObject's consumerGroup, brokers and topic are the rendered serve config's."""
    objects = render(
        helm,
        [CHART / "ci" / "keda-values.yaml"],
        [
            "config.serve.kafka.group_id=detectors-eu",
            "config.serve.kafka.bootstrap_servers=b-1:9092\\,b-2:9092",
            'config.serve.kafka.topics=["app-logs"]',
            "keda.extraMetadata.consumerGroup=not-the-app-group",  # cannot override it
        ],
    )
    kafka = serve_config(objects)["kafka"]
    trigger = one(objects, "ScaledObject")["spec"]["triggers"][0]
    assert trigger["type"] == "kafka"
    assert kafka["group_id"] == trigger["metadata"]["consumerGroup"] == "detectors-eu"
    assert kafka["bootstrap_servers"] == trigger["metadata"]["bootstrapServers"] == "b-1:9092,b-2:9092"
    assert kafka["topics"] == [trigger["metadata"]["topic"]] == ["app-logs"]


def test_keda_with_topic_pattern_watches_all_topics_of_the_group(helm: str) -> None:
    """With kafka.topic_pattern (no fixed topic list) the trigger names no topic."""
    objects = render(
        helm,
        [CHART / "ci" / "keda-values.yaml"],
        ["config.serve.kafka.topics=[]", "config.serve.kafka.topic_pattern=logs\\..*"],
    )
    assert serve_config(objects)["kafka"]["topics"] == []
    assert "topic" not in one(objects, "ScaledObject")["spec"]["triggers"][0]["metadata"]


def test_keda_logs_in_like_the_app(helm: str) -> None:
    """SASL_SSL in the serve config gives the trigger sasl + tls and a TriggerAuthentication."""
    objects = render(helm, [CHART / "ci" / "keda-sasl-values.yaml"])
    trigger = one(objects, "ScaledObject")["spec"]["triggers"][0]
    auth = one(objects, "TriggerAuthentication")
    assert trigger["metadata"]["sasl"] == "scram_sha512"
    assert trigger["metadata"]["tls"] == "enable"
    assert trigger["authenticationRef"]["name"] == auth["metadata"]["name"]
    refs = {ref["parameter"]: (ref["name"], ref["key"]) for ref in auth["spec"]["secretTargetRef"]}
    assert refs == {
        "username": ("logstream-kafka", "LOGSTREAM_KAFKA__SASL_USERNAME"),
        "password": ("logstream-kafka", "LOGSTREAM_KAFKA__SASL_PASSWORD"),
    }


def test_keda_and_hpa_together_fail_rendering(helm: str) -> None:
    """Enabling KEDA and the HPA at once is refused with a clear message."""
    result = run(template_args(helm, [], ["keda.enabled=true", "autoscaling.enabled=true"]))
    assert result.returncode != 0
    assert "keda.enabled and autoscaling.enabled are mutually exclusive" in result.stderr


def test_pdb_takes_min_available_or_max_unavailable(helm: str) -> None:
    """The PDB uses minAvailable when set, otherwise maxUnavailable; it can be switched off."""
    assert one(render(helm), "PodDisruptionBudget")["spec"]["maxUnavailable"] == 1
    pdb = one(render(helm, [CHART / "ci" / "pdb-values.yaml"]), "PodDisruptionBudget")
    assert pdb["spec"]["minAvailable"] == 2 and "maxUnavailable" not in pdb["spec"]
    assert "PodDisruptionBudget" not in kinds(render(helm, sets=["podDisruptionBudget.enabled=false"]))


def test_service_monitor_scrapes_metrics_with_additional_labels(helm: str) -> None:
    """The ServiceMonitor selects the metrics Service's port and carries additionalLabels."""
    objects = render(helm, [CHART / "ci" / "servicemonitor-values.yaml"])
    monitor = one(objects, "ServiceMonitor")
    service = one(objects, "Service")
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert monitor["spec"]["endpoints"][0]["port"] == service["spec"]["ports"][0]["name"]
    assert monitor["spec"]["endpoints"][0]["path"] == "/metrics"
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= service["metadata"]["labels"].items()


@pytest.mark.parametrize(
    ("values", "kind"), [("keda-values.yaml", "ScaledObject"), ("hpa-values.yaml", "HorizontalPodAutoscaler")]
)
def test_autoscalers_target_the_statefulset(helm: str, values: str, kind: str) -> None:
    """With state.persistence, KEDA's and the HPA's scaleTargetRef is the StatefulSet."""
    objects = render(helm, [CHART / "ci" / values], ["state.persistence.enabled=true"])
    target = one(objects, kind)["spec"]["scaleTargetRef"]
    sts = one(objects, "StatefulSet")
    assert (target["kind"], target["name"]) == ("StatefulSet", sts["metadata"]["name"])
    assert "replicas" not in sts["spec"]


def _by_component(objects: list[dict[str, Any]], component: str) -> dict[str, Any]:
    matches = [
        obj
        for obj in objects
        if obj["kind"] == "Deployment"
        and obj["metadata"]["labels"]["app.kubernetes.io/component"] == component
    ]
    assert len(matches) == 1, f"expected one {component} Deployment, got {len(matches)}"
    return matches[0]


def test_repartition_stage_runs_in_its_own_deployment(
    helm: str, clean_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """repartition.enabled: a second Deployment runs `serve --role repartition` without the
    model or a GPU, selecting only its own pods; the scorers' config does not run the stage
    in process, validates, and the KEDA trigger watches the repartition topic they consume."""
    objects = render(helm, [CHART / "ci" / "repartition-values.yaml"], ["gpu.enabled=true"])
    stage = _by_component(objects, "repartition")
    scorer = _by_component(objects, "detector")
    pod = stage["spec"]["template"]["spec"]
    [box] = pod["containers"]
    assert box["args"][-2:] == ["--role", "repartition"]
    assert {v["name"] for v in pod["volumes"]} == {"config", "tmp"}
    assert "nvidia.com/gpu" not in json.dumps(pod)
    assert stage["spec"]["replicas"] == 2
    assert stage["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"] == "repartition"
    assert stage["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"] == "repartition"
    assert "--role" not in scorer["spec"]["template"]["spec"]["containers"][0]["args"]
    config = tmp_path / "serve.yaml"
    config.write_text(config_map(objects)["data"]["serve.yaml"], encoding="utf-8")
    settings = load_settings(config)
    assert settings.repartition.topic == "logs-by-stream" and not settings.repartition.in_process
    assert settings.state.changelog_topic == "logstream-changelog"
    assert one(objects, "ScaledObject")["spec"]["triggers"][0]["metadata"]["topic"] == "logs-by-stream"


def test_repartition_without_its_topic_fails_rendering(helm: str) -> None:
    """repartition.enabled without config.serve.repartition.topic fails with the fix named."""
    result = run(template_args(helm, [], ["repartition.enabled=true"]))
    assert result.returncode != 0
    assert "config.serve.repartition.topic" in result.stderr


NETWORK_POLICY = CHART / "ci" / "networkpolicy-values.yaml"


def container_labels(objects: list[dict[str, Any]]) -> dict[str, str]:
    return workload(objects)["spec"]["template"]["metadata"]["labels"]


def test_network_policy_admits_metrics_from_monitoring_and_feedback_from_its_peers(helm: str) -> None:
    """networkPolicy: the pods' ingress is the http port from the monitoring namespace and the
    feedback port from the configured peers only; their egress is left alone."""
    objects = render(helm, [NETWORK_POLICY])
    policy = one(objects, "NetworkPolicy")["spec"]
    assert policy["podSelector"]["matchLabels"].items() <= container_labels(objects).items()
    assert policy["policyTypes"] == ["Ingress"]
    metrics, feedback = policy["ingress"]
    assert metrics["ports"] == [{"port": "http", "protocol": "TCP"}]
    assert metrics["from"] == [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
    ]
    assert feedback["ports"] == [{"port": "feedback", "protocol": "TCP"}]
    assert feedback["from"][0]["podSelector"] == {"matchLabels": {"app": "feedback-bot"}}
    port_names = {p["name"] for p in container(objects)["ports"]}
    assert {"http", "feedback"} == port_names


def test_network_policy_without_feedback_peers_closes_the_feedback_port(helm: str) -> None:
    """No feedback peers: the policy has the metrics rule only, so nothing reaches POST /feedback."""
    objects = render(helm, [NETWORK_POLICY], ["networkPolicy.feedback.from=[]"])
    assert [rule["ports"][0]["port"] for rule in one(objects, "NetworkPolicy")["spec"]["ingress"]] == ["http"]


def test_feedback_has_a_container_and_a_service_port_of_its_own(helm: str) -> None:
    """With a feedback database (the alerts sink's outbox) the container has a `feedback` port
    at the config's feedback.port and the Service a second port to it; the ServiceMonitor
    still scrapes `http` only. Without one (the jsonl sink) there is no feedback port."""
    sets = ["config.serve.sink.kind=alerts", "config.serve.feedback.port=9191", "service.feedbackPort=8181"]
    objects = render(helm, sets=[*sets, "serviceMonitor.enabled=true"])
    assert {"name": "feedback", "containerPort": 9191, "protocol": "TCP"} in container(objects)["ports"]
    ports = {p["name"]: p for p in one(objects, "Service")["spec"]["ports"]}
    assert ports["feedback"]["port"] == 8181 and ports["feedback"]["targetPort"] == "feedback"
    assert [e["port"] for e in one(objects, "ServiceMonitor")["spec"]["endpoints"]] == ["http"]
    plain = render(helm)
    assert [p["name"] for p in container(plain)["ports"]] == ["http"]
    assert [p["name"] for p in one(plain, "Service")["spec"]["ports"]] == ["http"]


def test_feedback_tokens_come_from_the_credentials_secret(
    helm: str, clean_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """feedback.tokensKey: serve's feedback.tokens_file is that key of the mounted credentials
    Secret, and the rendered config validates."""
    objects = render(helm, [NETWORK_POLICY])
    mount = next(m for m in container(objects)["volumeMounts"] if m["name"] == "credentials")
    tokens_file = serve_config(objects)["feedback"]["tokens_file"]
    assert tokens_file == f"{mount['mountPath']}/FEEDBACK_TOKENS"
    assert "FEEDBACK_TOKENS" in one(objects, "Secret")["data"]
    config = tmp_path / "serve.yaml"
    config.write_text(config_map(objects)["data"]["serve.yaml"], encoding="utf-8")
    assert load_settings(config).feedback.tokens_file == Path(tokens_file)


def test_feedback_tokens_without_a_secret_fail_rendering(helm: str) -> None:
    """feedback.tokensKey without a credentials Secret fails with the fix named."""
    result = run(template_args(helm, [], ["feedback.tokensKey=FEEDBACK_TOKENS"]))
    assert result.returncode != 0
    assert "secrets.existingSecret or secrets.create" in result.stderr
