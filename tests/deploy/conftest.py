"""Fixtures for the deployment artefacts in deploy/: a daemon that has run an investigation, the
spec the Kubernetes manifests carry."""

from __future__ import annotations

import pytest

from poirotd.daemon import Daemon
from tests.support.deploy import K8S, load_yaml_documents, run_one_investigation


@pytest.fixture
async def investigated_daemon(daemon: Daemon) -> Daemon:
    await run_one_investigation(daemon)
    return daemon


@pytest.fixture
def spec_text() -> str:
    """The system spec embedded in the Kubernetes ConfigMap."""
    (configmap,) = load_yaml_documents(K8S / "system-configmap.yaml")
    text: str = configmap["data"]["system.yaml"]
    return text
