"""deploy/otel-collector/collector.yaml: one traces pipeline whose exporters all exist, poirotd's
reaching the poirotd-otlp Service of deploy/k8s with retries (poirotd answers 429 under load),
and no secret written in the file."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
COLLECTOR = DEPLOY / "otel-collector" / "collector.yaml"


def _config() -> dict[str, Any]:
    config: dict[str, Any] = yaml.safe_load(COLLECTOR.read_text())
    return config


def test_the_pipeline_fans_out_to_poirotd_and_the_observability_backends() -> None:
    config = _config()
    (pipeline,) = config["service"]["pipelines"].values()
    assert pipeline["receivers"] == ["otlp"] and set(pipeline["processors"]) <= set(
        config["processors"]
    )
    assert set(pipeline["exporters"]) == set(config["exporters"])
    assert {"otlphttp/poirotd", "otlphttp/langfuse", "otlp/phoenix"} == set(pipeline["exporters"])


def test_poirotd_is_reached_through_its_service_with_retries() -> None:
    exporter = _config()["exporters"]["otlphttp/poirotd"]
    service = yaml.safe_load((DEPLOY / "k8s" / "poirotd-otlp-service.yaml").read_text())
    (port,) = service["spec"]["ports"]
    assert exporter["endpoint"] == f"http://{service['metadata']['name']}:{port['port']}"
    assert exporter["retry_on_failure"]["enabled"] and exporter["sending_queue"]["enabled"]


def test_no_secret_is_written_in_the_file() -> None:
    headers = _config()["exporters"]["otlphttp/langfuse"]["headers"]
    assert re.fullmatch(r"Basic \$\{env:[A-Z_]+\}", headers["Authorization"])
    assert "sk-lf-" not in COLLECTOR.read_text()
