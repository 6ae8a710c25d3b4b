"""The pod the chart runs: non-root with a read-only root filesystem, probes on the config's
port, a termination grace past serve's own, GPU or CPU scheduling, the model volume, and the
state volume (an emptyDir, or a claim per pod in a StatefulSet) sized for every capped file.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
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
    result = run(template_args(helm, [], sets))
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
    result = run(template_args(helm, [], ["model.layout=both"]))
    assert result.returncode != 0 and "layout" in result.stderr


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
