"""ECHO, ErrorProbe and the ensemble end to end through an in-process daemon: gRPC Trigger with
`method=`, the record, events, exchanges, metrics and audit, ConfirmOutcome teaching ErrorProbe's
memory, and `poirotd memory` on the same database. The LLM is scripted (it fills whatever schema
it is asked for): these tests are about orchestration, not about model answers."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from poirotd.api.poirot.v1 import poirot_pb2 as pb
from poirotd.cli.main import app
from poirotd.client.wire import PoirotClient
from poirotd.config.spec import EchoSpec
from poirotd.daemon import Daemon
from poirotd.devtools.answers import fill
from poirotd.devtools.clinic import CLINIC
from poirotd.llm import ChatMessage
from poirotd.llm.scripted import ScriptedBackend
from poirotd.store.audit import verify
from tests.support.daemon import client_of, in_process_daemon

# test_grpc_api's clinic, with a panel of two analysts.
SPEC = CLINIC.model_copy(
    update={"protocol": CLINIC.protocol.model_copy(update={"echo": EchoSpec(analysts=2)})}
)
QUOTABLE = "step of the therapy plan"


class Filler:
    """Fills every schema; the Investigator quotes the log truly or not, as the test says."""

    def __init__(self) -> None:
        self.quote_truly = True
        self.backend = ScriptedBackend(self)

    def __call__(self, messages: Sequence[ChatMessage], schema: dict[str, Any] | None) -> str:
        if schema is None:
            return "I saw nothing unusual."
        answer = fill(schema)
        if "claims" in schema.get("properties", {}):
            answer["claims"][0]["text"] = QUOTABLE if self.quote_truly else "words nobody wrote"
        return json.dumps(answer)


@pytest.fixture
async def filler() -> Filler:
    return Filler()


@pytest.fixture
async def daemon(tmp_path: Path, filler: Filler) -> AsyncIterator[Daemon]:
    async with in_process_daemon(tmp_path, SPEC, filler.backend) as d:
        yield d


@pytest.fixture
async def client(daemon: Daemon) -> AsyncIterator[PoirotClient]:
    async with client_of(daemon) as c:
        yield c


def session(session_id: str = "s1") -> list[pb.IngestRequest]:
    senders = ["doctor", "chief", "physio"]
    messages = [
        pb.IngestRequest(
            agent_message=pb.AgentMessage(
                session_id=session_id,
                index=i,
                kind=pb.MESSAGE_KIND_AGENT,
                sender=senders[i % 3],
                content=f"Turn {i}: the next {QUOTABLE}.",
            )
        )
        for i in range(5)
    ]
    start = pb.IngestRequest(session_start=pb.SessionStart(session_id=session_id, system="clinic"))
    return [start, *messages]


async def investigate(
    client: PoirotClient, method: str, session_id: str = "s1"
) -> pb.Investigation:
    queued = await client.trigger(session_id, f"compare {method}", method=method)
    assert queued.method == method
    events = [e async for e in client.watch(queued.investigation_id)]
    assert events[-1].HasField("attribution_ready"), events[-1]
    record: pb.Investigation = await client.investigations.Get(
        pb.GetInvestigationRequest(investigation_id=queued.investigation_id, include_exchanges=True)
    )
    return record


def counted(daemon: Daemon, method: str) -> float | None:
    return daemon.metrics.registry.get_sample_value(
        "poirot_investigations_total",
        {"system": "clinic", "outcome": "succeeded", "method": method},
    )


@pytest.mark.parametrize(
    ("method", "rule", "voters", "phases"),
    [
        ("echo", "echo(delta=0.3)", {"echo."}, {"analysis", "aggregation"}),
        ("errorprobe", "errorprobe", {"errorprobe.arbiter"}, {"detection", "tracing", "diagnosis"}),
        (
            "ensemble",
            "ensemble(argmax)",
            {"", "doctor", "chief", "physio", "echo.", "errorprobe.arbiter"},
            {"self_assessment", "voting", "analysis", "diagnosis"},
        ),
    ],
)
async def test_each_method_runs_end_to_end_through_the_daemon(
    daemon: Daemon,
    client: PoirotClient,
    method: str,
    rule: str,
    voters: set[str],
    phases: set[str],
) -> None:
    await client.send(session())
    record = await investigate(client, method)

    assert record.state == pb.INVESTIGATION_STATE_SUCCEEDED, record.error
    assert record.attribution.rule == rule
    assert len(record.attribution.scores) == len(record.hazard_space.regions)
    for vote in record.votes:
        assert vote.agent_id in voters or any(
            p.endswith(".") and vote.agent_id.startswith(p) for p in voters
        ), vote.agent_id
    assert phases <= {p.phase for p in record.phases}
    assert record.exchanges and record.llm_calls == len(record.exchanges)
    findings = json.loads(record.findings_json)
    assert findings["method"] == method
    assert counted(daemon, method) == 1
    assert verify(daemon.settings.db_path).ok


async def test_the_ensemble_keeps_every_members_result(client: PoirotClient) -> None:
    await client.send(session())
    record = await investigate(client, "ensemble")
    members = json.loads(record.findings_json)["members"]
    assert [m["method"] for m in members] == ["poirot", "baseline", "echo", "errorprobe"]
    assert all(m["error"] == "" and m["attribution"]["decision"] for m in members)
    assert {r.agent_id for r in record.reports} == {"doctor", "chief", "physio"}


async def memory_cli(daemon: Daemon, *args: str) -> Any:
    """`poirotd memory ...` on the daemon's database (in a thread: the CLI runs its own loop)."""
    db = str(daemon.settings.db_path)
    argv = ["memory", *args, "--db", db, "--system", "clinic"]
    return await asyncio.to_thread(CliRunner().invoke, app, argv)


async def remembered(daemon: Daemon, *flags: str) -> list[dict[str, Any]]:
    result = await memory_cli(daemon, "list", "--json", *flags)
    assert result.exit_code == 0, result.output
    return [json.loads(line) for line in result.stdout.splitlines()]


async def test_verified_evidence_enters_memory_and_an_operator_deletes_it(
    daemon: Daemon, client: PoirotClient
) -> None:
    await client.send(session())
    record = await investigate(client, "errorprobe")
    memory = json.loads(record.findings_json)["memory"]
    assert memory["gate"] == "committed: every evidence check passed"
    (entry,) = await remembered(daemon)
    assert entry["entry_id"] == memory["committed"] and entry["verified_by"] == "evidence"
    assert entry["sources"] == [record.investigation_id]

    listed = await memory_cli(daemon, "list")
    assert listed.exit_code == 0 and entry["entry_id"] in listed.stdout
    deleted = await memory_cli(daemon, "delete", entry["entry_id"])
    assert deleted.exit_code == 0 and f"deleted {entry['entry_id']}" in deleted.stdout
    assert await remembered(daemon) == []
    assert [e["entry_id"] for e in await remembered(daemon, "--deleted")] == [entry["entry_id"]]
    missing = await memory_cli(daemon, "delete", "nope")
    assert missing.exit_code == 1 and "no memory entry 'nope'" in missing.stderr
    assert verify(daemon.settings.db_path).ok, "a deletion is chained, not a hole"


@pytest.mark.parametrize("right", [True, False])
async def test_an_unverified_diagnosis_enters_memory_only_once_confirmed(
    daemon: Daemon, client: PoirotClient, filler: Filler, right: bool
) -> None:
    filler.quote_truly = False
    await client.send(session())
    record = await investigate(client, "errorprobe")
    findings = json.loads(record.findings_json)
    assert findings["memory"]["gate"] == "pending confirmation: not every check passed"
    assert await remembered(daemon) == []

    blamed = findings["diagnosis"]["region"]
    other = next(r.id for r in record.hazard_space.regions if r.id != blamed)
    confirmed = blamed if right else other
    await client.confirm(record.investigation_id, [confirmed], note="checked by the therapist")
    await client.confirm(record.investigation_id, [confirmed])  # again: no change
    if not right:
        assert await remembered(daemon) == [], "a refuted diagnosis never enters memory"
        return
    (entry,) = await remembered(daemon)
    assert (entry["verified_by"], entry["frequency"], entry["confirmed"]) == ("confirmed", 1, 1)
    assert entry["signature"]["agent"] == blamed


def test_memory_on_a_missing_database_exits_2_and_creates_none(tmp_path: Path) -> None:
    missing = tmp_path / "none.db"
    for command in (["list"], ["delete", "abc"]):
        argv = ["memory", *command, "--db", str(missing), "--system", "clinic"]
        result = CliRunner().invoke(app, argv)
        assert result.exit_code == 2 and "no such database file" in result.stderr
    assert not missing.exists()
