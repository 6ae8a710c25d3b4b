"""The images the chart runs (helm/docker): multi-stage Dockerfiles with a non-root `logstream
serve` runtime, base images pinned by digest, no compiler at runtime, and the CUDA image's
seeded Triton driver module. No Docker engine runs here: the checks read the Dockerfiles and
run their shell steps.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from chart_support import (
    REPO,
    TIMEOUT_S,
    container,
    missing,
    one,
    render,
)


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
        missing("gcc is", "apt-get install gcc")
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
