"""`poirotd investigations` and `poirotd sessions` against an in-process daemon over real gRPC
on loopback: what an operator sees after an alert, what a script parses back from --json, and a
watch that loses its connection and resumes without a gap.

Each command is a child process, as from a shell (the daemon in this process logs to stdout);
the watch that must survive a dropped connection runs behind a proxy the test cuts."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import json_format

from poirotd.api.poirot.v1 import poirot_pb2 as pb
from poirotd.client.wire import PoirotClient
from poirotd.daemon import Daemon
from poirotd.devtools.clinic import CLINIC_REGIONS, clinic
from poirotd.devtools.ingest_requests import OVERHEAT, message, motor_temp, session
from tests.support.answers import gated
from tests.support.cli import poirotd as run
from tests.support.daemon import client_of, in_process_daemon
from tests.support.tcp_proxy import TcpProxy
from tests.support.waiting import eventually

# Each command is a Python process of its own: a few seconds apiece on a busy machine.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


async def poirotd(daemon: Daemon, *args: str) -> subprocess.CompletedProcess[str]:
    """`poirotd ARGS --target DAEMON`, a child process as from a shell."""
    return await asyncio.to_thread(run, *args, "--target", f"127.0.0.1:{daemon.grpc_port}")


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, (result.stdout, result.stderr)
    return result.stdout


async def investigated(client: PoirotClient, reason: str = "the exoskeleton scored 0.75") -> str:
    await client.send([*session(6), motor_temp(1, 40), motor_temp(2, 45)])
    queued = await client.trigger("s1", reason)
    async with asyncio.timeout(60):
        _ = [e async for e in client.watch(queued.investigation_id)]
    return queued.investigation_id


async def test_trigger_watch_list_and_show_as_an_operator(
    daemon: Daemon, client: PoirotClient
) -> None:
    await client.send([*session(6), motor_temp(1, 40), motor_temp(2, 45)])
    triggered = ok(await poirotd(daemon, "investigations", "trigger", "s1", "--reason", "a fall"))
    investigation_id = triggered.split(":")[0]
    assert f"follow it: poirotd investigations watch {investigation_id}" in triggered

    watched = ok(await poirotd(daemon, "investigations", "watch", investigation_id))
    lines = watched.splitlines()
    assert "started session s1: a fall" in lines[0]
    assert "attribution_ready doctor 1.75" in lines[-1], "the top region and its score"
    assert sum("vote_cast" in line for line in lines) == 3

    listed = ok(await poirotd(daemon, "investigations", "list", "--state", "succeeded"))
    assert investigation_id in listed and "SUCCEEDED" in listed and "doctor 1.75" in listed
    assert investigation_id in ok(
        await poirotd(daemon, "investigations", "list", "--method", "poirot")
    )
    other = ok(await poirotd(daemon, "investigations", "list", "--method", "baseline"))
    assert investigation_id not in other

    shown = ok(await poirotd(daemon, "investigations", "show", investigation_id))
    record = await client.get(investigation_id)
    total = sum(v.weight for v in record.votes)
    assert re.search(r"doctor +agent +█{24} +1\.75 +◆ chosen", shown), "a full bar: every voter"
    assert re.search(r"exo +hardware +·{24} +0\.00 *\n", shown)
    assert (
        f"decision rule argmax, β 0.25; bars: share of the total vote weight {total:.2f}" in shown
    )
    for vote in record.votes:  # each vote: agent, β, weight, position, step, justification
        row = rf"│ {vote.agent_id} +│ 0\.25 │ {vote.weight:.3f} +│ doctor +│ 0 +│ x +│"
        assert re.search(row, shown), row
    assert "the fault first shows at message #0" in shown
    assert "Phase II reports" in shown and '"role_fulfilled": false' in shown
    assert re.search(r"requested by +127\.0\.0\.1", shown) and re.search(r"reason +a fall", shown)
    missing = await poirotd(daemon, "investigations", "show", "0" * 32)
    assert missing.returncode == 1
    assert f"refused: NOT_FOUND: investigation '{'0' * 32}' not found" in missing.stderr


async def test_every_answer_parses_back_from_json(daemon: Daemon, client: PoirotClient) -> None:
    investigation_id = await investigated(client)
    shown = ok(await poirotd(daemon, "investigations", "show", investigation_id, "--json"))
    assert json_format.Parse(shown, pb.Investigation()) == await client.get(investigation_id)

    listed = ok(await poirotd(daemon, "investigations", "list", "--session", "s1", "--json"))
    assert json_format.Parse(listed, pb.ListInvestigationsResponse()) == (
        await client.list_investigations(session_id="s1", page_size=20)
    )
    assert json.loads(listed)["investigations"][0]["state"] == "INVESTIGATION_STATE_SUCCEEDED"

    watched = ok(await poirotd(daemon, "investigations", "watch", investigation_id, "--json"))
    events = [json_format.Parse(line, pb.InvestigationEvent()) for line in watched.splitlines()]
    assert events == [e async for e in client.watch(investigation_id)]

    again = ok(await poirotd(daemon, "investigations", "trigger", "s1", "--reason", "x", "--json"))
    record = json_format.Parse(again, pb.Investigation())
    assert record.session_id == "s1" and record.reason == "x"

    sessions = ok(await poirotd(daemon, "sessions", "list", "--json"))
    assert json_format.Parse(sessions, pb.ListSessionsResponse()) == await client.list_sessions()
    detail = ok(await poirotd(daemon, "sessions", "show", "s1", "--json"))
    assert json_format.Parse(detail, pb.SessionDetail()) == await client.get_session("s1")

    region = (await client.get(investigation_id)).hazard_space.regions[0].id
    confirmed = ok(await poirotd(daemon, "confirm", investigation_id, region, "--json"))
    response = json_format.Parse(confirmed, pb.ConfirmOutcomeResponse())
    assert response.newly_confirmed and list(response.confirmed.region_ids) == [region]
    betas = ok(await poirotd(daemon, "reputation", "--json"))
    assert json_format.Parse(betas, pb.GetReputationResponse()) == await client.reputation()


async def test_sessions_list_and_show_with_telemetry_and_pages_of_messages(
    daemon: Daemon, client: PoirotClient
) -> None:
    investigation_id = await investigated(client)
    await client.send(session(2, "s2"))
    listed = ok(await poirotd(daemon, "sessions", "list"))
    assert listed.index("s2") < listed.index("s1"), "newest started first"
    assert re.search(r"│ s1 +│ [^│]+│ - +│ 6 +│ 1 +│", listed), "six messages, one investigation"

    shown = ok(await poirotd(daemon, "sessions", "show", "s1"))
    assert re.search(r"│ exo +│ motor_temp_c +│ 2 +│ 40 +│ 45 +│ 45 +│", shown)
    assert "newest 10000 samples at most" in shown
    assert investigation_id in shown and re.search(r"ended +not yet", shown)
    assert "turn 0" not in shown, "messages only when asked for"

    page = ok(await poirotd(daemon, "sessions", "show", "s1", "--messages", "--max-messages", "4"))
    assert [f"turn {n}" in page for n in range(6)] == [True] * 4 + [False] * 2
    assert "more follow: --from-index 4" in page
    rest = ok(await poirotd(daemon, "sessions", "show", "s1", "--messages", "--from-index", "4"))
    assert "#5" in rest and "turn 5" in rest and "turn 3" not in rest
    assert "more follow" not in rest
    unknown = await poirotd(daemon, "sessions", "show", "nope")
    assert unknown.returncode == 1 and "refused: NOT_FOUND: session 'nope' is not known" in (
        unknown.stderr
    )


async def test_what_the_agents_wrote_cannot_restyle_or_drive_the_terminal(
    daemon: Daemon, client: PoirotClient
) -> None:
    hostile = "[bold red]ALL CLEAR[/] \x1b[2J\x1b]0;owned\x07 \u202eright-to-left"
    await client.send([*session(0), message(0, content=hostile)])
    shown = ok(await poirotd(daemon, "sessions", "show", "s1", "--messages"))
    assert "[bold red]ALL CLEAR[/] <U+001B>[2J<U+001B>]0;owned<U+0007> <U+202E>right" in shown
    assert "\x1b" not in shown and "\u202e" not in shown


async def test_show_says_why_a_hazard_waits_and_which_triggers_joined(tmp_path: Path) -> None:
    """The LLM answers only once the gate opens, so the first run holds the only worker: s2's
    trigger queues, s3's hazard takes the place kept for rules, s4's finds the queue full."""
    spec = clinic(
        rules=[OVERHEAT], hazard_space={"regions": [r.model_dump() for r in CLINIC_REGIONS]}
    )
    settings: dict[str, Any] = {
        "queue_capacity": 2,
        "queue_reserved_for_rules": 1,
        "concurrent_investigations": 1,
        "trigger_rate_per_client": 0,
        "drain_seconds": 0.5,
    }
    gate = asyncio.Event()
    async with (
        in_process_daemon(tmp_path, spec, gated(gate), **settings) as daemon,
        client_of(daemon) as client,
    ):
        await client.send([r for n in range(1, 5) for r in session(3, f"s{n}")])
        running = await client.trigger("s1", "holds the worker")

        async def runs() -> bool:
            return (await client.get(running.investigation_id)).state == (
                pb.INVESTIGATION_STATE_RUNNING
            )

        async with asyncio.timeout(30):
            await eventually(runs)
        queued = await client.trigger("s2", "first look")
        await client.send([motor_temp(1, 95, "s3"), motor_temp(1, 95, "s4")])
        ((deferred,),) = [(await client.list_investigations(session_id="s4")).investigations]

        joined = ok(
            await poirotd(daemon, "investigations", "trigger", "s2", "--reason", "once more")
        )
        assert joined.startswith(
            f"joined the open investigation {queued.investigation_id} (QUEUED, opened for: "
            "first look)"
        )
        shown = ok(await poirotd(daemon, "investigations", "show", deferred.investigation_id))
        assert re.search(r"state +DEFERRED \(a hazard rule's investigation that found the", shown)
        assert re.search(r"trigger +rule exo_overheat \(critical\) at ", shown)
        assert re.search(r"requested by +a hazard rule", shown)
        coalesced = ok(await poirotd(daemon, "investigations", "show", queued.investigation_id))
        assert "coalesced triggers" in coalesced
        assert re.search(r"│ Trigger +│ once more +│ QUEUED +│ 127\.0\.0\.1 +│", coalesced)
        waiting = ok(await poirotd(daemon, "investigations", "list", "--state", "deferred"))
        assert deferred.investigation_id in waiting and queued.investigation_id not in waiting


async def test_watch_resumes_after_a_dropped_connection_without_gap_or_repeat(
    daemon: Daemon, client: PoirotClient
) -> None:
    """The watch follows every investigation through a proxy; the proxy drops the connection
    and turns the watch away while a second investigation runs from start to end; once let
    through again, the watch prints the events it missed, and nothing twice."""
    first = await investigated(client, "before the drop")
    reference = [e async for e in client.watch(first)]
    proxy = TcpProxy(daemon.grpc_port)
    await proxy.start()
    watch = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "poirotd", "investigations", "watch", "--json"),
        *("--target", f"127.0.0.1:{proxy.port}", "--reconnect-seconds", "60"),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert watch.stdout is not None and watch.stderr is not None
    try:
        printed = [await next_event(watch.stdout) for _ in reference]
        assert [e.event_id for e in printed] == [e.event_id for e in reference]

        await proxy.cut()
        lost = ""
        while not lost.startswith("connection lost"):  # past whatever else grpc may log
            lost = (await asyncio.wait_for(watch.stderr.readline(), 30)).decode()
        assert lost.startswith("connection lost (UNAVAILABLE: ") and lost.rstrip().endswith(
            f"resuming after event {reference[-1].event_id}"
        )
        second = await client.trigger("s1", "while the watch is away")
        missed = [e async for e in client.watch(second.investigation_id, reference[-1].event_id)]
        assert missed[-1].HasField("attribution_ready")

        proxy.restore()
        while (
            not printed[-1].HasField("attribution_ready") or printed[-1].investigation_id == first
        ):
            printed.append(await next_event(watch.stdout))
    finally:
        watch.terminate()
        await watch.wait()
        await proxy.stop()
    everything = []
    async for event in client.watch():
        everything.append(event)
        if event.event_id == missed[-1].event_id:
            break
    assert [e.event_id for e in printed] == [e.event_id for e in everything], "no gap, no repeat"
    assert printed == everything


async def next_event(stdout: asyncio.StreamReader) -> pb.InvestigationEvent:
    line = await asyncio.wait_for(stdout.readline(), 60)
    assert line, "the watch ended"
    return json_format.Parse(line.decode(), pb.InvestigationEvent())
