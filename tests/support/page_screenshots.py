"""Takes docs/images/page-list.png and page-investigation.png with the headless Chromium, from a
demo-like investigation: the CORTEX spec of `poirotd demo`, its session's messages, and its
exoskeleton's proprioception sensor reading 2/8 for a child documented at 6/8 (Sensor-X),
which fires the demo's rule. The agents' answers are scripted here (a picture needs answers a
135M model does not give); everything else is the real daemon serving its real page.

    PYTHONPATH=. python -m tests.support.page_screenshots docs/images
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
import time
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any

import yaml

from poirotd.api.poirot.v1 import poirot_pb2 as pb
from poirotd.client.wire import PoirotClient
from poirotd.config import SystemSpec
from poirotd.demo.main import demo_file
from poirotd.devtools.answers import fill
from poirotd.llm.base import ChatMessage
from poirotd.llm.scripted import ScriptedBackend
from tests.support.page import at, chromium, page_daemon
from tests.support.waiting import eventually

SESSION = "cortex-demo-1"
AGENTS = ("doctor", "chief", "physio_general")
# Region order: the agents, then the demo's components.
REGIONS = ("doctor", "chief", "physio_general", "d2w_exoskeleton", "patient", "parent")
VOTES: dict[str, tuple[tuple[int, ...], str, str]] = {
    "doctor": (
        (0, 0, 0, 1, 0, 0, 0),
        "Sensor data integrity failure",
        "My assessment took the proprioception score of 2/8 from the exoskeleton's test as "
        "measured. The medical report documents 6/8 for this child, and nothing in the history "
        "explains a loss of that size: the sensor, not the child, changed.",
    ),
    "chief": (
        (0, 0, 0, 1, 0, 0, 0),
        "Equipment malfunction: proprioception sensor",
        "Plan 2 was chosen because of the low proprioception reading. The physiotherapist "
        "confirms the patient walked with the documented control in the session, which a score "
        "of 2/8 cannot describe. The exoskeleton's reading is the root cause.",
    ),
    "physio_general": (
        (1, 0, 0, 1, 0, 0, 0),
        "Sensor fault propagated by the diagnosis",
        "The exoskeleton reported an implausible score and the doctor's report carried it into "
        "the plan without a plausibility check against the record: two independent failures.",
    ),
}
QUESTIONS = {
    "doctor": ("chief", "Which measurement made you choose plan 2 over plan 1?"),
    "chief": ("physio_general", "Did the patient's balance in the session match a 2/8 score?"),
    "physio_general": ("doctor", "Did you compare the proprioception test with the report?"),
}
ANSWERS = {
    "chief": "The proprioception score of 2/8 in the doctor's report: with it, plan 1's "
    "unassisted balance work was not safe.",
    "physio_general": "No. She kept her trunk upright through the whole session, as a 6/8 "
    "child does; a 2/8 child would have needed the pelvic module at full assistance.",
    "doctor": "I took the test result as the exoskeleton reported it; I did not compare it "
    "with the 6/8 in the medical report.",
}


def demo_spec() -> SystemSpec:
    """`poirotd demo`'s CORTEX spec without its MQTT input, its hazard space pinned to the
    agents and components (so no Phase I answer needs scripting)."""
    raw = yaml.safe_load(demo_file("cortex.yaml").read_text())
    raw.pop("inputs", None)
    raw["llm"] = {"backend": "openai", "base_urls": ["http://127.0.0.1:9"], "model": "none"}
    declared = {**{a["id"]: a for a in raw["agents"]}, **{c["id"]: c for c in raw["components"]}}
    raw["hazard_space"] = {
        "regions": [
            {
                "id": rid,
                "name": declared[rid]["name"],
                "type": declared[rid].get("type", "agent"),
                "description": declared[rid].get("description", declared[rid]["name"]),
            }
            for rid in (*REGIONS, "comm_channels")
        ]
    }
    return SystemSpec.model_validate(raw)


def agent_of(spec: SystemSpec, messages: Sequence[ChatMessage]) -> str:
    system = messages[0].content
    return next((a.id for a in spec.agents if system.startswith(a.system_prompt[:80])), "")


def demo_answers(spec: SystemSpec) -> ScriptedBackend:
    """Answers in the shape each request's schema asks for, with the words above."""

    asked: set[str] = set()

    def answer(messages: Sequence[ChatMessage], schema: dict[str, Any] | None) -> str:
        agent = agent_of(spec, messages)
        if schema is None:  # a peer answers a question
            return ANSWERS.get(agent, "I saw nothing unusual.")
        value = fill(schema)
        props = schema.get("properties", {})
        if "anyOf" in schema:  # a Phase III turn: ask once, then vote
            if agent not in asked and agent in QUESTIONS:
                asked.add(agent)
                peer, question = QUESTIONS[agent]
                return json.dumps(
                    {"action": "ask", "peer": f"talk_to_{peer}", "question": question}
                )
            value = fill(schema, prefer="vote")
        if isinstance(value, dict) and "location" in value and agent in VOTES:
            location, vector, why = VOTES[agent]
            value.update(location=list(location), hazard_vector=vector, justification=why)
            if "step" in value:
                value["step"] = 3
        if "self_evaluation" in props and isinstance(value, dict):
            value["self_evaluation"].update(
                description="I worked from the test results the exoskeleton reported.",
                evidence="message #3",
            )
        return json.dumps(value)

    return ScriptedBackend(answer)


def session(t0: datetime) -> list[pb.IngestRequest]:
    """The demo session's messages, two seconds apart, then the proprioception readings."""
    kinds = {"agent": pb.MESSAGE_KIND_AGENT, "human": pb.MESSAGE_KIND_HUMAN}
    kinds |= {"tool": pb.MESSAGE_KIND_TOOL, "system": pb.MESSAGE_KIND_SYSTEM}
    lines = [json.loads(x) for x in demo_file("cortex_session.jsonl").read_text().splitlines()]
    requests = [
        pb.IngestRequest(session_start=pb.SessionStart(session_id=SESSION, system="cortex"))
    ]
    for m in lines:
        requests.append(
            pb.IngestRequest(
                agent_message=pb.AgentMessage(
                    session_id=SESSION,
                    index=m["index"],
                    kind=kinds[m["kind"]],
                    sender=m["sender"],
                    recipient=m.get("recipient") or "",
                    content=m.get("content", ""),
                    tool_calls=m.get("tool_calls", []),
                    tool_name=m.get("tool_name", ""),
                    sent_at=at(t0, 2 * m["index"]),
                )
            )
        )
    readings = [6.0 + (0.15 if i % 4 == 1 else -0.1 if i % 5 == 2 else 0.0) for i in range(48)]
    readings += [4.6, 2.9, 2.1, 2.0, 2.05, 1.95, 2.0]
    for i, value in enumerate(readings):
        requests.append(
            pb.IngestRequest(
                telemetry=pb.TelemetrySample(
                    session_id=SESSION,
                    component="d2w_exoskeleton",
                    signal="proprioception_score",
                    value=value,
                    measured_at=at(t0, 8 + 0.5 * i),
                )
            )
        )
    return requests


async def succeeded(client: PoirotClient, investigation_id: str) -> bool:
    state = (await client.get(investigation_id)).state
    return bool(state == pb.INVESTIGATION_STATE_SUCCEEDED)


async def finished(client: PoirotClient) -> bool:
    found = (await client.list_investigations(session_id=SESSION)).investigations
    return bool(found) and found[0].state == pb.INVESTIGATION_STATE_SUCCEEDED


async def take(folder: Path) -> None:
    spec = demo_spec()
    with tempfile.TemporaryDirectory() as tmp:
        async with page_daemon(Path(tmp), demo_answers(spec), spec) as (daemon, client):
            t0 = datetime.now(UTC) - timedelta(minutes=3)
            await client.send(session(t0))
            async with asyncio.timeout(60):
                await eventually(lambda: finished(client))
            found = (await client.list_investigations(session_id=SESSION)).investigations[0]
            await client.confirm(
                found.investigation_id,
                ["d2w_exoskeleton"],
                "Bench test: the sensor reads 2/8 on a 6/8 phantom limb (technician, ward 3)",
            )
            for method in ("baseline", "echo"):  # an operator's second opinions, for the list
                again = (
                    await client.trigger(SESSION, "second opinion", method=method)
                ).investigation_id
                async with asyncio.timeout(60):
                    await eventually(partial(succeeded, client, again))
            base = f"http://127.0.0.1:{daemon.page_port}"
            await asyncio.to_thread(shoot, base, found.investigation_id, folder)


def shoot(base: str, investigation_id: str, folder: Path) -> None:
    with chromium(1280, 520) as driver:
        driver.get(f"{base}/investigations")
        time.sleep(1.5)
        driver.save_screenshot(str(folder / "page-list.png"))
        driver.get(f"{base}/investigations/{investigation_id}")
        time.sleep(2)
        driver.set_window_size(1280, 2600)  # down to the start of the timeline
        time.sleep(1)
        driver.save_screenshot(str(folder / "page-investigation.png"))
        for entry in driver.get_log("browser"):
            print("console:", entry, file=sys.stderr)


if __name__ == "__main__":
    asyncio.run(take(Path(sys.argv[1] if len(sys.argv) > 1 else "docs/images")))
