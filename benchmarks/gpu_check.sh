#!/usr/bin/env bash
# One-shot GPU check (docs/gpu/README.md): versions, install what the image lacks, GPU tests, benchmark.
#
#   bash benchmarks/gpu_check.sh --prepare     # here, with network: build-backend wheels into .whl/
#   bash benchmarks/gpu_check.sh --rehearse    # here, CPU: Triton interpreter, tiny shapes, ~1 min
#   bash benchmarks/gpu_check.sh               # on the GPU machine: under 8 minutes, results in $OUT
#
# The device call (docs/gpu/README.md): command "bash benchmarks/gpu_check.sh", carry [".whl"],
# timeout_s 540. Every step runs whatever the one before did; each has a hard time limit, so the
# run ends inside 8 minutes. Files under $OUT (6, flat): env.json, run.log, pytest.xml,
# bench.json, bench.md, summary.txt. Exit status: 0 when every step passed.
set -uo pipefail
cd "$(dirname "$0")/.."

MODE=device
case "${1:-}" in
--prepare) MODE=prepare ;;
--rehearse) MODE=rehearse ;;
"") ;;
*)
  echo "usage: $0 [--prepare | --rehearse]" >&2
  exit 2
  ;;
esac

# Limits in seconds. TOTAL_S caps the whole run (8 minutes of GPU time, less a margin): the
# tests get at most what leaves the benchmark 200 s, the benchmark at most what is left.
TOTAL_S=${TOTAL_S:-460}
PYTEST_S=${PYTEST_S:-120}
BENCH_S=${BENCH_S:-290} # the benchmark's own budget is 20 s less, so it writes its summary first
WHEELS=.whl
# setuptools >= 77 reads pyproject's SPDX license string; both are pure python.
BUILD_WHEELS=("setuptools==80.9.0" "wheel==0.45.1")
# logstream.engine.model reads model metadata with pydantic and compiles its regexes with google-re2;
# the GPU machine's image lacks both. pydantic-core and google-re2 are compiled:
# fetched for the device's CPython 3.12.
RUNTIME_WHEELS=("pydantic==2.14.4" "pydantic-core==2.50.5" "annotated-types==0.8.0"
  "typing-inspection==0.4.5" "typing-extensions==4.16.0" "google-re2==1.1.20251105")

if [[ $MODE == prepare ]]; then
  mkdir -p .git/info "$WHEELS"
  grep -qx "/$WHEELS/" .git/info/exclude 2>/dev/null || echo "/$WHEELS/" >>.git/info/exclude
  PY=${PYTHON:-.venv/bin/python}
  exec "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 \
    -d "$WHEELS" "${BUILD_WHEELS[@]}" "${RUNTIME_WHEELS[@]}"
fi

if [[ $MODE == rehearse ]]; then
  PY=${PYTHON:-.venv/bin/python}
  OUT=${OUT:-/tmp/gpu-rehearsal}
  BENCH_ARGS=(--rehearse)
  export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
else
  PY=${PYTHON:-python3}
  OUT=${OUT:-$PWD/gpu-out}
  BENCH_ARGS=()
fi
[[ $PY == */* && $PY != /* ]] && PY=$PWD/$PY # the import checks run from /tmp
PY=$(command -v "$PY") || {
  echo "no python at $PY" >&2
  exit 2
}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/run.log") 2>&1
export PYTHONUNBUFFERED=1
failed=()
step() { echo -e "\n=== $* ($(date -u +%T), ${SECONDS}s)"; }

step "versions"
timeout 30 "$PY" - "$OUT/env.json" <<'EOF'
"""Print and record what the image holds, before anything is installed."""
import importlib.metadata as md
import json
import platform
import subprocess
import sys

env = {"python": platform.python_version(), "executable": sys.executable}
for name in ("torch", "triton", "transformers", "tokenizers", "numpy", "pytest", "setuptools", "pip"):
    try:
        env[name] = md.version(name)
    except md.PackageNotFoundError:
        env[name] = None
try:
    import torch

    env["torch_cuda"] = torch.version.cuda
    env["cuda_available"] = torch.cuda.is_available()
    if env["cuda_available"]:
        p = torch.cuda.get_device_properties(0)
        env.update(gpu=p.name, capability=f"{p.major}.{p.minor}", gpu_memory_gib=round(p.total_memory / 2**30, 1))
except Exception as e:  # recorded, not fatal: the next steps say what it breaks
    env["torch_error"] = f"{type(e).__name__}: {e}"
try:
    env["nvidia_smi"] = subprocess.run(
        ["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem", "--format=csv,noheader"],
        capture_output=True, text=True, timeout=20,
    ).stdout.strip()
except (OSError, subprocess.TimeoutExpired) as e:
    env["nvidia_smi"] = f"unavailable: {e}"
print(json.dumps(env, indent=1))
with open(sys.argv[1], "w") as f:
    json.dump(env, f, indent=1)
EOF
[[ $? == 0 ]] || failed+=(versions)

step "install what the image lacks (no network: wheels only from $WHEELS/)"
# The GPU path imports torch, triton, transformers, tokenizers, numpy, pydantic and re2; the tests
# need pytest. All but pydantic and re2 must come with the image: a missing one fails this step by
# name. Those two come from the carried wheels, into /tmp/site. logstream's other dependencies
# (aiokafka, structlog, drain3, ...) are not imported on this path, and pytest runs with
# --noconftest because tests/conftest.py imports aiokafka.
missing=$(cd /tmp && "$PY" -c '
import importlib.util as u
print(" ".join(m for m in ("torch", "triton", "transformers", "tokenizers", "numpy", "pytest") if u.find_spec(m) is None))')
if [[ -n $missing ]]; then
  echo "MISSING from the image: $missing (carry them as wheels in $WHEELS/, see docs/gpu/README.md)"
  failed+=("missing:$missing")
fi
if ! (cd /tmp && "$PY" -c "import pydantic, re2" 2>/dev/null) && [[ $MODE == device ]]; then
  timeout 45 "$PY" -m pip install -q --no-index --no-deps --no-compile --target /tmp/site \
    "$WHEELS"/pydantic*.whl "$WHEELS"/annotated_types*.whl "$WHEELS"/typing_*.whl "$WHEELS"/google_re2*.whl
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
  (cd /tmp && "$PY" -c "import pydantic, re2; print('pydantic', pydantic.VERSION, 're2: from the wheels')") ||
    failed+=(pydantic/re2)
fi
has_logstream() { (cd /tmp && "$PY" -c "import logstream.engine.kernels.dispatch, logstream.engine.streaming" 2>/dev/null); }
if has_logstream; then
  echo "logstream already importable"
elif [[ $MODE == rehearse ]]; then # never reinstall into the shared development venv
  echo "logstream is not installed in $PY: pip install -e . there first"
  failed+=(install)
else
  if [[ -d $WHEELS ]]; then # build isolation from the carried setuptools/wheel
    timeout 45 "$PY" -m pip install -q --no-deps --no-index --find-links "$WHEELS" -e .
  else # the image's own setuptools (must be >= 77)
    timeout 45 "$PY" -m pip install -q --no-deps --no-index --no-build-isolation -e .
  fi
  if ! has_logstream; then
    # Last resort: the checkout itself (logstream/ is the whole package).
    export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
    echo "pip install -e . failed: importing logstream from $PWD"
  fi
  has_logstream || failed+=(install)
fi
(cd /tmp && "$PY" -c "import logstream.engine.streaming as e; print('logstream from', e.__file__)")

limit=$((TOTAL_S - SECONDS - 200 < PYTEST_S ? TOTAL_S - SECONDS - 200 : PYTEST_S))
step "tests/engine/kernels/test_gpu.py (limit ${limit}s)"
# pytest-xdist, where the image has it: Triton compiles each test's kernels on the CPU cores.
parallel=()
(cd /tmp && "$PY" -c "import xdist" 2>/dev/null) && [[ $MODE == device ]] && parallel=(-n 4)
timeout "$limit" "$PY" -m pytest tests/engine/kernels/test_gpu.py -v -rs --noconftest -p no:cacheprovider \
  "${parallel[@]}" --junitxml="$OUT/pytest.xml" -o junit_family=xunit2
rc=$?
[[ $rc == 0 ]] || failed+=("pytest:rc=$rc")

limit=$((TOTAL_S - SECONDS < BENCH_S ? TOTAL_S - SECONDS : BENCH_S))
step "benchmarks/gpu.py (limit ${limit}s)"
[[ $MODE == rehearse ]] && export TRITON_INTERPRET=1 LOGSTREAM_FORCE_TRITON=1 # else gpu.py re-executes itself
timeout "$limit" "$PY" benchmarks/gpu.py --out "$OUT" --budget-s $((limit - 20)) "${BENCH_ARGS[@]}"
rc=$?
[[ $rc == 0 ]] || failed+=("bench:rc=$rc")

step "done"
ls -l "$OUT"
if ((${#failed[@]})); then
  echo "FAILED steps: ${failed[*]}"
  exit 1
fi
echo "all steps passed"
