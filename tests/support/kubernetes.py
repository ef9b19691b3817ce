"""Reading the Kubernetes manifests in deploy/k8s: their objects, containers and selectors."""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path
from typing import Any

import pytest
from kubernetes_validate import utils as kv

from tests.support.deploy import (
    K8S,
    load_yaml_documents,
)

# How poirotd's containers are probed: ready while its store answers, alive until it drains.
_PROBE = ["python", "-m", "poirotd.cli.probe"]
PROBES = {
    "startupProbe": _PROBE,
    "readinessProbe": _PROBE,
    "livenessProbe": [*_PROBE, "--service", "poirotd.live"],
}
MANIFESTS = sorted(p for p in K8S.glob("*.yaml") if p.name != "kustomization.yaml")


def manifest_resources() -> list[dict[str, Any]]:
    return [doc for path in MANIFESTS for doc in load_yaml_documents(path)]


def manifest_one(kind: str, name: str) -> dict[str, Any]:
    (found,) = [
        r for r in manifest_resources() if r["kind"] == kind and r["metadata"]["name"] == name
    ]
    return found


def manifest_container(pod: dict[str, Any], name: str) -> dict[str, Any]:
    every: list[dict[str, Any]] = pod["spec"].get("initContainers", []) + pod["spec"]["containers"]
    (found,) = [c for c in every if c["name"] == name]
    return found


def manifest_env(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}


def manifest_selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(key) == value for key, value in selector.items())


def validate_strictly(path: Path, version: str, custom_kinds: Collection[tuple[str, str]]) -> None:
    """Every object of the file against the Kubernetes `version` schema (strict: no unknown
    field); kinds kubernetes-validate has no schema for must be among `custom_kinds`
    (apiVersion, kind), which the caller checks otherwise."""
    for resource in load_yaml_documents(path):
        key = (resource["apiVersion"], resource["kind"])
        try:
            kv.validate(resource, version, strict=True)
        except kv.SchemaNotFoundError:
            assert key in custom_kinds, f"{path.name}: no schema for {key}"
        except kv.ValidationError as error:
            where = ".".join(str(p) for p in error.path)
            pytest.fail(
                f"{path.name}: {resource['kind']}/{resource['metadata']['name']}: "
                f"{where}: {error.message}"
            )
