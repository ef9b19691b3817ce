"""ECHO, ErrorProbe and the ensemble on the embedded model (SmolLM2-135M), through an in-process
daemon, on a small session: each completes with a record whose method's findings are valid.

A 135M model's attributions are not meaningful; what these show is that every request of each
method fits the model, that its schemas compile to llama.cpp grammars, and that the answers
decoded under them pass the methods' own parsers.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from poirotd.api.poirot.v1 import poirot_pb2 as pb
from poirotd.client.wire import PoirotClient
from poirotd.config import SystemSpec
from poirotd.protocol.echo.consensus import Consensus
from poirotd.protocol.echo.schemas import Analysis
from poirotd.protocol.errorprobe.memory import Diagnosis
from poirotd.protocol.errorprobe.schemas import Hypothesis
from tests.support.daemon import client_of, in_process_daemon

pytestmark = pytest.mark.slow

SPEC = SystemSpec.model_validate(
    {
        "system": {"name": "clinic", "description": "Two agents plan therapy on an exoskeleton."},
        "agents": [
            {"id": "doctor", "name": "Doctor", "system_prompt": "You diagnose the patient."},
            {"id": "physio", "name": "Physio", "system_prompt": "You set the exercise dose."},
        ],
        "components": [
            {"id": "exo", "name": "Exoskeleton", "type": "hardware", "description": "Gait robot."}
        ],
        "hazard_space": {
            "regions": [
                {
                    "id": "doctor",
                    "name": "Doctor",
                    "type": "agent",
                    "description": "Wrong diagnosis.",
                },
                {"id": "physio", "name": "Physio", "type": "agent", "description": "Wrong dose."},
                {
                    "id": "exo",
                    "name": "Exoskeleton",
                    "type": "hardware",
                    "description": "Bad sensor.",
                },
            ]
        },
        "protocol": {
            "echo": {"analysts": 2},
            "errorprobe": {"max_tags": 3, "max_hypotheses": 2, "max_evidence": 2},
            "ensemble": {"members": ["baseline", "echo", "errorprobe"]},
        },
    }
)
LINES = (
    ("doctor", "physio", "The patient is 9 years old and can walk for 20 minutes."),
    ("physio", "doctor", "Then I plan 60 minutes of walking at full speed."),
    ("doctor", "physio", "Agreed, start the session now."),
    ("physio", "", "Error: the exoskeleton stopped, the knee angle reads 270 degrees."),
)


@pytest.fixture
async def client(tmp_path: Path) -> AsyncIterator[PoirotClient]:
    """A daemon on the spec's LLM: the embedded default (each daemon loads and frees it)."""
    async with in_process_daemon(tmp_path, SPEC) as daemon, client_of(daemon) as c:
        yield c


async def investigate(client: PoirotClient, method: str) -> pb.Investigation:
    start = pb.IngestRequest(session_start=pb.SessionStart(session_id="s1", system="clinic"))
    messages = [
        pb.IngestRequest(
            agent_message=pb.AgentMessage(
                session_id="s1",
                index=i,
                kind=pb.MESSAGE_KIND_AGENT,
                sender=sender,
                recipient=recipient,
                content=text,
            )
        )
        for i, (sender, recipient, text) in enumerate(LINES)
    ]
    await client.send([start, *messages])
    queued = await client.trigger("s1", "the exoskeleton stopped", method=method)
    _ = [e async for e in client.watch(queued.investigation_id)]
    return await client.get(queued.investigation_id)


def succeeded(record: pb.Investigation) -> dict[str, object]:
    assert record.state == pb.INVESTIGATION_STATE_SUCCEEDED, record.error
    assert len(record.attribution.scores) == 3 and len(record.attribution.decision) == 3
    assert record.llm_calls > 0
    findings: dict[str, object] = json.loads(record.findings_json)
    return findings


@pytest.mark.timeout(600)  # 17 s on a busy 2-core box (embedded model)
async def test_echo_on_the_embedded_model(client: PoirotClient) -> None:
    findings = succeeded(await investigate(client, "echo"))
    Consensus.model_validate(findings["consensus"])
    analyses = findings["analyses"]
    assert isinstance(analyses, dict) and len(analyses) == 2
    for analysis in analyses.values():
        if analysis is not None:
            Analysis.model_validate(analysis)


@pytest.mark.timeout(600)  # 25 s on a busy 2-core box (embedded model)
async def test_errorprobe_on_the_embedded_model(client: PoirotClient) -> None:
    findings = succeeded(await investigate(client, "errorprobe"))
    Diagnosis.model_validate(findings["diagnosis"])
    hypotheses = findings["hypotheses"]
    assert isinstance(hypotheses, list) and 1 <= len(hypotheses) <= 2
    for h in hypotheses:
        Hypothesis.model_validate({k: h[k] for k in ("region", "step", "mode", "claim")})


@pytest.mark.timeout(900)  # 43 s on a busy 2-core box (embedded model)
async def test_the_ensemble_on_the_embedded_model(client: PoirotClient) -> None:
    findings = succeeded(await investigate(client, "ensemble"))
    members = findings["members"]
    assert isinstance(members, list)
    assert [m["method"] for m in members] == ["baseline", "echo", "errorprobe"]
    assert any(m["attribution"] for m in members)
