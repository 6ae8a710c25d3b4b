"""The serve config and alert routes the chart mounts: the repository's configs/ as they are,
valid for `logstream settings` and `serve --check` once rendered, rolled out on change, and
their secrets from a Secret the chart makes or one that exists.
"""

from __future__ import annotations

import base64
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from chart_support import (
    ALL_FEATURES,
    CHART,
    REPO,
    TIMEOUT_S,
    config_map,
    container,
    kinds,
    one,
    render,
    run,
    serve_config,
    template_args,
)

from logstream.settings import load_settings


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
    result = run(template_args(helm, [], ["secrets.existingSecret=mine", "secrets.create=true"]))
    assert result.returncode != 0
    assert "mutually exclusive" in result.stderr


def test_alerts_sink_reads_the_mounted_routes(helm: str) -> None:
    """sink.kind alerts: sink.routes is the alerts.yaml of the mounted ConfigMap."""
    objects = render(helm, sets=["config.serve.sink.kind=alerts", "config.serve.sink.routes=configs/x.yaml"])
    config_mount = next(m for m in container(objects)["volumeMounts"] if m["name"] == "config")
    routes = Path(serve_config(objects)["sink"]["routes"])
    assert routes.parent == Path(config_mount["mountPath"])
    assert routes.name in config_map(objects)["data"]
