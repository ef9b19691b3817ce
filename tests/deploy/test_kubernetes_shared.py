"""The shared mode's manifests in deploy/k8s/shared: poirotd replicas as a Deployment over one
PostgreSQL (a CloudNativePG Cluster), their Services, PodDisruptionBudget and certificate.
Built-in kinds are schema-valid (kubernetes-validate, strict); the CloudNativePG Cluster and
cert-manager's Certificate, whose schemas are not available offline, are checked field by field;
the whole renders with kustomize when kubectl is installed."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes_validate import utils as kv

from poirotd.config import Settings
from poirotd.daemon import RPC_GRACE_SECONDS
from tests.support.deploy import K8S, load_yaml_documents, require_tool
from tests.support.kubernetes import (
    PROBES,
    manifest_container,
    manifest_env,
    manifest_selects,
    validate_strictly,
)

SHARED = K8S / "shared"
SHARED_MANIFESTS = sorted(p for p in SHARED.glob("*.yaml") if p.name != "kustomization.yaml")
CRD_KINDS = {
    ("postgresql.cnpg.io/v1", "Cluster"),
    ("cert-manager.io/v1", "Certificate"),
    ("monitoring.coreos.com/v1", "ServiceMonitor"),
}
KUBERNETES_VERSIONS = ("1.29.0", kv.latest_version())


def _resources() -> list[dict[str, Any]]:
    return [doc for path in SHARED_MANIFESTS for doc in load_yaml_documents(path)]


def _one(kind: str, name: str | None = None) -> dict[str, Any]:
    (found,) = [
        r
        for r in _resources()
        if r["kind"] == kind and (name is None or r["metadata"]["name"] == name)
    ]
    return found


def _poirotd() -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    deployment = _one("Deployment", "poirotd-replicas")
    pod = deployment["spec"]["template"]
    return deployment, pod, manifest_container(pod, "poirotd")


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("path", SHARED_MANIFESTS, ids=lambda p: p.name)
def test_manifest_validates_against_the_kubernetes_schema(path: Path, version: str) -> None:
    validate_strictly(path, version, CRD_KINDS)


def test_kustomization_lists_every_manifest_and_the_shared_pieces_of_the_sidecar_mode() -> None:
    kustomization = yaml.safe_load((SHARED / "kustomization.yaml").read_text())
    own = sorted(r for r in kustomization["resources"] if not r.startswith("../"))
    assert own == [p.name for p in SHARED_MANIFESTS]
    borrowed = [r for r in kustomization["resources"] if r.startswith("../")]
    for name in borrowed:
        assert (SHARED / name).resolve().is_file(), name
    # The replicas read the sidecar mode's spec ConfigMap, access file and CA issuer.
    assert {
        "../system-configmap.yaml",
        "../poirotd-access-secret.yaml",
        "../certificates.yaml",
    } <= set(borrowed)


def test_kustomize_renders_the_shared_mode() -> None:
    kubectl = require_tool("kubectl")
    result = subprocess.run(
        [kubectl, "kustomize", "--load-restrictor=LoadRestrictionsNone", str(SHARED)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    rendered = [doc for doc in yaml.safe_load_all(result.stdout) if doc]
    names = {(r["kind"], r["metadata"]["name"]) for r in rendered}
    assert {(r["kind"], r["metadata"]["name"]) for r in _resources()} <= names
    assert {("ConfigMap", "poirotd-system"), ("Secret", "poirotd-access")} <= names
    assert ("Issuer", "poirotd-ca") in names
    # Nothing of the sidecar mode's workloads comes along.
    assert not any(kind == "Deployment" and name == "mas" for kind, name in names)


def test_the_replicas_share_the_cloudnativepg_clusters_database() -> None:
    deployment, pod, poirotd = _poirotd()
    cluster = _one("Cluster", "poirotd-db")
    assert deployment["spec"]["replicas"] >= 2
    # The operator's application Secret, <cluster>-app, holds the URL under `uri`.
    (db_url,) = [e for e in poirotd["env"] if e["name"] == "POIROTD_DB_URL"]
    secret = db_url["valueFrom"]["secretKeyRef"]
    assert (secret["name"], secret["key"]) == (f"{cluster['metadata']['name']}-app", "uri")
    assert cluster["spec"]["bootstrap"]["initdb"] == {"database": "poirotd", "owner": "poirotd"}
    # An acknowledged commit survives the primary: a standby confirms it first.
    assert cluster["spec"]["instances"] >= 2
    assert cluster["spec"]["postgresql"]["synchronous"]["number"] >= 1
    # The replica's id is its pod's name; no SQLite file, no volume claim: the store is shared.
    (replica_id,) = [e for e in poirotd["env"] if e["name"] == "POIROTD_REPLICA_ID"]
    assert replica_id["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    env = manifest_env(poirotd)
    assert "POIROTD_DB_PATH" not in env
    assert not any("persistentVolumeClaim" in v for v in pod["spec"]["volumes"])
    assert deployment["spec"]["strategy"]["type"] == "RollingUpdate"
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    # Every setting named exists (a misspelt one would make the daemon refuse to start).
    fields = {f"POIROTD_{name.upper()}" for name in Settings.model_fields}
    assert {e["name"] for e in poirotd["env"]} - {"POIROTD_LLM_API_KEY"} <= fields


def test_replicas_drain_probe_and_stay_locked_like_the_sidecar() -> None:
    _, pod, poirotd = _poirotd()
    env = manifest_env(poirotd)
    defaults = Settings()
    assert env["POIROTD_GRPC_HOST"] == "0.0.0.0" and env["POIROTD_METRICS_HOST"] == "0.0.0.0"
    assert {"POIROTD_TLS_CLIENT_CA_FILE", "POIROTD_AUTH_FILE"} <= set(env)
    assert env["POIROTD_GRPC_REFLECTION"] == "false"
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert poirotd[probe]["exec"]["command"] == PROBES[probe]
    drain = float(env.get("POIROTD_DRAIN_SECONDS", defaults.drain_seconds))
    assert pod["spec"]["terminationGracePeriodSeconds"] > drain + RPC_GRACE_SECONDS
    # A lease outlives a few missed renewals but hands a dead replica's work on within a minute.
    assert 10 <= float(env["POIROTD_LEASE_SECONDS"]) <= 60
    context = poirotd["securityContext"]
    assert context["readOnlyRootFilesystem"] is True and context["runAsNonRoot"] is True
    assert pod["spec"]["securityContext"]["fsGroup"] == context["runAsUser"]
    mounts = {m["mountPath"] for m in poirotd["volumeMounts"]}
    assert Path(env["POIROTD_AUDIT_CHECKPOINT_PATH"]).parent.as_posix() in mounts
    volumes = {v["name"] for v in pod["spec"]["volumes"]}
    assert {m["name"] for m in poirotd["volumeMounts"]} <= volumes


def test_services_and_the_budget_select_the_replicas_and_their_ports() -> None:
    _, pod, poirotd = _poirotd()
    labels = pod["metadata"]["labels"]
    ports = {p["name"]: p["containerPort"] for p in poirotd["ports"]}
    services = [r for r in _resources() if r["kind"] == "Service"]
    assert {s["metadata"]["name"] for s in services} == {"poirotd", "poirotd-replicas"}
    for service in services:
        assert manifest_selects(service["spec"]["selector"], labels)
        for port in service["spec"]["ports"]:
            assert port["targetPort"] in ports, (service["metadata"]["name"], port)
    # The headless Service lets gRPC clients balance calls over the replicas themselves.
    assert _one("Service", "poirotd-replicas")["spec"]["clusterIP"] == "None"
    budget = _one("PodDisruptionBudget")
    assert manifest_selects(budget["spec"]["selector"]["matchLabels"], labels)
    assert budget["spec"]["maxUnavailable"] == 1


def test_the_certificate_names_every_service_and_the_probes_address() -> None:
    certificate = _one("Certificate", "poirotd-replicas-tls")
    _, pod, _ = _poirotd()
    (tls,) = [v for v in pod["spec"]["volumes"] if v["name"] == "poirotd-tls"]
    assert tls["secret"]["secretName"] == certificate["spec"]["secretName"]
    names = set(certificate["spec"]["dnsNames"])
    for service in (r for r in _resources() if r["kind"] == "Service"):
        name = service["metadata"]["name"]
        assert {name, f"{name}.mas.svc"} <= names
    assert "localhost" in names and "client auth" in certificate["spec"]["usages"]
    assert certificate["spec"]["issuerRef"]["name"] == "poirotd-ca"


def test_the_network_policy_admits_the_sidecar_modes_peers_to_the_replicas() -> None:
    _, pod, poirotd = _poirotd()
    policy = _one("NetworkPolicy", "poirotd-replicas")
    assert manifest_selects(policy["spec"]["podSelector"]["matchLabels"], pod["metadata"]["labels"])
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    (sidecar,) = load_yaml_documents(K8S / "networkpolicy.yaml")
    assert policy["spec"]["ingress"] == sidecar["spec"]["ingress"]
    admitted = {p["port"] for rule in policy["spec"]["ingress"] for p in rule["ports"]}
    assert admitted == {p["containerPort"] for p in poirotd["ports"]}


def test_the_servicemonitor_scrapes_each_replica_over_mutual_tls() -> None:
    monitor = _one("ServiceMonitor", "poirotd-replicas")
    (service,) = [
        s
        for s in _resources()
        if s["kind"] == "Service"
        and manifest_selects(monitor["spec"]["selector"]["matchLabels"], s["metadata"]["labels"])
    ]
    assert service["metadata"]["name"] == "poirotd"  # its endpoints: one target per replica
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
    assert endpoint["path"] == "/metrics" and endpoint["scheme"] == "https"
    certificate = _one("Certificate", "poirotd-replicas-tls")
    assert endpoint["tlsConfig"]["serverName"] in certificate["spec"]["dnsNames"]
    (client,) = [
        r
        for r in load_yaml_documents(K8S / "certificates.yaml")
        if r["kind"] == "Certificate"
        and r["spec"]["secretName"] == endpoint["tlsConfig"]["cert"]["secret"]["name"]
    ]
    assert "client auth" in client["spec"]["usages"]
    kustomization = yaml.safe_load((SHARED / "kustomization.yaml").read_text())
    assert "../prometheusrule.yaml" in kustomization["resources"]  # the alerts come along
