#!/usr/bin/env bash
# Install the pinned tools that tests/chart/ needs into the git-ignored .tools/:
#   .tools/bin/helm, .tools/bin/kubeconform       built with `go install` from the Go module proxy
#   .tools/schemas/kubernetes/<v>-local-strict/   Kubernetes JSON schemas (PyPI: kubernetes-validate),
#                                                 rewritten to resolve on disk
#   .tools/schemas/crds/<group>/<kind>_<v>.json   KEDA ScaledObject/TriggerAuthentication,
#                                                 ServiceMonitor and PrometheusRule schemas,
#                                                 converted from the CRD YAMLs in their Go modules
# Only package registries are reachable, so nothing is fetched from anywhere else. Everything
# fetched is checked against a hash pinned below: each Go module's h1: sum (the one
# sum.golang.org records; a module's go.sum then pins its dependencies), the wheel's sha256
# (pip --require-hashes). Idempotent: each piece carries a stamp with its version, and a
# second run with the same pins does nothing.
set -euo pipefail

HELM_VERSION=v3.22.0
KUBECONFORM_VERSION=v0.8.0
KUBERNETES_VALIDATE_VERSION=1.37.0 # ships the schemas of Kubernetes 1.25 .. 1.37
KUBERNETES_VERSION=v1.33.0         # tests/chart/ renders and validates for this version
KEDA_VERSION=v2.21.0
PROMETHEUS_OPERATOR_VERSION=v0.85.0
# The hashes of what the pins above fetch. A new version needs its hash here: for a Go module,
# `go mod download -json MODULE@VERSION` prints it as Sum; for the wheel, PyPI's file page.
HELM_SUM=h1:n1if5iQgHYsujPAcO5oonH/KiSNUmqmUF0iGVjSF3AU=
KUBECONFORM_SUM=h1:loDYd3a3spjIFrauqW67CDKF55Oo9R6uvC8AvpVd4ug=
KEDA_SUM=h1:R6z2HZvstK4RLUMxroNACzBj74xGxt3kG59b5Xc+Xps=
PROMETHEUS_OPERATOR_SUM=h1:M5xLCLEoaW2IJfnuCwFzzpL+jSVQu3KGT84Pye+fW8s=
KUBERNETES_VALIDATE_SHA256=85136d018a27b50ec7fc049d902bfa5193f5976807e6c0f408e3ab6fe078cad9

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TOOLS="$ROOT/.tools"
STAMPS="$TOOLS/stamps"
PYTHON="${PYTHON:-$ROOT/.venv/bin/python}"
[ -x "$PYTHON" ] || PYTHON=python3
mkdir -p "$TOOLS/bin" "$STAMPS"

# go_module FIELD MODULE@VERSION SUM: fetch a module from the Go module proxy into the module
# cache, fail unless its hash is SUM, and print one field of `go mod download -json` (Dir: its
# source tree, GoMod: its go.mod).
go_module() {
    go mod download -json "$2" | "$PYTHON" -c 'import json, sys
field, name, pinned = sys.argv[1:]
found = json.load(sys.stdin)
if found.get("Sum") != pinned:
    sys.exit("helm-tools: " + name + " has hash " + str(found.get("Sum")) + ", pinned " + pinned)
print(found[field])' "$1" "$2" "$3"
}

# fresh NAME VERSION: true when the stamp of NAME already records VERSION.
fresh() { [ -f "$STAMPS/$1" ] && [ "$(cat "$STAMPS/$1")" = "$2" ]; }
stamp() { printf '%s' "$2" >"$STAMPS/$1"; }

if ! fresh helm "$HELM_VERSION+ldflags" || [ ! -x "$TOOLS/bin/helm" ]; then
    echo "helm-tools: go install helm $HELM_VERSION"
    # The ldflags of helm's own Makefile: without them `helm version` is blank and helm assumes
    # Kubernetes 1.20 (too old for the chart's kubeVersion) where no --kube-version is given.
    # The Kubernetes version is the one of the client-go that this helm release builds with.
    helm_mod="$(go_module GoMod "helm.sh/helm/v3@$HELM_VERSION" "$HELM_SUM")"
    k8s_minor="$(sed -n 's#^[[:space:]]*k8s.io/client-go v0\.\([0-9]*\)\..*#\1#p' "$helm_mod")"
    [ -n "$k8s_minor" ] || { echo "helm-tools: no k8s.io/client-go in $helm_mod" >&2; exit 1; }
    GOBIN="$TOOLS/bin" go install -ldflags "-s -w \
        -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION \
        -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor=1 \
        -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor=$k8s_minor \
        -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=1 \
        -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=$k8s_minor" \
        "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
    stamp helm "$HELM_VERSION+ldflags"
fi

if ! fresh kubeconform "$KUBECONFORM_VERSION+ldflags" || [ ! -x "$TOOLS/bin/kubeconform" ]; then
    echo "helm-tools: go install kubeconform $KUBECONFORM_VERSION"
    go_module Dir "github.com/yannh/kubeconform@$KUBECONFORM_VERSION" "$KUBECONFORM_SUM" >/dev/null
    GOBIN="$TOOLS/bin" go install -ldflags "-s -w -X main.version=$KUBECONFORM_VERSION" \
        "github.com/yannh/kubeconform/cmd/kubeconform@$KUBECONFORM_VERSION"
    stamp kubeconform "$KUBECONFORM_VERSION+ldflags"
fi

K8S_SCHEMAS="$TOOLS/schemas/kubernetes"
K8S_PIN="$KUBERNETES_VALIDATE_VERSION/$KUBERNETES_VERSION"
if ! fresh k8s-schemas "$K8S_PIN" || [ ! -f "$K8S_SCHEMAS/$KUBERNETES_VERSION-local-strict/deployment-apps-v1.json" ]; then
    echo "helm-tools: Kubernetes $KUBERNETES_VERSION schemas from kubernetes-validate $KUBERNETES_VALIDATE_VERSION"
    tmp="$(mktemp -d)"
    trap 'rm -rf "$tmp"' EXIT
    printf 'kubernetes-validate==%s --hash=sha256:%s\n' "$KUBERNETES_VALIDATE_VERSION" \
        "$KUBERNETES_VALIDATE_SHA256" >"$tmp/requirements.txt"
    "$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: --require-hashes \
        --requirement "$tmp/requirements.txt" --dest "$tmp"
    folder="kubernetes_validate/kubernetes-json-schema/$KUBERNETES_VERSION-local-strict"
    "$PYTHON" -c 'import sys, zipfile
wheel, folder, out = sys.argv[1:]
with zipfile.ZipFile(wheel) as zf:
    zf.extractall(out, [n for n in zf.namelist() if n.startswith(folder + "/")])' \
        "$(ls "$tmp"/kubernetes_validate-*.whl)" "$folder" "$tmp/wheel"
    rm -rf "$K8S_SCHEMAS"
    "$PYTHON" "$ROOT/helm/tools/kubeconform_schemas.py" kubernetes \
        "$tmp/wheel/$folder" "$K8S_SCHEMAS/$KUBERNETES_VERSION-local-strict"
    stamp k8s-schemas "$K8S_PIN"
fi

CRD_SCHEMAS="$TOOLS/schemas/crds"
CRD_PIN="keda $KEDA_VERSION, prometheus-operator $PROMETHEUS_OPERATOR_VERSION (servicemonitors, prometheusrules)"
if ! fresh crd-schemas "$CRD_PIN" || [ ! -d "$CRD_SCHEMAS" ]; then
    echo "helm-tools: CRD schemas from $CRD_PIN"
    keda="$(go_module Dir "github.com/kedacore/keda/v2@$KEDA_VERSION" "$KEDA_SUM")"
    promop="$(go_module Dir "github.com/prometheus-operator/prometheus-operator@$PROMETHEUS_OPERATOR_VERSION" \
        "$PROMETHEUS_OPERATOR_SUM")"
    rm -rf "$CRD_SCHEMAS"
    "$PYTHON" "$ROOT/helm/tools/kubeconform_schemas.py" crd "$CRD_SCHEMAS" \
        "$keda/config/crd/bases/keda.sh_scaledobjects.yaml" \
        "$keda/config/crd/bases/keda.sh_triggerauthentications.yaml" \
        "$promop/example/prometheus-operator-crd/monitoring.coreos.com_servicemonitors.yaml" \
        "$promop/example/prometheus-operator-crd/monitoring.coreos.com_prometheusrules.yaml"
    stamp crd-schemas "$CRD_PIN"
fi

# tests/chart/ reads the Kubernetes version to validate against from here.
printf '%s' "$KUBERNETES_VERSION" >"$TOOLS/schemas/kubernetes-version"
echo "helm-tools: ready: helm $("$TOOLS/bin/helm" version --short), kubeconform $("$TOOLS/bin/kubeconform" -v)," \
    "Kubernetes $KUBERNETES_VERSION schemas"
