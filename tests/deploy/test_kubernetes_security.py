"""The locks of deploy/k8s: cert-manager certificates (fields of cert-manager's v1 API, since
kubernetes-validate has no schema for them), the sidecar serving mutual TLS from the Secret it
mounts, the access file naming every client certificate, and the NetworkPolicy admitting only
the monitored pods, Prometheus and the control software to the sidecar's ports."""

from __future__ import annotations

import copy
import re
from typing import Any

import pytest
import yaml

from poirotd.config import Settings
from tests.support.kubernetes import (
    manifest_container,
    manifest_env,
    manifest_one,
    manifest_resources,
    manifest_selects,
)

ROLES = {"ingest", "reader", "operator", "auditor", "metrics"}
# cert-manager.io/v1 (cert-manager >= 1.12): the fields its CRDs define, the ones used here.
CERTIFICATE_FIELDS = {
    *("secretName", "secretTemplate", "commonName", "dnsNames", "ipAddresses", "uris"),
    *("emailAddresses", "duration", "renewBefore", "usages", "privateKey", "issuerRef", "isCA"),
    *("subject", "keystores", "revisionHistoryLimit", "additionalOutputFormats"),
}
PRIVATE_KEY = {"algorithm": {"RSA", "ECDSA", "Ed25519"}, "rotationPolicy": {"Never", "Always"}}
USAGES = {
    *("signing", "digital signature", "content commitment", "key encipherment"),
    *("key agreement", "data encipherment", "cert sign", "crl sign", "server auth"),
    *("client auth", "code signing", "email protection", "timestamping", "ocsp signing"),
}
ISSUER_TYPES = {"selfSigned", "ca", "acme", "vault", "venafi"}
GO_DURATION = re.compile(r"^(\d+h)?(\d+m)?(\d+s)?$")
SECRET_DIR = "/run/secrets/poirotd"


def _of(kind: str) -> list[dict[str, Any]]:
    return [r for r in manifest_resources() if r["kind"] == kind]


def _hours(duration: str) -> float:
    match = GO_DURATION.fullmatch(duration)
    assert match and duration, f"{duration!r} is not a Go duration in h/m/s"
    h, m, s = (int(part[:-1]) if part else 0 for part in match.groups())
    return h + m / 60 + s / 3600


def _sidecar() -> dict[str, Any]:
    return manifest_container(manifest_one("Deployment", "mas")["spec"]["template"], "poirotd")


def _mounted_secret(container: dict[str, Any], path: str) -> tuple[str, str]:
    """(Secret name, key) of the file at `path` in the container: a mount of a secret volume."""
    pod = manifest_one("Deployment", "mas")["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    for mount in container["volumeMounts"]:
        if path.startswith(mount["mountPath"] + "/"):
            assert "subPath" not in mount, "a subPath mount never sees an updated Secret"
            assert mount.get("readOnly") is True
            return volumes[mount["name"]]["secret"]["secretName"], path.split("/")[-1]
    pytest.fail(f"{path} is in no mounted volume")


def _certificate_for_secret(secret: str) -> dict[str, Any]:
    (found,) = [c for c in _of("Certificate") if c["spec"]["secretName"] == secret]
    return found


def _access_file() -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load(
        manifest_one("Secret", "poirotd-access")["stringData"]["access.yaml"]
    )
    return document


def _certificate_problems(certificate: dict[str, Any], issuers: set[str]) -> list[str]:
    """What in a Certificate cert-manager's v1 API would not take (or, for an unknown field,
    would silently prune)."""
    spec = certificate["spec"]
    problems = [f"unknown field {f}" for f in sorted(set(spec) - CERTIFICATE_FIELDS)]
    problems += [f"unknown usage {u!r}" for u in spec.get("usages", ()) if u not in USAGES]
    for field, allowed in PRIVATE_KEY.items():
        if spec.get("privateKey", {}).get(field, next(iter(allowed))) not in allowed:
            problems.append(f"privateKey.{field}")
    duration = _hours(spec.get("duration", "2160h"))
    if duration < 1 or not 5 / 60 <= _hours(spec.get("renewBefore", "1h")) < duration:
        problems.append("duration under 1 h, or renewBefore not within 5 min .. duration")
    reference = spec["issuerRef"]
    if reference.get("group", "cert-manager.io") != "cert-manager.io":
        problems.append("issuerRef.group")
    if reference.get("kind", "Issuer") != "Issuer" or reference["name"] not in issuers:
        problems.append(f"issuerRef names no Issuer here: {reference}")
    return problems


def test_certificates_and_issuers_use_only_fields_of_cert_managers_v1_api() -> None:
    issuers = {i["metadata"]["name"]: i for i in _of("Issuer")}
    for issuer in issuers.values():
        (kind,) = issuer["spec"]
        assert kind in ISSUER_TYPES
    for certificate in _of("Certificate"):
        assert _certificate_problems(certificate, set(issuers)) == [], certificate["metadata"]


def test_the_certificate_check_catches_a_misspelt_field_and_a_bad_usage() -> None:
    """A negative control: kubectl would only prune the misspelt field, silently."""
    certificate = copy.deepcopy(manifest_one("Certificate", "poirotd-tls"))
    certificate["spec"]["dnsName"] = certificate["spec"].pop("dnsNames")
    certificate["spec"]["usages"].append("server-auth")
    problems = _certificate_problems(certificate, {"poirotd-ca"})
    assert problems == ["unknown field dnsName", "unknown usage 'server-auth'"]


def test_the_ca_issuer_signs_with_a_ca_certificate() -> None:
    for issuer in (i for i in _of("Issuer") if "ca" in i["spec"]):
        ca = _certificate_for_secret(issuer["spec"]["ca"]["secretName"])
        assert ca["spec"]["isCA"] is True
        root = manifest_one("Issuer", ca["spec"]["issuerRef"]["name"])
        assert "selfSigned" in root["spec"] or "ca" in root["spec"]


def test_the_sidecar_serves_mutual_tls_from_its_certificates_secret() -> None:
    sidecar, env = _sidecar(), manifest_env(_sidecar())
    assert "POIROTD_ALLOW_INSECURE_BIND" not in env, "the sidecar must not serve unlocked"
    files = {key: env[f"POIROTD_TLS_{key}_FILE"] for key in ("CERT", "KEY", "CLIENT_CA")}
    mounted = {key: _mounted_secret(sidecar, path) for key, path in files.items()}
    assert {secret for secret, _ in mounted.values()} == {"poirotd-tls"}
    # cert-manager's Secret keys; ca.crt is the issuing CA, which signed the clients too.
    assert {k: key for k, (_, key) in mounted.items()} == {
        "CERT": "tls.crt",
        "KEY": "tls.key",
        "CLIENT_CA": "ca.crt",
    }
    server = _certificate_for_secret("poirotd-tls")["spec"]
    assert {"server auth", "client auth"} <= set(server["usages"])  # client: its own probe
    # Every name a client uses: the probe and the MAS inside the pod, each Service.
    assert "localhost" in server["dnsNames"] and "127.0.0.1" in server["ipAddresses"]
    for service in (s for s in _of("Service") if s["metadata"]["name"].startswith("poirotd-")):
        name = service["metadata"]["name"]
        assert {name, f"{name}.mas.svc"} <= set(server["dnsNames"]), name
    auth = _mounted_secret(sidecar, env["POIROTD_AUTH_FILE"])
    assert auth == ("poirotd-access", "access.yaml")
    assert env["POIROTD_GRPC_REFLECTION"] == "false"
    # The pod's fsGroup (poirotd's group) reads the secret volumes; nobody else does.
    pod = manifest_one("Deployment", "mas")["spec"]["template"]["spec"]
    for volume in (v for v in pod["volumes"] if "secret" in v):
        assert volume["secret"]["defaultMode"] == 0o440, volume["name"]


def test_the_access_file_maps_every_client_certificate_and_keeps_only_token_hashes() -> None:
    access = _access_file()
    assert set(access) <= {"tokens", "certificates"}
    clients = {
        uri: certificate
        for certificate in _of("Certificate")
        if "client auth" in certificate["spec"].get("usages", ())
        and "server auth" not in certificate["spec"]["usages"]
        for uri in certificate["spec"]["uris"]
    }
    assert set(access["certificates"]) == set(clients)
    grants = list(access["certificates"].values()) + list(access["tokens"].values())
    for grant in grants:
        assert set(grant) == {"name", "roles"} and set(grant["roles"]) <= ROLES, grant
    for token in access["tokens"]:
        assert re.fullmatch(r"[0-9a-f]{64}", token), "a token is kept as its SHA-256 only"
    roles = {
        clients[uri]["metadata"]["name"]: set(g["roles"])
        for uri, g in access["certificates"].items()
    }
    assert roles["poirotd-client-mas"] == {"ingest"}
    assert roles["poirotd-client-prometheus"] == {"metrics"}
    assert "auditor" not in roles["poirotd-client-control"], "prompts stay with auditors"


def test_the_mas_streams_with_its_ingest_certificate() -> None:
    mas = manifest_container(manifest_one("Deployment", "mas")["spec"]["template"], "mas")
    env = manifest_env(mas)
    assert env["POIROTD_TARGET"] == f"localhost:{Settings().grpc_port}"  # a name of the cert
    secret, _ = _mounted_secret(mas, env["POIROTD_CLIENT_CERT_FILE"])
    (uri,) = _certificate_for_secret(secret)["spec"]["uris"]
    assert _access_file()["certificates"][uri]["roles"] == ["ingest"]


def test_prometheus_scrapes_over_mutual_tls_with_its_certificate() -> None:
    (endpoint,) = manifest_one("ServiceMonitor", "poirotd")["spec"]["endpoints"]
    assert endpoint["scheme"] == "https"
    tls = endpoint["tlsConfig"]
    assert set(tls) == {"serverName", "ca", "cert", "keySecret"}
    secrets = {tls["ca"]["secret"]["name"], tls["cert"]["secret"]["name"], tls["keySecret"]["name"]}
    assert secrets == {"poirotd-client-prometheus"}
    assert _certificate_for_secret("poirotd-client-prometheus")
    assert tls["serverName"] in _certificate_for_secret("poirotd-tls")["spec"]["dnsNames"]


def test_the_network_policy_admits_only_the_monitored_pods_prometheus_and_control() -> None:
    (policy,) = _of("NetworkPolicy")
    spec = policy["spec"]
    pod = manifest_one("Deployment", "mas")["spec"]["template"]
    assert manifest_selects(spec["podSelector"]["matchLabels"], pod["metadata"]["labels"])
    assert spec["policyTypes"] == ["Ingress"]
    ports = {p["name"]: p["containerPort"] for p in _sidecar()["ports"]}
    admitted: dict[int, list[dict[str, Any]]] = {}
    for rule in spec["ingress"]:
        # A rule without `from` or `ports` would admit every source or every port.
        assert rule["from"] and rule["ports"], rule
        for port in rule["ports"]:
            assert port["port"] in ports.values() and port["protocol"] == "TCP"
            admitted.setdefault(port["port"], []).extend(rule["from"])
    assert set(admitted) == set(ports.values())
    for peer in admitted[ports["metrics"]]:
        assert peer["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": "prometheus"}
        assert "namespaceSelector" in peer
    names = {
        peer["podSelector"]["matchLabels"].get("app.kubernetes.io/name")
        for peer in admitted[ports["grpc"]]
    }
    assert names == {None, "control-software"}
    for peer in admitted[ports["grpc"]]:
        assert "ipBlock" not in peer
