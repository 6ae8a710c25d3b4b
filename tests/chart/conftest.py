"""Fixtures of the chart tests: the real CLIs, found once per session (missing: skip, or fail
under CI=true), and an environment without the developer's LOGSTREAM_* variables."""

from __future__ import annotations

import os

import pytest
from chart_support import SCHEMAS, missing, tool


@pytest.fixture(scope="session")
def helm() -> str:
    return tool("helm")


@pytest.fixture(scope="session")
def kube_version() -> str:
    """The Kubernetes version that .ci/helm-tools.sh fetched schemas for (e.g. v1.33.0)."""
    tool("kubeconform")
    marker = SCHEMAS / "kubernetes-version"
    if not marker.is_file():
        missing("the Kubernetes JSON schemas are")
    return marker.read_text(encoding="utf-8").strip()


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """No LOGSTREAM_* variables of the developer's shell leak into settings validation."""
    for name in list(os.environ):
        if name.startswith("LOGSTREAM_"):
            monkeypatch.delenv(name)
    return monkeypatch


@pytest.fixture(scope="session")
def promtool() -> str:
    return tool("promtool", ".ci/promtool.sh")
