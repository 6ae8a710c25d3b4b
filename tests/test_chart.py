"""The Helm chart in helm/logstream, checked with the real helm, kubeconform and promtool CLIs.

`.ci/helm-tools.sh` installs pinned helm and kubeconform into `.tools/bin` and the Kubernetes
and CRD (KEDA, ServiceMonitor, PrometheusRule) JSON schemas into `.tools/schemas`;
`.ci/promtool.sh` installs promtool (from Debian's prometheus package) into `.tools/bin`.
Without them these tests skip with that hint, except in CI (CI=true), where a missing tool is
a failure.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

import pytest
import yaml

from logstream.settings import load_settings

REPO = Path(__file__).resolve().parents[1]
CHART = REPO / "helm" / "logstream"
TOOLS = REPO / ".tools"
SCHEMAS = TOOLS / "schemas"
CI_VALUES = sorted((CHART / "ci").glob("*-values.yaml"))
ALL_FEATURES = CHART / "ci" / "all-features-values.yaml"
TIMEOUT_S = 120

STANDARD_LABELS = (
    "app.kubernetes.io/name",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
    "app.kubernetes.io/managed-by",
    "helm.sh/chart",
)


def _missing(what: str, script: str = ".ci/helm-tools.sh") -> NoReturn:
    """Skip for a missing tool, except in CI (CI=true), where it is a failure."""
    message = f"{what} not installed: run {script}"
    if os.environ.get("CI") == "true":
        pytest.fail(message)
    pytest.skip(message)


def _tool(name: str, script: str = ".ci/helm-tools.sh") -> str:
    """Path of a CLI from .tools/bin (or PATH)."""
    pinned = TOOLS / "bin" / name
    found = str(pinned) if pinned.is_file() else shutil.which(name)
    if found is None:
        _missing(f"{name} is", script)
    return found


@pytest.fixture(scope="session")
def helm() -> str:
    return _tool("helm")


@pytest.fixture(scope="session")
def kube_version() -> str:
    """The Kubernetes version that .ci/helm-tools.sh fetched schemas for (e.g. v1.33.0)."""
    _tool("kubeconform")
    marker = SCHEMAS / "kubernetes-version"
    if not marker.is_file():
        _missing("the Kubernetes JSON schemas are")
    return marker.read_text(encoding="utf-8").strip()


def _run(args: list[str], stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, input=stdin, capture_output=True, text=True, timeout=TIMEOUT_S, check=False)


def _template_args(helm: str, values: list[Path], sets: list[str], chart: Path = CHART) -> list[str]:
    args = [helm, "template", "t", str(chart), "--namespace", "obs"]
    for path in values:
        args += ["--values", str(path)]
    for item in sets:
        # JSON for lists and maps (`topics=["a"]`), helm's --set syntax for scalars.
        is_json = item.partition("=")[2][:1] in ("[", "{")
        args += ["--set-json" if is_json else "--set", item]
    return args


def render_text(helm: str, values: list[Path] | None = None, sets: list[str] | None = None) -> str:
    """`helm template` output; fails the test with helm's stderr if it does not render."""
    result = _run(_template_args(helm, values or [], sets or []))
    assert result.returncode == 0, result.stderr
    return result.stdout


def render(
    helm: str, values: list[Path] | None = None, sets: list[str] | None = None
) -> list[dict[str, Any]]:
    """The rendered objects, in helm's order."""
    text = render_text(helm, values, sets)
    return [doc for doc in yaml.safe_load_all(text) if doc]


def one(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    matches = [obj for obj in objects if obj["kind"] == kind]
    assert len(matches) == 1, f"expected one {kind}, got {len(matches)}"
    return matches[0]


def config_map(objects: list[dict[str, Any]]) -> dict[str, Any]:
    """The ConfigMap with the serve config (the dashboard's ConfigMap is another one)."""
    matches = [obj for obj in objects if obj["kind"] == "ConfigMap" and "serve.yaml" in obj.get("data", {})]
    assert len(matches) == 1, f"expected one config ConfigMap, got {len(matches)}"
    return matches[0]


def kinds(objects: list[dict[str, Any]]) -> set[str]:
    return {obj["kind"] for obj in objects}


def workload(objects: list[dict[str, Any]]) -> dict[str, Any]:
    """The one Deployment or StatefulSet (state.persistence.enabled) that runs the pods."""
    matches = [obj for obj in objects if obj["kind"] in ("Deployment", "StatefulSet")]
    assert len(matches) == 1, f"expected one workload, got {[obj['kind'] for obj in matches]}"
    return matches[0]


def container(objects: list[dict[str, Any]]) -> dict[str, Any]:
    containers = workload(objects)["spec"]["template"]["spec"]["containers"]
    return next(c for c in containers if c["name"] == "logstream")


def serve_config(objects: list[dict[str, Any]]) -> dict[str, Any]:
    return yaml.safe_load(config_map(objects)["data"]["serve.yaml"])


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """No LOGSTREAM_* variables of the developer's shell leak into settings validation."""
    for name in list(os.environ):
        if name.startswith("LOGSTREAM_"):
            monkeypatch.delenv(name)
    return monkeypatch


def _values_id(path: Path | None) -> str:
    return "defaults" if path is None else path.name.removesuffix("-values.yaml")


VALUE_SETS = [None, *CI_VALUES]


@pytest.mark.parametrize("values", VALUE_SETS, ids=_values_id)
def test_chart_lints_clean(helm: str, values: Path | None) -> None:
    """`helm lint --strict` passes with the defaults and with each ci/*-values.yaml."""
    args = [helm, "lint", "--strict", str(CHART)] + (["--values", str(values)] if values else [])
    result = _run(args)
    assert result.returncode == 0, result.stdout + result.stderr


def kubeconform(manifests: str, kube_version: str) -> tuple[int, dict[str, Any]]:
    """kubeconform -strict over the manifests: (exit code, JSON report) with the local schemas."""
    result = _run(
        [
            _tool("kubeconform"),
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
    result = _run(_template_args(helm, [], ["keda.enabled=true", "autoscaling.enabled=true"]))
    assert result.returncode != 0
    assert "keda.enabled and autoscaling.enabled are mutually exclusive" in result.stderr


def test_config_change_rolls_the_pods(helm: str) -> None:
    """checksum/config changes with the rendered config, and only with it."""

    def checksum(sets: list[str]) -> str:
        deployment = one(render(helm, sets=sets), "Deployment")
        return deployment["spec"]["template"]["metadata"]["annotations"]["checksum/config"]

    base = checksum([])
    assert checksum(["replicaCount=2"]) == base
    assert checksum(["config.serve.kafka.group_id=other"]) != base
    assert checksum(["config.alerts.global.resolve_timeout=10m"]) != base


def test_chart_default_config_is_the_repository_config() -> None:
    """helm/logstream/files/*.yaml are byte-identical copies of configs/ (serve and alerts)."""
    for name in ("serve.yaml", "alerts.yaml"):
        chart_copy = CHART / "files" / name
        assert chart_copy.read_bytes() == (REPO / "configs" / name).read_bytes(), (
            f"{chart_copy} differs from configs/{name}: cp configs/{name} {chart_copy}"
        )


def test_chart_default_serve_config_validates(clean_env: pytest.MonkeyPatch) -> None:
    """The chart's serve.yaml is a valid `logstream serve` config as it stands."""
    settings = load_settings(CHART / "files" / "serve.yaml")
    assert settings.kafka.group_id


@pytest.mark.parametrize(
    ("values", "secret_env"),
    [
        (None, {}),
        # SASL: the password comes from the credentials Secret as an env var, as in the pod.
        (ALL_FEATURES, {"LOGSTREAM_KAFKA__SASL_PASSWORD": "from-the-secret"}),
    ],
    ids=["defaults", "all-features"],
)
def test_rendered_serve_config_validates(
    helm: str,
    values: Path | None,
    secret_env: dict[str, str],
    clean_env: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """The ConfigMap's serve.yaml passes logstream.settings, with the model dir the chart mounts."""
    for name, value in secret_env.items():
        clean_env.setenv(name, value)
    objects = render(helm, [values] if values else [])
    config = tmp_path / "serve.yaml"
    config.write_text(config_map(objects)["data"]["serve.yaml"], encoding="utf-8")
    settings = load_settings(config)
    mount = next(m for m in container(objects)["volumeMounts"] if m["name"] == "model")
    assert settings.model.dir == Path(mount["mountPath"])
    assert settings.http.port == container(objects)["ports"][0]["containerPort"]


def test_serve_check_accepts_the_rendered_config(
    helm: str, clean_env: pytest.MonkeyPatch, tmp_path: Path, synthetic_model_dir: Path
) -> None:
    """`logstream serve --config <the ConfigMap's serve.yaml> --check`, as the pod runs it, exits 0;
    --check also reads the mounted routes file (without its secrets, which are not here) and
    loads the model the model volume holds (here a test model in its place)."""
    objects = render(helm, [ALL_FEATURES])
    config = tmp_path / "serve.yaml"
    routes = tmp_path / "alerts.yaml"
    data = config_map(objects)["data"]
    routes.write_text(data["alerts.yaml"], encoding="utf-8")
    serve_yaml = data["serve.yaml"].replace("/etc/logstream/config/alerts.yaml", str(routes))
    model = next(m for m in container(objects)["volumeMounts"] if m["name"] == "model")["mountPath"]
    serve_yaml = serve_yaml.replace(f"dir: {model}", f"dir: {synthetic_model_dir}")
    assert str(routes) in serve_yaml and str(synthetic_model_dir) in serve_yaml
    config.write_text(serve_yaml, encoding="utf-8")
    args = [
        arg.replace("/etc/logstream/config/serve.yaml", str(config)) for arg in container(objects)["args"]
    ]
    env = {**os.environ, "LOGSTREAM_KAFKA__SASL_PASSWORD": "from-the-secret"}
    # The console script that `pip install` put next to this interpreter (the image's entrypoint).
    logstream = Path(sys.executable).with_name("logstream")
    assert logstream.is_file(), f"{logstream} missing: install the project (pip install -e .)"
    result = subprocess.run(
        [str(logstream), "serve", *args, "--check"],
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )
    assert result.returncode == 0, result.stderr


def test_rendered_alert_routes_validate_with_the_secret_in_place(
    helm: str, clean_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """alerts.yaml loads once the credentials Secret provides its ${ENV} and file: references."""
    from logstream.alerts.config import load_config

    objects = render(helm, [CHART / "ci" / "chart-secret-values.yaml"])
    routes = config_map(objects)["data"]["alerts.yaml"]
    mount = next(m for m in container(objects)["volumeMounts"] if m["name"] == "credentials")
    # The Secret's keys as the pod sees them: env vars, and files under the secrets mount.
    for name in re.findall(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", routes):
        clean_env.setenv(name, f"https://127.0.0.1/{name}")
    for path in re.findall(r"file:(\S+)", routes):
        assert path.startswith(mount["mountPath"] + "/"), path
        (tmp_path / Path(path).name).write_text("secret\n", encoding="utf-8")
    routes = routes.replace(f"file:{mount['mountPath']}/", f"file:{tmp_path}/")
    (tmp_path / "alerts.yaml").write_text(routes, encoding="utf-8")
    assert load_config(tmp_path / "alerts.yaml").receivers


def test_pod_is_non_root_with_a_read_only_root_filesystem(helm: str) -> None:
    """Non-root pod, read-only root; /tmp and the working dir (outbox, sink) are emptyDirs."""
    objects = render(helm)
    pod = one(objects, "Deployment")["spec"]["template"]["spec"]
    main = container(objects)
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    assert main["securityContext"]["readOnlyRootFilesystem"] is True
    assert main["securityContext"]["allowPrivilegeEscalation"] is False
    volumes = {v["name"]: v for v in pod["volumes"]}
    writable = {
        m["mountPath"]: volumes[m["name"]] for m in main["volumeMounts"] if not m.get("readOnly", False)
    }
    assert set(writable) == {"/tmp", main["workingDir"]}
    assert all("emptyDir" in volume for volume in writable.values())
    # Every file the process writes (anomaly sink, alert outbox with its silences) lands in one of them.
    routes = yaml.safe_load(config_map(objects)["data"]["alerts.yaml"])
    assert "silences_file" not in routes  # silences live in the outbox database
    written = [serve_config(objects)["sink"]["path"], routes["delivery"]["outbox"]]
    for path in written:
        resolved = Path(main["workingDir"]) / path  # relative paths start at the working dir
        assert any(resolved.is_relative_to(mount) for mount in writable), path


def test_probes_cover_startup_readiness_and_liveness_on_the_config_port(helm: str) -> None:
    """startup + liveness on /healthz, readiness on /readyz, all on the config's http.port."""
    objects = render(helm, sets=["config.serve.http.port=9123"])
    main = container(objects)
    assert main["ports"] == [{"name": "http", "containerPort": 9123, "protocol": "TCP"}]
    assert main["startupProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert main["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert main["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    startup = main["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 120  # time to load a model
    assert one(objects, "Service")["spec"]["ports"][0]["targetPort"] == "http"


@pytest.mark.parametrize("persistence", [False, True], ids=["deployment", "statefulset"])
def test_termination_grace_outlasts_the_shutdown_grace(helm: str, persistence: bool) -> None:
    """SIGKILL comes after the config's shutdown_grace_seconds (last batch committed first)."""
    sets = ["config.serve.shutdown_grace_seconds=45", f"state.persistence.enabled={str(persistence).lower()}"]
    pod = workload(render(helm, sets=sets))["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] > 45


@pytest.mark.parametrize(
    ("drain", "seconds"), [(None, 10), ("0", 0), ("1m30s", 90), ("500ms", 1), ("2.5s", 3)]
)
def test_termination_grace_outlasts_the_alert_drain_too(helm: str, drain: str | None, seconds: int) -> None:
    """With the alerts sink, serve's grace is followed by the outbox drain (delivery.shutdown_grace,
    default 10 s, any duration syntax): the default terminationGracePeriodSeconds covers both."""
    sets = ["config.serve.sink.kind=alerts", "config.serve.shutdown_grace_seconds=45"]
    if drain is not None:
        sets.append(f"config.alerts.delivery.shutdown_grace={drain}")
    pod = workload(render(helm, sets=sets))["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] == 45 + seconds + 10


@pytest.mark.parametrize(
    ("sets", "grace"),
    [
        (["terminationGracePeriodSeconds=20"], 20),
        (["terminationGracePeriodSeconds=5"], 20),
        (["terminationGracePeriodSeconds=30", "config.serve.sink.kind=alerts"], 30),
    ],
)
def test_termination_grace_not_above_the_shutdown_grace_fails(helm: str, sets: list[str], grace: int) -> None:
    """A terminationGracePeriodSeconds that would SIGKILL serve before its own graces is refused."""
    result = _run(_template_args(helm, [], sets))
    assert result.returncode != 0
    assert f"must be longer than serve's shutdown grace, {grace} s" in result.stderr


def test_gpu_values_request_a_gpu_on_gpu_nodes(helm: str) -> None:
    """gpu.enabled: nvidia.com/gpu limit, GPU nodeSelector + toleration, CUDA image, device cuda."""
    objects = render(helm, [CHART / "ci" / "gpu-values.yaml"], ["nodeSelector.pool=inference"])
    pod = one(objects, "Deployment")["spec"]["template"]["spec"]
    main = container(objects)
    assert main["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert main["image"].endswith("-cuda")
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true", "pool": "inference"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in (pod["tolerations"])
    assert pod["runtimeClassName"] == "nvidia"
    assert serve_config(objects)["model"]["device"] == "cuda"


def test_cpu_pods_do_not_touch_gpus(helm: str) -> None:
    """Without gpu.enabled: CPU image, no GPU limit, no GPU scheduling constraints."""
    objects = render(helm)
    pod = one(objects, "Deployment")["spec"]["template"]["spec"]
    assert container(objects)["image"] == "logstream:0.1.0-cpu"
    assert "nvidia.com/gpu" not in container(objects)["resources"].get("limits", {})
    assert "nodeSelector" not in pod and "tolerations" not in pod


def test_existing_secret_is_referenced_not_created(helm: str) -> None:
    """secrets.existingSecret: env vars and files from that Secret; the chart makes none."""
    objects = render(helm, [CHART / "ci" / "existing-secret-values.yaml"])
    pod = one(objects, "Deployment")["spec"]["template"]["spec"]
    assert "Secret" not in kinds(objects)
    assert container(objects)["envFrom"] == [{"secretRef": {"name": "logstream-credentials"}}]
    volume = next(v for v in pod["volumes"] if v["name"] == "credentials")
    assert volume["secret"]["secretName"] == "logstream-credentials"


def test_chart_made_secret_holds_the_values_and_rolls_the_pods(helm: str) -> None:
    """secrets.create: a Secret with the given data, referenced by the pod, checksummed."""
    objects = render(helm, [CHART / "ci" / "chart-secret-values.yaml"])
    secret = one(objects, "Secret")
    assert base64.b64decode(secret["data"]["PAGERDUTY_ROUTING_KEY"]) == b"not-a-real-key"
    assert container(objects)["envFrom"] == [{"secretRef": {"name": secret["metadata"]["name"]}}]
    annotations = one(objects, "Deployment")["spec"]["template"]["metadata"]["annotations"]
    assert "checksum/secret" in annotations


def test_existing_and_chart_made_secret_together_fail(helm: str) -> None:
    """secrets.existingSecret with secrets.create is refused."""
    result = _run(_template_args(helm, [], ["secrets.existingSecret=mine", "secrets.create=true"]))
    assert result.returncode != 0
    assert "mutually exclusive" in result.stderr


def test_model_from_init_container_fills_an_empty_dir(helm: str) -> None:
    """model.source initContainer: the model image copies into an emptyDir mounted read-only."""
    objects = render(helm, [CHART / "ci" / "model-init-values.yaml"])
    pod = one(objects, "Deployment")["spec"]["template"]["spec"]
    init = pod["initContainers"][0]
    assert init["image"] == "registry.example/logstream-model:hdfs-2026-11-29"
    assert init["securityContext"]["readOnlyRootFilesystem"] is True
    volume = next(v for v in pod["volumes"] if v["name"] == "model")
    assert "emptyDir" in volume
    assert {"name": "model", "mountPath": "/model-volume"} in init["volumeMounts"]


def test_model_from_pvc_is_mounted_read_only(helm: str) -> None:
    """model.source pvc (the default): the claim is mounted read-only at model.mountPath."""
    objects = render(helm, sets=["model.pvc.claimName=hdfs-model", "model.pvc.subPath=v3"])
    pod = one(objects, "Deployment")["spec"]["template"]["spec"]
    volume = next(v for v in pod["volumes"] if v["name"] == "model")
    assert volume["persistentVolumeClaim"] == {"claimName": "hdfs-model", "readOnly": True}
    mount = next(m for m in container(objects)["volumeMounts"] if m["name"] == "model")
    assert mount == {
        "name": "model",
        "mountPath": "/models/logstream",
        "readOnly": True,
        "subPath": "v3",
    }


def test_model_layout_store_makes_serve_follow_the_store(helm: str) -> None:
    """model.layout store: serve's config names the mount as model.store (hot reload of the
    promoted version, a shadow candidate passes through), never model.dir; the default is dir."""
    assert serve_config(render(helm))["model"]["dir"] == "/models/logstream"
    assert "store" not in serve_config(render(helm))["model"]
    model = serve_config(render(helm, sets=["model.layout=store", "config.serve.model.shadow=v0003"]))[
        "model"
    ]
    assert model["store"] == "/models/logstream" and model["shadow"] == "v0003"
    assert "dir" not in model
    result = _run(_template_args(helm, [], ["model.layout=both"]))
    assert result.returncode != 0 and "layout" in result.stderr


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


def test_statefulset_keeps_the_outbox_on_a_claim_per_pod(helm: str) -> None:
    """state.persistence: a StatefulSet (no Deployment) whose claim template is the working dir,
    where the alert outbox lives; no emptyDir for the state."""
    objects = render(helm, [CHART / "ci" / "statefulset-values.yaml"])
    assert "Deployment" not in kinds(objects)
    sts = one(objects, "StatefulSet")
    claims = {c["metadata"]["name"]: c["spec"] for c in sts["spec"]["volumeClaimTemplates"]}
    assert claims == {
        "state": {
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": "fast-ssd",
            "resources": {"requests": {"storage": "2Gi"}},
        }
    }
    main = container(objects)
    mount = next(m for m in main["volumeMounts"] if m["name"] == "state")
    assert mount["mountPath"] == main["workingDir"]
    assert "state" not in {v["name"] for v in sts["spec"]["template"]["spec"]["volumes"]}
    outbox = yaml.safe_load(config_map(objects)["data"]["alerts.yaml"])["delivery"]["outbox"]
    assert (Path(main["workingDir"]) / outbox).is_relative_to(mount["mountPath"])
    assert sts["spec"]["serviceName"] == one(objects, "Service")["metadata"]["name"]
    assert sts["spec"]["persistentVolumeClaimRetentionPolicy"] == {
        "whenDeleted": "Retain",
        "whenScaled": "Retain",
    }


# What the state volume holds besides the audit log and the anomalies file, whose caps come
# from the rendered config (docs/serve.md "Files and disk"): the alert outbox at 1,000
# incidents a day (it replaces the anomalies file with sink kind alerts), the feedback
# database with SQLite's WAL files, and per kept incident of the memory twice what a typical
# one takes (docs/incident_memory.md).
OUTBOX_BUDGET = 256 * 2**20
FEEDBACK_BUDGET = 64 * 2**20
INCIDENT_BUDGET = 4 * 2**10


def _bytes(quantity: str) -> int:
    """A Kubernetes binary quantity ("2Gi", "512Mi") in bytes."""
    match = re.fullmatch(r"(\d+)([KMGT]i)?", quantity)
    assert match, quantity
    return int(match[1]) * 1024 ** ("KMGT".index(match[2][0]) + 1 if match[2] else 0)


def test_state_volume_holds_every_capped_file(
    helm: str, clean_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The default state volume (the emptyDir's sizeLimit, and the claim with persistence)
    holds the audit log and the anomalies file at the caps the rendered config sets, plus the
    outbox and feedback budgets and the incident memory at its cap: the pod is never evicted
    for filling its emptyDir."""
    audited = ["config.serve.audit_log=audit.jsonl"]
    objects = render(helm, sets=audited)
    config = tmp_path / "serve.yaml"
    config.write_text(config_map(objects)["data"]["serve.yaml"], encoding="utf-8")
    settings = load_settings(config)
    sink = settings.sink.max_bytes * settings.sink.files
    need = (
        settings.audit_log_max_bytes * settings.audit_log_files
        + max(sink, OUTBOX_BUDGET)
        + FEEDBACK_BUDGET
        + settings.incidents.max_incidents * INCIDENT_BUDGET
    )
    volumes = {v["name"]: v for v in workload(objects)["spec"]["template"]["spec"]["volumes"]}
    persistent = workload(render(helm, sets=[*audited, "state.persistence.enabled=true"]))
    [claim] = persistent["spec"]["volumeClaimTemplates"]
    assert _bytes(volumes["state"]["emptyDir"]["sizeLimit"]) >= need
    assert _bytes(claim["spec"]["resources"]["requests"]["storage"]) >= need


def test_statefulset_pods_match_the_deployment_pods(helm: str) -> None:
    """Switching to the StatefulSet changes only where the state lives, not the pod."""
    deployment = one(render(helm), "Deployment")["spec"]["template"]
    sts = one(render(helm, sets=["state.persistence.enabled=true"]), "StatefulSet")["spec"]["template"]
    deployment["spec"]["volumes"] = [v for v in deployment["spec"]["volumes"] if v["name"] != "state"]
    assert sts == deployment


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


# -- PrometheusRule ---------------------------------------------------------------------------

RULE_VALUES = CHART / "ci" / "prometheusrule-values.yaml"
SERIES = 'job="t-logstream",namespace="obs"'  # the default selector for release t in namespace obs


@pytest.fixture(scope="session")
def promtool() -> str:
    return _tool("promtool", ".ci/promtool.sh")


def rule_groups(helm: str, values: list[Path] | None = None, sets: list[str] | None = None) -> dict[str, Any]:
    """The PrometheusRule's spec: a Prometheus rule file (`groups: [...]`)."""
    return one(render(helm, values or [RULE_VALUES], sets), "PrometheusRule")["spec"]


def alerts_of(groups: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {rule["alert"]: rule for group in groups["groups"] for rule in group["rules"]}


def test_prometheus_rule_passes_promtool_check(helm: str, promtool: str, tmp_path: Path) -> None:
    """`promtool check rules` accepts the rendered rules (PromQL parses, durations are valid)."""
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump(rule_groups(helm)), encoding="utf-8")
    result = _run([promtool, "check", "rules", str(rules)])
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 6 rules found" in result.stdout


def test_promtool_check_rejects_a_broken_expression(helm: str, promtool: str, tmp_path: Path) -> None:
    """The promtool check can fail: an expression with a PromQL syntax error is refused."""
    groups = rule_groups(helm)
    groups["groups"][0]["rules"][0]["expr"] += " and ("
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump(groups), encoding="utf-8")
    result = _run([promtool, "check", "rules", str(rules)])
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
    """Every logstream_* series an alert reads is a metric the code registers (no renamed name)."""
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
    result = _run(_template_args(helm, [RULE_VALUES], ["prometheusRule.disabled.LogstreamNoLines=true"]))
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
    return _run([promtool, "test", "rules", str(tmp_path / "unit.yaml")])


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
    result = _run(_template_args(helm, [], [setting]))
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
    args = _template_args(helm, [], sets or [], chart)
    result = _run([*args, "--show-only", "templates/notes-under-test.yaml"])
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


def test_alerts_sink_reads_the_mounted_routes(helm: str) -> None:
    """sink.kind alerts: sink.routes is the alerts.yaml of the mounted ConfigMap."""
    objects = render(helm, sets=["config.serve.sink.kind=alerts", "config.serve.sink.routes=configs/x.yaml"])
    config_mount = next(m for m in container(objects)["volumeMounts"] if m["name"] == "config")
    routes = Path(serve_config(objects)["sink"]["routes"])
    assert routes.parent == Path(config_mount["mountPath"])
    assert routes.name in config_map(objects)["data"]


def test_tool_install_is_idempotent(helm: str, kube_version: str) -> None:
    """A second .ci/helm-tools.sh run finds every pinned piece in place and installs nothing."""
    result = _run(["bash", str(REPO / ".ci" / "helm-tools.sh")])
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 1 and lines[0].startswith("helm-tools: ready:"), result.stdout


def test_promtool_install_is_idempotent(promtool: str) -> None:
    """A second .ci/promtool.sh run finds promtool in place and downloads nothing."""
    result = _run(["bash", str(REPO / ".ci" / "promtool.sh")])
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 1 and lines[0].startswith("promtool: ready: promtool, version"), result.stdout


def _dockerfile_stages(path: Path) -> list[list[str]]:
    """Instructions of each build stage (continuation lines joined, comments dropped)."""
    text = re.sub(r"\\\n", " ", path.read_text(encoding="utf-8"))
    stages: list[list[str]] = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.upper().startswith("FROM "):
            stages.append([])
        if stages:
            stages[-1].append(line)
    return stages


@pytest.mark.parametrize("flavor", ["cpu", "cuda"])
def test_dockerfile_is_multistage_non_root_serve_image(helm: str, flavor: str) -> None:
    """Dockerfile.<flavor>: build + runtime stages; `logstream serve` as the chart's non-root user.

    No Docker engine runs here, so the images are not built; this checks what the chart relies on.
    """
    stages = _dockerfile_stages(REPO / "helm" / "docker" / f"Dockerfile.{flavor}")
    assert len(stages) >= 2
    runtime = stages[-1]
    assert any(line.startswith("COPY --from=build ") for line in runtime)
    user = [line.split()[1] for line in runtime if line.startswith("USER ")]
    pod = one(render(helm), "Deployment")["spec"]["template"]["spec"]["securityContext"]
    assert user == [f"{pod['runAsUser']}:{pod['runAsGroup']}"]
    assert 'ENTRYPOINT ["logstream", "serve"]' in runtime
    args = container(render(helm))["args"]
    assert f"CMD {json.dumps(args)}" in runtime


DOCKER = REPO / "helm" / "docker"
COMPILERS = re.compile(r"\b(gcc|g\+\+|cc|clang|build-essential|libc6-dev)\b")


def _digest_check(flavor: str) -> str:
    """The build stage's shell check that refuses a base image without a digest."""
    [check] = [line for line in _dockerfile_stages(DOCKER / f"Dockerfile.{flavor}")[0] if "@sha256:" in line]
    assert check.startswith("RUN ")
    return check.removeprefix("RUN ")


@pytest.mark.parametrize("flavor", ["cpu", "cuda"])
@pytest.mark.parametrize(
    ("image", "accepted"),
    [
        ("python:3.11-slim-bookworm", False),
        ("registry.example/python:3.11-slim-bookworm", False),
        ("python:3.11-slim-bookworm@sha256:" + "0" * 64, True),
    ],
)
def test_base_image_must_be_pinned_by_digest(flavor: str, image: str, accepted: bool) -> None:
    """Every stage starts FROM the PYTHON_IMAGE argument, and the build stage's first step
    (run here with sh, as the build would) fails for a reference without `@sha256:`."""
    stages = _dockerfile_stages(DOCKER / f"Dockerfile.{flavor}")
    assert {stage[0].split()[1] for stage in stages} == {"${PYTHON_IMAGE}"}
    done = subprocess.run(
        ["sh", "-c", _digest_check(flavor)],
        env={"PYTHON_IMAGE": image},
        capture_output=True,
        text=True,
        check=False,
    )
    assert (done.returncode == 0) == accepted, done.stderr
    assert accepted or "pin it as NAME:TAG@sha256:" in done.stderr


@pytest.mark.parametrize("flavor", ["cpu", "cuda"])
def test_runtime_image_has_no_compiler(flavor: str) -> None:
    """The runtime stage installs no package (so no compiler) and copies what the build stage
    made; only the build stage may name a compiler."""
    runtime = _dockerfile_stages(DOCKER / f"Dockerfile.{flavor}")[-1]
    assert not [line for line in runtime if "apt-get" in line or "apk " in line or COMPILERS.search(line)]
    assert any(line.startswith("COPY --from=build /opt/logstream ") for line in runtime)


def test_cuda_runtime_reads_tritons_driver_module_from_the_seed() -> None:
    """The CUDA image's runtime points Triton at the seeded cache with the build stage's
    TRITON_LIBCUDA_PATH (part of the seed's key), and copies the seed."""
    build, runtime = _dockerfile_stages(DOCKER / "Dockerfile.cuda")
    env = " ".join(line for line in runtime if line.startswith("ENV "))
    assert "TRITON_CACHE_MANAGER=triton_seed:SeededCacheManager" in env
    assert "TRITON_LIBCUDA_PATH=/opt/triton-libcuda" in env
    assert any("TRITON_LIBCUDA_PATH=/opt/triton-libcuda" in line for line in build if line.startswith("ENV "))
    assert "COPY --from=build /opt/triton-seed /opt/triton-seed" in runtime


def test_triton_driver_module_is_found_without_a_compiler(tmp_path: Path) -> None:
    """helm/docker/triton_seed.py with this machine's Triton: the driver module compiled into
    a seed (against a stub libcuda.so.1, as the build stage does) is found by a process that
    has no compiler (CC=/bin/false) through SeededCacheManager; without it, that process
    would have to compile."""
    if shutil.which("gcc") is None:
        _missing("gcc is", "apt-get install gcc")
    pytest.importorskip("triton.backends.nvidia.driver")
    stub = tmp_path / "libcuda"
    stub.mkdir()
    (tmp_path / "stub.c").write_text("void logstream_libcuda_stub(void) {}\n")
    gcc = ["gcc", "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", str(stub / "libcuda.so.1")]
    subprocess.run([*gcc, str(tmp_path / "stub.c")], check=True, timeout=TIMEOUT_S)
    env = {**os.environ, "PYTHONPATH": str(DOCKER), "TRITON_LIBCUDA_PATH": str(stub)}
    env["TRITON_SEED_DIR"] = str(tmp_path / "seed")

    def seed(command: str, **extra: str) -> subprocess.CompletedProcess[str]:
        args = [sys.executable, "-m", "triton_seed", command]
        return subprocess.run(args, env={**env, **extra}, capture_output=True, text=True, timeout=TIMEOUT_S)

    assert seed("seed", TRITON_CACHE_DIR=str(tmp_path / "seed")).returncode == 0
    runtime = {"CC": "/bin/false", "TRITON_CACHE_DIR": str(tmp_path / "runtime")}
    found = seed("check", TRITON_CACHE_MANAGER="triton_seed:SeededCacheManager", **runtime)
    assert found.returncode == 0, found.stderr
    assert seed("check", **runtime).returncode != 0  # no seed lookup: it tries the (missing) compiler


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


def dashboard_config_map(objects: list[dict[str, Any]]) -> dict[str, Any]:
    matches = [
        obj for obj in objects if obj["kind"] == "ConfigMap" and "logstream.json" in obj.get("data", {})
    ]
    assert len(matches) == 1, f"expected one dashboard ConfigMap, got {len(matches)}"
    return matches[0]


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
    result = _run([promtool, "check", "rules", str(path)])
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"{len(exprs)} rules found" in result.stdout


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
    result = _run(_template_args(helm, [], ["repartition.enabled=true"]))
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
    result = _run(_template_args(helm, [], ["feedback.tokensKey=FEEDBACK_TOKENS"]))
    assert result.returncode != 0
    assert "secrets.existingSecret or secrets.create" in result.stderr
