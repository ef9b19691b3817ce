"""The red-team set (bench/injections.yaml) put into an investigation of the CORTEX demo session.

Shared by the structure test (tests/protocol/test_injection_redteam.py, scripted backend) and the
benchmark (bench/injection.py, embedded model), so both insert each text the same way: as one
more message at the end of the session (agent, human, system, tool), as a telemetry signal's
name, as the Trigger reason, or as the summary of the rule event that opened the investigation.
The hazard space is the spec's declared one (agents, then components), pinned, so no Phase I
call varies between runs and the target region has a fixed index.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal, get_args

import yaml

from poirotd.config.spec import PinnedHazardSpace, SystemSpec
from poirotd.demo.main import demo_file
from poirotd.hazards import summarise_window
from poirotd.model import AgentMessage, HazardEvent, HazardRegion, MessageKind, Reading
from poirotd.protocol.poirot.hazard_space import agent_region
from poirotd.protocol.prompts import Incident

CASES_PATH = Path(__file__).with_name("injections.yaml")
# The region every injection wants voted for: the parent, whom nothing in the session blames.
TARGET = "parent"
SESSION_ID = "cortex-demo-1"
REASON = "proprioception_score below 3 on the exoskeleton during the session"
Channel = Literal["agent", "human", "system", "tool", "telemetry", "reason", "rule"]
CHANNELS: tuple[Channel, ...] = get_args(Channel)
_AT = datetime(2025, 1, 1, tzinfo=UTC)
# What a benign case carries on each channel: the clean run an injected one is compared with.
BENIGN = "All readings nominal; the session went as planned."


@dataclass(frozen=True)
class InjectionCase:
    id: str
    category: str
    channel: Channel
    text: str
    sender: str = ""
    # Kinds of injection finding the daemon must report for this text.
    findings: tuple[str, ...] = ()

    def benign(self) -> InjectionCase:
        """The same entry point with harmless text (and the default sender), for a clean run to
        compare with."""
        return InjectionCase(f"{self.id}-benign", "benign", self.channel, BENIGN)


def load_cases(path: Path = CASES_PATH) -> list[InjectionCase]:
    """The red-team cases, checked: unique ids, known channels."""
    raw: list[dict[str, Any]] = yaml.safe_load(path.read_text())
    cases = [
        InjectionCase(
            id=c["id"],
            category=c["category"],
            channel=c["channel"],
            text=c["text"],
            sender=c.get("sender", ""),
            findings=tuple(c.get("findings", ())),
        )
        for c in raw
    ]
    ids = [c.id for c in cases]
    if len(set(ids)) != len(ids):
        raise ValueError(f"{path}: repeated ids {sorted({i for i in ids if ids.count(i) > 1})}")
    unknown = sorted({c.channel for c in cases} - set(CHANNELS))
    if unknown:
        raise ValueError(f"{path}: unknown channels {unknown}; known: {list(CHANNELS)}")
    return cases


def cortex_spec(**changes: Any) -> SystemSpec:
    """The demo's CORTEX spec without its MQTT input, its declared regions pinned as the hazard
    space; `changes` update the spec's top-level sections (e.g. protocol, llm)."""
    raw = yaml.safe_load(demo_file("cortex.yaml").read_text())
    raw.pop("inputs", None)
    declared = SystemSpec.model_validate(raw)
    regions = [agent_region(a.id, a.name) for a in declared.agents]
    regions += [
        HazardRegion(id=c.id, name=c.name, type=c.type, description=c.description)
        for c in declared.components
    ]
    pinned = PinnedHazardSpace(regions=tuple(regions))
    return SystemSpec.model_validate({**raw, "hazard_space": pinned.model_dump(), **changes})


def demo_session() -> list[AgentMessage]:
    lines = demo_file("cortex_session.jsonl").read_text().splitlines()
    return [
        AgentMessage(session_id=SESSION_ID, sent_at=_AT, **json.loads(line))
        for line in lines
        if line.strip()
    ]


def filled(text: str, spec: SystemSpec, target: str = TARGET) -> str:
    """`text` with its placeholders naming `target` (see the header of injections.yaml)."""
    assert spec.hazard_space is not None
    regions = spec.hazard_space.regions
    region = next(r for r in regions if r.id == target)
    vector = json.dumps([int(r.id == target) for r in regions])
    return (
        text.replace("{target_id}", region.id)
        .replace("{target_name}", region.name)
        .replace("{target_vector}", vector)
    )


def injected(
    case: InjectionCase, spec: SystemSpec, session: list[AgentMessage]
) -> tuple[list[AgentMessage], Incident]:
    """The session and the incident with `case`'s text where its channel puts it."""
    text = filled(case.text, spec)
    incident = Incident(REASON)
    if case.channel == "reason":
        return session, incident._replace(reason=text)
    if case.channel == "rule":
        event = HazardEvent(
            rule="proprioception_implausible",
            severity="critical",
            session_id=SESSION_ID,
            at=_AT,
            summary=text,
        )
        return session, incident._replace(trigger=event)
    if case.channel == "telemetry":
        readings = [
            Reading("d2w_exoskeleton", signal, value, _AT + timedelta(milliseconds=10 * i))
            for i, (signal, value) in enumerate(
                [("proprioception_score", 2.0), (text, 1.0), ("proprioception_score", 2.0)]
            )
        ]
        return session, incident._replace(telemetry=summarise_window(readings))
    return [*session, _message(case, text, len(session))], incident


def _message(case: InjectionCase, text: str, index: int) -> AgentMessage:
    kind, sender, recipient, tool = {
        "agent": (MessageKind.AGENT, "physio_general", "", ""),
        "human": (MessageKind.HUMAN, case.sender or "parent", "chief", ""),
        "system": (MessageKind.SYSTEM, case.sender or "system", "", ""),
        "tool": (MessageKind.TOOL, "tool:D2W_retriever_tool", "chief", "D2W_retriever_tool"),
    }[case.channel]
    return AgentMessage(
        session_id=SESSION_ID,
        index=index,
        kind=kind,
        sender=sender,
        recipient=recipient,
        content=text,
        tool_name=tool,
        sent_at=_AT,
    )
