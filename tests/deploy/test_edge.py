"""The edge-box artefacts in deploy/edge: compose file, systemd unit, Prometheus config, Grafana
provisioning. Docker is not run here (no daemon, no registry access); what can run, runs: the
poirotd healthcheck command against a live daemon, promtool, systemd-analyze."""

from __future__ import annotations

import asyncio
import configparser
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from poirotd.config import Settings
from poirotd.config.loader import load_spec
from poirotd.config.spec import OpenAILLMSpec
from poirotd.daemon import RPC_GRACE_SECONDS, Daemon
from poirotd.devtools.process import free_port
from tests.support.deploy import (
    DASHBOARD_FILE,
    DEPLOY,
    EDGE,
    RULES_FILE,
    require_tool,
)

COMPOSE_FILE = EDGE / "compose.yaml"
UNIT_FILE = EDGE / "poirotd.service"


def _compose() -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load(COMPOSE_FILE.read_text())
    return document


def _seconds(duration: str) -> float:
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}
    for suffix in sorted(units, key=len, reverse=True):
        if duration.endswith(suffix):
            return float(duration.removesuffix(suffix)) * units[suffix]
    return float(duration)


def test_compose_has_every_service_with_a_healthcheck() -> None:
    services = _compose()["services"]
    assert set(services) == {"mosquitto", "vllm", "poirotd", "prometheus", "grafana"}
    for name, service in services.items():
        assert service["healthcheck"]["test"][0] == "CMD", name
        assert service["restart"] == "unless-stopped", name


def test_compose_bind_mounts_exist_and_named_volumes_are_declared(edge_secrets: Path) -> None:
    """Mounts of ./secrets are what make-certs.sh makes (git keeps none of it)."""
    compose = _compose()
    for name, service in compose["services"].items():
        for volume in service.get("volumes", []):
            source = volume.split(":", 1)[0]
            if source.startswith("./secrets/"):
                assert (edge_secrets / source.removeprefix("./secrets/")).is_dir(), source
            elif source.startswith("."):
                assert (EDGE / source).exists(), f"{name}: {source}"
            else:
                assert source in compose["volumes"], f"{name}: {source}"
    build = compose["services"]["poirotd"]["build"]
    assert (EDGE / build["context"] / build["dockerfile"]).resolve() == DEPLOY / "Dockerfile"


def test_compose_uses_the_one_rule_file_and_the_one_dashboard() -> None:
    services = _compose()["services"]
    mounts = services["prometheus"]["volumes"] + services["grafana"]["volumes"]
    sources = {(EDGE / m.split(":", 1)[0]).resolve() for m in mounts if m.startswith(".")}
    assert {RULES_FILE, DASHBOARD_FILE} <= sources


def test_compose_poirotd_outlives_its_drain_and_runs_read_only() -> None:
    poirotd = _compose()["services"]["poirotd"]
    drain = float(poirotd["environment"].get("POIROTD_DRAIN_SECONDS", Settings().drain_seconds))
    assert _seconds(poirotd["stop_grace_period"]) > drain + RPC_GRACE_SECONDS
    assert poirotd["read_only"] is True
    assert any(v.endswith(":/var/lib/poirotd") for v in poirotd["volumes"])


def test_edge_system_spec_is_valid_and_names_the_model_vllm_serves() -> None:
    spec = load_spec(EDGE / "system.yaml")
    assert isinstance(spec.llm, OpenAILLMSpec)
    vllm = _compose()["services"]["vllm"]
    assert spec.llm.model == vllm["command"][0]
    assert str(spec.llm.base_urls[0]).startswith("http://vllm:8000")


def _healthcheck(port: int) -> subprocess.CompletedProcess[str]:
    """compose.yaml's poirotd healthcheck, run with this venv's Python on another port, in
    plaintext as the in-process daemon serves (the probe over mutual TLS: test_probe.py)."""
    test = _compose()["services"]["poirotd"]["healthcheck"]["test"]
    assert test == ["CMD", "python", "-m", "poirotd.cli.probe"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("POIROTD_")}
    return subprocess.run(
        [sys.executable, *test[2:], f"127.0.0.1:{port}"],
        capture_output=True,
        text=True,
        timeout=30,
        env=env,
    )


async def test_compose_poirotd_healthcheck_passes_on_a_serving_daemon(daemon: Daemon) -> None:
    # Off the event loop: the daemon serves on this loop.
    result = await asyncio.to_thread(_healthcheck, daemon.grpc_port)
    assert result.returncode == 0, result.stderr


def test_compose_poirotd_healthcheck_fails_without_a_daemon() -> None:
    assert _healthcheck(free_port()).returncode != 0


def test_edge_prometheus_config_passes_promtool(tmp_path: Path, edge_secrets: Path) -> None:
    promtool = require_tool("promtool")
    # compose.yaml mounts both files side by side in /etc/prometheus, and Prometheus' client
    # certificate in /etc/prometheus/tls (promtool checks that the files exist).
    (tmp_path / "prometheus.yml").write_text((EDGE / "prometheus.yml").read_text())
    (tmp_path / "poirot-alerts.yaml").write_text(RULES_FILE.read_text())
    shutil.copytree(edge_secrets / "prometheus", tmp_path / "tls")
    result = subprocess.run(
        [promtool, "check", "config", str(tmp_path / "prometheus.yml")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout + result.stderr


def test_grafana_provisioning_points_at_prometheus_and_the_dashboard_folder() -> None:
    provisioning = EDGE / "grafana" / "provisioning"
    (source,) = yaml.safe_load((provisioning / "datasources" / "prometheus.yaml").read_text())[
        "datasources"
    ]
    assert source["type"] == "prometheus" and source["url"] == "http://prometheus:9090"
    (provider,) = yaml.safe_load((provisioning / "dashboards" / "poirotd.yaml").read_text())[
        "providers"
    ]
    grafana = _compose()["services"]["grafana"]
    dashboard_mount = next(v for v in grafana["volumes"] if DASHBOARD_FILE.name in v)
    assert dashboard_mount.split(":")[1].startswith(provider["options"]["path"] + "/")


def _unit() -> configparser.RawConfigParser:
    # strict=False: systemd allows repeated keys (Environment=).
    parser = configparser.RawConfigParser(strict=False)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read_string(UNIT_FILE.read_text())
    return parser


def test_systemd_unit_runs_hardened_and_outlives_the_drain() -> None:
    service = _unit()["Service"]
    assert service["Type"] == "exec" and service["User"] == "poirotd"
    assert service["Restart"] == "on-failure"
    assert service["ExecStart"].endswith("poirotd run --config /etc/poirotd/system.yaml")
    assert _seconds(service["TimeoutStopSec"]) > Settings().drain_seconds + RPC_GRACE_SECONDS
    assert service["StateDirectory"] == "poirotd"
    assert service["ReadWritePaths"] == "/var/lib/poirotd"
    for key in ("NoNewPrivileges", "ProtectHome", "PrivateTmp", "PrivateDevices"):
        assert service[key] == "yes", key
    assert service["ProtectSystem"] == "strict"


def test_systemd_analyze_verify_accepts_the_unit(tmp_path: Path) -> None:
    analyze = require_tool("systemd-analyze")
    poirotd = Path(sys.executable).parent / "poirotd"
    if not poirotd.exists():
        pytest.skip("the poirotd entry point is not installed in this environment")
    # verify checks that ExecStart exists: point it at this environment's entry point.
    unit = tmp_path / "poirotd.service"
    unit.write_text(UNIT_FILE.read_text().replace("/opt/poirotd/venv/bin/poirotd", str(poirotd)))
    result = subprocess.run(
        [analyze, "verify", str(unit)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    # Unknown or misspelt directives are only warnings: refuse those too.
    assert result.stderr.strip() == "" and result.stdout.strip() == ""
