"""Fixtures for the deployment artefacts in deploy/: a daemon that has run an investigation, the
spec the Kubernetes manifests carry."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from poirotd.config import SystemSpec
from poirotd.daemon import Daemon
from poirotd.devtools.clinic import clinic
from poirotd.devtools.process import free_port
from tests.support.canary import labelled, write_case
from tests.support.deploy import (
    EDGE,
    K8S,
    access_file,
    load_yaml_documents,
    one_canary,
    require_tool,
    run_one_investigation,
)
from tests.support.openai_server import ScriptedServer, schema_replies


@pytest.fixture(scope="module")
def edge_secrets(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """What deploy/edge/make-certs.sh makes, made once per module in a temporary folder."""
    for tool in ("openssl", "mosquitto_passwd"):
        require_tool(tool)
    out = tmp_path_factory.mktemp("edge") / "secrets"
    result = subprocess.run(
        ["bash", str(EDGE / "make-certs.sh"), str(out)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    return out


@pytest.fixture
def model_server() -> Iterator[ScriptedServer]:
    """An OpenAI-compatible server on loopback answering every schema it is asked."""
    server = ScriptedServer(otherwise=schema_replies(0.0))
    yield server
    server.close()


@pytest.fixture
def daemon_spec(model_server: ScriptedServer, tmp_path: Path) -> SystemSpec:
    """The clinic on the real HTTP backend, so that the model's gauges (one per base URL) are
    exercised too, with canaries over one labelled case (and one file they refuse)."""
    llm = {"backend": "openai", "base_urls": [model_server.url], "model": "qwen-test"}
    cases = tmp_path / "canary-cases"
    write_case(cases, labelled())
    (cases / "broken.json").write_text("{")
    return clinic(llm=llm, canary={"cases": str(cases), "interval_seconds": 1})


@pytest.fixture
def daemon_backend() -> None:
    """The spec's own backend: the real OpenAIBackend."""


@pytest.fixture
def daemon_settings(tmp_path: Path) -> dict[str, Any]:
    """The shared daemon with an access file, so that the access metrics are exercised too, and
    its page, which publishes its URL."""
    return {
        "auth_file": access_file(tmp_path),
        "page_port": free_port(),
        "page_external_url": "https://poirotd.example",
    }


@pytest.fixture
async def investigated_daemon(daemon: Daemon) -> Daemon:
    await run_one_investigation(daemon)
    await one_canary(daemon)
    return daemon


@pytest.fixture
def spec_text() -> str:
    """The system spec embedded in the Kubernetes ConfigMap."""
    (configmap,) = load_yaml_documents(K8S / "system-configmap.yaml")
    text: str = configmap["data"]["system.yaml"]
    return text
