"""Shared pieces of the chart tests: the chart's paths, the real CLIs, `helm template` and the
rendered objects it gives.

The CLIs are the real helm, kubeconform (with the Kubernetes and CRD JSON schemas) and promtool
that `.ci/helm-tools.sh` and `.ci/promtool.sh` install into `.tools/` (or ones on PATH);
without them the chart tests skip with that hint, except in CI (CI=true), where a missing tool
is a failure.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any, NoReturn

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]


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


def missing(what: str, script: str = ".ci/helm-tools.sh") -> NoReturn:
    """Skip for a missing tool, except in CI (CI=true), where it is a failure."""
    message = f"{what} not installed: run {script}"
    if os.environ.get("CI") == "true":
        pytest.fail(message)
    pytest.skip(message)


def tool(name: str, script: str = ".ci/helm-tools.sh") -> str:
    """Path of a CLI from .tools/bin (or PATH)."""
    pinned = TOOLS / "bin" / name
    found = str(pinned) if pinned.is_file() else shutil.which(name)
    if found is None:
        missing(f"{name} is", script)
    return found


def run(args: list[str], stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, input=stdin, capture_output=True, text=True, timeout=TIMEOUT_S, check=False)


def template_args(helm: str, values: list[Path], sets: list[str], chart: Path = CHART) -> list[str]:
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
    result = run(template_args(helm, values or [], sets or []))
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


def dashboard_config_map(objects: list[dict[str, Any]]) -> dict[str, Any]:
    matches = [
        obj for obj in objects if obj["kind"] == "ConfigMap" and "logstream.json" in obj.get("data", {})
    ]
    assert len(matches) == 1, f"expected one dashboard ConfigMap, got {len(matches)}"
    return matches[0]
