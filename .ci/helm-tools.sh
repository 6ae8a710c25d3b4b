#!/usr/bin/env bash
# Install the pinned tools that tests/test_chart.py needs into the git-ignored .tools/:
#   .tools/bin/helm, .tools/bin/kubeconform       built with `go install` from the Go module proxy
#   .tools/schemas/kubernetes/<v>-local-strict/   Kubernetes JSON schemas (PyPI: kubernetes-validate),
#                                                 rewritten to resolve on disk
#   .tools/schemas/crds/<group>/<kind>_<v>.json   KEDA ScaledObject/TriggerAuthentication and
#                                                 ServiceMonitor schemas, converted from the CRD
#                                                 YAMLs in their Go modules
# Only package registries are reachable, so nothing is fetched from anywhere else. Idempotent:
# each piece carries a stamp with its version, and a second run with the same pins does nothing.
set -euo pipefail

HELM_VERSION=v3.22.0
KUBECONFORM_VERSION=v0.8.0
KUBERNETES_VALIDATE_VERSION=1.37.0 # ships the schemas of Kubernetes 1.25 .. 1.37
KUBERNETES_VERSION=v1.33.0         # tests/test_chart.py renders and validates for this version
KEDA_VERSION=v2.21.0
PROMETHEUS_OPERATOR_VERSION=v0.85.0

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TOOLS="$ROOT/.tools"
STAMPS="$TOOLS/stamps"
PYTHON="${PYTHON:-$ROOT/.venv/bin/python}"
[ -x "$PYTHON" ] || PYTHON=python3
mkdir -p "$TOOLS/bin" "$STAMPS"

# fresh NAME VERSION: true when the stamp of NAME already records VERSION.
fresh() { [ -f "$STAMPS/$1" ] && [ "$(cat "$STAMPS/$1")" = "$2" ]; }
stamp() { printf '%s' "$2" >"$STAMPS/$1"; }

if ! fresh helm "$HELM_VERSION" || [ ! -x "$TOOLS/bin/helm" ]; then
    echo "helm-tools: go install helm $HELM_VERSION"
    GOBIN="$TOOLS/bin" go install "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
    stamp helm "$HELM_VERSION"
fi

if ! fresh kubeconform "$KUBECONFORM_VERSION" || [ ! -x "$TOOLS/bin/kubeconform" ]; then
    echo "helm-tools: go install kubeconform $KUBECONFORM_VERSION"
    GOBIN="$TOOLS/bin" go install "github.com/yannh/kubeconform/cmd/kubeconform@$KUBECONFORM_VERSION"
    stamp kubeconform "$KUBECONFORM_VERSION"
fi

K8S_SCHEMAS="$TOOLS/schemas/kubernetes"
K8S_PIN="$KUBERNETES_VALIDATE_VERSION/$KUBERNETES_VERSION"
if ! fresh k8s-schemas "$K8S_PIN" || [ ! -f "$K8S_SCHEMAS/$KUBERNETES_VERSION-local-strict/deployment-apps-v1.json" ]; then
    echo "helm-tools: Kubernetes $KUBERNETES_VERSION schemas from kubernetes-validate $KUBERNETES_VALIDATE_VERSION"
    tmp="$(mktemp -d)"
    trap 'rm -rf "$tmp"' EXIT
    "$PYTHON" -m pip download --quiet --no-deps --dest "$tmp" "kubernetes-validate==$KUBERNETES_VALIDATE_VERSION"
    folder="kubernetes_validate/kubernetes-json-schema/$KUBERNETES_VERSION-local-strict"
    unzip -q "$tmp"/kubernetes_validate-*.whl "$folder/*" -d "$tmp/wheel"
    rm -rf "$K8S_SCHEMAS"
    "$PYTHON" "$ROOT/helm/tools/kubeconform_schemas.py" kubernetes \
        "$tmp/wheel/$folder" "$K8S_SCHEMAS/$KUBERNETES_VERSION-local-strict"
    stamp k8s-schemas "$K8S_PIN"
fi

CRD_SCHEMAS="$TOOLS/schemas/crds"
CRD_PIN="keda $KEDA_VERSION, prometheus-operator $PROMETHEUS_OPERATOR_VERSION"
if ! fresh crd-schemas "$CRD_PIN" || [ ! -d "$CRD_SCHEMAS" ]; then
    echo "helm-tools: CRD schemas from $CRD_PIN"
    module_dir() { go mod download -json "$1" | "$PYTHON" -c 'import json, sys; print(json.load(sys.stdin)["Dir"])'; }
    keda="$(module_dir "github.com/kedacore/keda/v2@$KEDA_VERSION")"
    promop="$(module_dir "github.com/prometheus-operator/prometheus-operator@$PROMETHEUS_OPERATOR_VERSION")"
    rm -rf "$CRD_SCHEMAS"
    "$PYTHON" "$ROOT/helm/tools/kubeconform_schemas.py" crd "$CRD_SCHEMAS" \
        "$keda/config/crd/bases/keda.sh_scaledobjects.yaml" \
        "$keda/config/crd/bases/keda.sh_triggerauthentications.yaml" \
        "$promop/example/prometheus-operator-crd/monitoring.coreos.com_servicemonitors.yaml"
    stamp crd-schemas "$CRD_PIN"
fi

# tests/test_chart.py reads the Kubernetes version to validate against from here.
printf '%s' "$KUBERNETES_VERSION" >"$TOOLS/schemas/kubernetes-version"
# `go install` builds carry no version stamp of their own, so report the pins.
echo "helm-tools: ready: helm $HELM_VERSION, kubeconform $KUBECONFORM_VERSION, Kubernetes $KUBERNETES_VERSION schemas"
