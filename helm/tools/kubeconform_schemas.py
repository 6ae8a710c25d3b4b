"""Prepare JSON schemas that kubeconform can read from disk, with no network.

Usage:
    python kubeconform_schemas.py kubernetes SRC_DIR OUT_DIR
    python kubeconform_schemas.py crd OUT_DIR CRD.yaml...

``kubernetes``: SRC_DIR is one ``v1.X.Y-local-strict`` folder of the kubernetes-validate
wheel (PyPI). Its schemas carry an ``$id`` under kubernetes.io and refer to
``/api/_definitions.json``, which a resolver would try to download; this rewrites each file
without ``$id`` and with the reference relative to the file, so it resolves next door.

``crd``: each served version of each CRD becomes ``OUT_DIR/<group>/<kind>_<version>.json``,
the layout of kubeconform's ``{{ .Group }}/{{ .ResourceKind }}_{{ .ResourceAPIVersion }}.json``
template. The schemas are made strict like kubeconform's ``-strict`` Kubernetes schemas: an
object that lists its properties rejects any other key, unless the CRD says it preserves
unknown fields. Kubernetes' OpenAPI extensions that JSON Schema does not know (``nullable``,
``x-kubernetes-int-or-string``) are rewritten into plain JSON Schema so that validation means
what it means in the API server.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import yaml

DEFINITIONS_REF = '"/api/_definitions.json#'


def localize_kubernetes(src_dir: Path, out_dir: Path) -> int:
    """Copy every schema of ``src_dir`` to ``out_dir`` with file-relative references."""
    out_dir.mkdir(parents=True, exist_ok=True)
    count = 0
    for src in sorted(src_dir.glob("*.json")):
        schema = json.loads(src.read_text(encoding="utf-8"))
        schema.pop("$id", None)
        text = json.dumps(schema).replace(DEFINITIONS_REF, '"_definitions.json#')
        (out_dir / src.name).write_text(text, encoding="utf-8")
        count += 1
    return count


def strict_schema(node: Any) -> Any:
    """Return a copy of an OpenAPI v3 schema node rewritten as strict JSON Schema."""
    if isinstance(node, list):
        return [strict_schema(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {key: strict_schema(value) for key, value in node.items()}
    if out.get("x-kubernetes-int-or-string") and "anyOf" not in out and "type" not in out:
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if out.pop("nullable", False) and isinstance(out.get("type"), str):
        out["type"] = [out["type"], "null"]
    preserves = out.get("x-kubernetes-preserve-unknown-fields", False)
    if "properties" in out and "additionalProperties" not in out and not preserves:
        out["additionalProperties"] = False
    return out


def convert_crd(crd_path: Path, out_dir: Path) -> int:
    """Write one strict schema per served version of every CRD in ``crd_path``."""
    count = 0
    for doc in yaml.safe_load_all(crd_path.read_text(encoding="utf-8")):
        if not doc or doc.get("kind") != "CustomResourceDefinition":
            continue
        spec = doc["spec"]
        kind = spec["names"]["kind"].lower()
        for version in spec["versions"]:
            if not version.get("served", True):
                continue
            schema = strict_schema(version["schema"]["openAPIV3Schema"])
            target = out_dir / spec["group"] / f"{kind}_{version['name']}.json"
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(json.dumps(schema, indent=1, sort_keys=True), encoding="utf-8")
            count += 1
    return count


def main(argv: list[str]) -> int:
    """Command-line entry point; returns the process exit code."""
    if len(argv) == 3 and argv[0] == "kubernetes":
        if localize_kubernetes(Path(argv[1]), Path(argv[2])) == 0:
            sys.stderr.write(f"error: no *.json schema in {argv[1]}\n")
            return 2
        return 0
    if len(argv) >= 3 and argv[0] == "crd":
        for crd in argv[2:]:
            if convert_crd(Path(crd), Path(argv[1])) == 0:
                sys.stderr.write(f"error: no CustomResourceDefinition in {crd}\n")
                return 2
        return 0
    sys.stderr.write(__doc__.split("\n\n")[1] + "\n")
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
