"""The Kubernetes manifests in deploy/k8s: schema-valid (kubernetes-validate, strict), consistent
with each other (selectors, ports, volumes, probes, drain time), and renderable by kustomize
when kubectl is installed."""

from __future__ import annotations

import copy
import importlib.util
import json
import re
import subprocess
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml
from kubernetes_validate import utils as kv

from poirotd.config import Settings
from poirotd.config.loader import load_spec_text
from poirotd.config.spec import OpenAILLMSpec
from poirotd.daemon import RPC_GRACE_SECONDS
from tests.support.deploy import (
    DASHBOARD_FILE,
    DEPLOY,
    K8S,
    require_tool,
)
from tests.support.kubernetes import (
    MANIFESTS,
    PROBES,
    manifest_container,
    manifest_env,
    manifest_one,
    manifest_resources,
    manifest_selects,
    validate_strictly,
)

# Custom resources: kubernetes-validate ships schemas for built-in kinds only and raises
# SchemaNotFoundError for any other kind (it looks up a schema file per kind and finds none), so
# these are skipped there and checked field by field instead: the Prometheus Operator's by the
# tests below and test_alert_rules.py, cert-manager's against the fields of its v1 API.
CRD_KINDS = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"),
    ("monitoring.coreos.com/v1", "PrometheusRule"),
    ("cert-manager.io/v1", "Certificate"),
    ("cert-manager.io/v1", "Issuer"),
}
# Native sidecars (restartPolicy: Always in initContainers) are on by default from 1.29.
KUBERNETES_VERSIONS = ("1.29.0", kv.latest_version())


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_manifest_validates_against_the_kubernetes_schema(path: Path, version: str) -> None:
    validate_strictly(path, version, CRD_KINDS)


def test_strict_validation_catches_a_misspelt_field() -> None:
    """A negative control: the validator really looks inside the pod template."""
    deployment = copy.deepcopy(manifest_one("Deployment", "mas"))
    sidecar = manifest_container(deployment["spec"]["template"], "poirotd")
    sidecar["readinesProbe"] = sidecar.pop("readinessProbe")
    with pytest.raises(kv.ValidationError):
        kv.validate(deployment, kv.latest_version(), strict=True)


def test_kustomization_lists_every_manifest_and_the_dashboard() -> None:
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    resources = kustomization["resources"]
    assert sorted(r for r in resources if r.endswith(".yaml")) == [p.name for p in MANIFESTS]
    assert "../grafana" in resources
    grafana = yaml.safe_load((DEPLOY / "grafana" / "kustomization.yaml").read_text())
    (generator,) = grafana["configMapGenerator"]
    assert generator["files"] == [DASHBOARD_FILE.name]
    assert generator["options"]["labels"]["grafana_dashboard"] == "1"


def test_kustomize_renders_every_resource_with_the_dashboard() -> None:
    kubectl = require_tool("kubectl")
    result = subprocess.run(
        [kubectl, "kustomize", str(K8S)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    rendered = [doc for doc in yaml.safe_load_all(result.stdout) if doc]
    expected = {(r["kind"], r["metadata"]["name"]) for r in manifest_resources()}
    names = {(r["kind"], r["metadata"]["name"]) for r in rendered}
    assert expected <= names
    (dashboard,) = [
        r for r in rendered if r["metadata"].get("labels", {}).get("grafana_dashboard") == "1"
    ]
    assert dashboard["metadata"]["name"].startswith("poirotd-dashboard-")
    assert json.loads(dashboard["data"][DASHBOARD_FILE.name]) == json.loads(
        DASHBOARD_FILE.read_text()
    )
    for resource in rendered:
        if (resource["apiVersion"], resource["kind"]) not in CRD_KINDS:
            kv.validate(resource, kv.latest_version(), strict=True)


def test_services_select_pods_and_reach_their_ports() -> None:
    pods = {
        d["metadata"]["name"]: d["spec"]["template"]
        for d in manifest_resources()
        if d["kind"] == "Deployment"
    }
    for service in (r for r in manifest_resources() if r["kind"] == "Service"):
        selected = [
            pod
            for pod in pods.values()
            if manifest_selects(service["spec"]["selector"], pod["metadata"]["labels"])
        ]
        assert len(selected) == 1, service["metadata"]["name"]
        pod = selected[0]
        ports = [
            p
            for c in pod["spec"].get("initContainers", []) + pod["spec"]["containers"]
            for p in c.get("ports", [])
        ]
        for port in service["spec"]["ports"]:
            target = port["targetPort"]
            key = "name" if isinstance(target, str) else "containerPort"
            assert any(p.get(key) == target for p in ports), (service["metadata"]["name"], target)


def test_deployment_selectors_match_their_templates() -> None:
    for deployment in (r for r in manifest_resources() if r["kind"] == "Deployment"):
        selector = deployment["spec"]["selector"]["matchLabels"]
        assert manifest_selects(selector, deployment["spec"]["template"]["metadata"]["labels"])


def test_servicemonitors_select_a_service_and_name_its_port() -> None:
    services = [r for r in manifest_resources() if r["kind"] == "Service"]
    monitors = [r for r in manifest_resources() if r["kind"] == "ServiceMonitor"]
    assert {m["metadata"]["name"] for m in monitors} == {"poirotd", "vllm"}
    for monitor in monitors:
        spec = monitor["spec"]
        assert set(spec) <= {"selector", "endpoints", "namespaceSelector", "jobLabel"}
        (service,) = [
            s
            for s in services
            if manifest_selects(spec["selector"]["matchLabels"], s["metadata"]["labels"])
        ]
        port_names = {p["name"] for p in service["spec"]["ports"]}
        for endpoint in spec["endpoints"]:
            assert set(endpoint) <= {
                *("port", "path", "interval", "scrapeTimeout", "scheme", "tlsConfig")
            }
            assert endpoint["port"] in port_names
            assert endpoint["path"] == "/metrics"
            assert re.fullmatch(r"\d+s", endpoint["interval"])
    poirotd = manifest_one("ServiceMonitor", "poirotd")
    (service,) = [
        s
        for s in services
        if manifest_selects(poirotd["spec"]["selector"]["matchLabels"], s["metadata"]["labels"])
    ]
    assert service["metadata"]["name"] == "poirotd-metrics"
    assert service["spec"]["ports"][0]["port"] == Settings().metrics_port


def test_volumes_refer_to_configmaps_and_claims_that_exist() -> None:
    configmaps = {r["metadata"]["name"] for r in manifest_resources() if r["kind"] == "ConfigMap"}
    claims = {
        r["metadata"]["name"] for r in manifest_resources() if r["kind"] == "PersistentVolumeClaim"
    }
    for deployment in (r for r in manifest_resources() if r["kind"] == "Deployment"):
        pod = deployment["spec"]["template"]["spec"]
        volumes = {v["name"]: v for v in pod["volumes"]}
        for container in pod.get("initContainers", []) + pod["containers"]:
            for mount in container.get("volumeMounts", []):
                assert mount["name"] in volumes, mount
        for volume in volumes.values():
            if "configMap" in volume:
                assert volume["configMap"]["name"] in configmaps
            if "persistentVolumeClaim" in volume:
                assert volume["persistentVolumeClaim"]["claimName"] in claims


def test_poirotd_sidecar_probes_drain_and_filesystem() -> None:
    deployment = manifest_one("Deployment", "mas")
    pod = deployment["spec"]["template"]
    sidecar = manifest_container(pod, "poirotd")
    env = manifest_env(sidecar)
    defaults = Settings()

    # A native sidecar: an init container that keeps running.
    assert sidecar in pod["spec"]["initContainers"] and sidecar["restartPolicy"] == "Always"
    # Reachable from Prometheus and the control software (TLS: see the tests further down).
    assert env["POIROTD_GRPC_HOST"] == "0.0.0.0" and env["POIROTD_METRICS_HOST"] == "0.0.0.0"
    ports = {p["name"]: p["containerPort"] for p in sidecar["ports"]}
    # OTLP/HTTP, off by default (port 0), open for a Collector (the poirotd-otlp Service).
    assert env["POIROTD_OTLP_HTTP_HOST"] == "0.0.0.0"
    otlp_http = int(env["POIROTD_OTLP_HTTP_PORT"])
    # The page, off by default too, served to operators' browsers (the poirotd-page Service).
    assert env["POIROTD_PAGE_HOST"] == "0.0.0.0"
    assert env["POIROTD_PAGE_EXTERNAL_URL"].startswith("https://")
    assert ports == {
        "grpc": defaults.grpc_port,
        "metrics": defaults.metrics_port,
        "otlp-http": otlp_http,
        "page": int(env["POIROTD_PAGE_PORT"]),
    }
    # gRPC health over the daemon's own TLS, from inside the container (poirotd.cli.probe asks
    # localhost on the default gRPC port): the kubelet's grpc probe has no TLS.
    assert importlib.util.find_spec("poirotd.cli.probe") is not None
    assert "POIROTD_GRPC_PORT" not in env
    # Ready while the store answers; alive until it drains (a restart cures no store outage).
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert sidecar[probe]["exec"]["command"] == PROBES[probe], probe
        assert sidecar[probe]["timeoutSeconds"] >= 3, "the probe's own deadline is 3 s"
    # The pod outlives the drain: investigations, then open RPCs.
    drain = float(env.get("POIROTD_DRAIN_SECONDS", defaults.drain_seconds))
    assert deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] > (
        drain + RPC_GRACE_SECONDS
    )
    # Read-only root, non-root, the database on the writable data volume.
    context = sidecar["securityContext"]
    assert context["readOnlyRootFilesystem"] is True and context["runAsNonRoot"] is True
    assert context["allowPrivilegeEscalation"] is False
    assert context["capabilities"]["drop"] == ["ALL"]
    mounts = {m["mountPath"]: m for m in sidecar["volumeMounts"]}
    assert Path(env["POIROTD_DB_PATH"]).parent.as_posix() in mounts
    assert not mounts["/var/lib/poirotd"].get("readOnly", False)
    assert mounts["/etc/poirotd"]["readOnly"] is True
    assert pod["spec"]["securityContext"]["fsGroup"] == context["runAsUser"]
    assert {"requests", "limits"} <= set(sidecar["resources"])
    # One SQLite writer on a ReadWriteOnce volume.
    assert deployment["spec"]["strategy"]["type"] == "Recreate"


def test_vllm_probes_args_and_gpu() -> None:
    deployment = manifest_one("Deployment", "vllm")
    container = manifest_container(deployment["spec"]["template"], "vllm")
    assert container["command"] == ["vllm", "serve"]
    args = container["args"]
    for flag in (
        "--enable-auto-tool-choice",
        "--enable-prefix-caching",
        "--enable-prompt-tokens-details",
    ):
        assert flag in args
    assert any(a.startswith("--tool-call-parser=") for a in args)
    # Ready means the model is served, not merely that the process is up.
    assert container["readinessProbe"]["httpGet"]["path"] == "/v1/models"
    startup = container["startupProbe"]
    assert startup["httpGet"]["path"] == "/v1/models"
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 600
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1


def test_system_spec_configmap_is_valid_and_points_at_the_vllm_service(spec_text: str) -> None:
    spec = load_spec_text(spec_text, "system-configmap.yaml")
    assert isinstance(spec.llm, OpenAILLMSpec)
    url = urlsplit(str(spec.llm.base_urls[0]))
    service = manifest_one("Service", "vllm")
    assert url.hostname == service["metadata"]["name"]
    assert url.port == service["spec"]["ports"][0]["port"]
    vllm = manifest_container(manifest_one("Deployment", "vllm")["spec"]["template"], "vllm")
    assert spec.llm.model == vllm["args"][0], "the spec must name the model vLLM serves"
    (max_len,) = [a.split("=", 1)[1] for a in vllm["args"] if a.startswith("--max-model-len=")]
    assert spec.llm.context_tokens <= int(max_len)
