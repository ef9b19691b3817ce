"""Phase I's ids come from the spec: what a model invents never becomes a region, a metric label
or a ConfirmOutcome target. Scripted answers (orchestration), the real store, gRPC and /metrics."""

from __future__ import annotations

import importlib.util
import json
import re
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import httpx
import pytest

from poirotd.api.poirot.v1 import poirot_pb2 as pb
from poirotd.config.loader import load_spec
from poirotd.config.spec import EmbeddedLLMSpec, SystemSpec
from poirotd.devtools.answers import fill
from poirotd.llm import ChatMessage
from poirotd.llm.scripted import ScriptedBackend
from poirotd.protocol.events import ProtocolEvent
from poirotd.protocol.poirot.hazard_space import resolve_hazard_space, space_from_answer
from poirotd.protocol.poirot.prompts import hazard_space_request
from poirotd.protocol.poirot.schemas import hazard_space_format
from poirotd.protocol.run import RunContext
from tests.support.daemon import client_of, in_process_daemon
from tests.support.protocol import MemoryCache

GARBLED = "cathysfabriaca2w103854769bacgjhkxzmrbv"
WRONG_DIAGNOSIS = "Error signature: wrong diagnosis."

SPEC = SystemSpec.model_validate(
    {
        "system": {"name": "cortex", "description": "Gait therapy with an exoskeleton."},
        "agents": [
            {"id": "doctor", "name": "Doctor", "system_prompt": "You diagnose."},
            {"id": "chief", "name": "Chief", "system_prompt": "You choose the plan."},
        ],
        "components": [
            {
                "id": "d2w_exoskeleton",
                "name": "Exoskeleton",
                "type": "hardware",
                "description": "Error signature: odd angles. Normal behaviour: sane ones.",
            },
            {
                "id": "patient",
                "name": "Patient",
                "type": "human",
                "description": "Error signature: no cooperation. Normal behaviour: follows.",
            },
        ],
        "protocol": {"max_invocations": 1, "max_sub_regions": 3},
    }
)


def region(region_id: str, description: str = "Error signature: d.") -> dict[str, Any]:
    return {"id": region_id, "name": "what it says", "type": "agent", "description": description}


def sub(parent: str, slug: str) -> dict[str, str]:
    return {"parent": parent, "slug": slug, "name": slug.replace("_", " "), "description": "d"}


def garbled_answer() -> str:
    """What a weak model writes without a grammar: invented ids everywhere."""
    return json.dumps(
        {
            "system_name": "cortex",
            "agent_regions": [region("doctor", WRONG_DIAGNOSIS), region("Chief!")],
            "component_regions": [region(GARBLED), region("d2w_exoskeleton"), region("doctor")],
            "sub_regions": [
                sub("d2w_exoskeleton", "ankle_sensor"),
                sub("d2w_exoskeleton", GARBLED),
                sub("d2w_exoskeleton", "Knee Motor"),
                sub("d2w_exoskeleton", "ankle_sensor"),
                sub("doctor", "stethoscope"),
                sub(GARBLED, "part"),
                sub("d2w_exoskeleton", "knee_motor"),
                sub("d2w_exoskeleton", "hip_motor"),
                sub("patient", "left_leg"),
                sub("patient", "right_leg"),
            ],
            "error_vector_example": [1, 0],
        }
    )


# What the space keeps of garbled_answer(): the declared ids in spec order, then the valid parts.
KEPT = [
    "doctor",
    "chief",
    "d2w_exoskeleton",
    "patient",
    "d2w_exoskeleton.ankle_sensor",
    "d2w_exoskeleton.knee_motor",
    "patient.left_leg",
]


def build(text: str, spec: SystemSpec = SPEC) -> Any:
    return space_from_answer(spec, "v1", hazard_space_format(spec).parse(text))


def test_invented_ids_never_reach_the_space_and_are_noted_with_their_reason() -> None:
    space = build(garbled_answer())

    assert [r.id for r in space.regions] == KEPT
    assert all(SPEC.is_region_id(r.id) for r in space.regions)
    doctor, chief, exo, patient, ankle = space.regions[:5]
    assert doctor.description == WRONG_DIAGNOSIS
    # Names and types stay the spec's; a region the model did not describe keeps the spec's words.
    assert (chief.name, chief.type) == ("Chief", "agent")
    assert chief.description.startswith("Error signature: Chief produces output")
    assert patient.description == SPEC.components[1].description
    assert (ankle.type, ankle.name) == ("hardware", "ankle sensor")
    assert [(d.proposed, d.reason) for d in space.dropped] == [
        ("Chief!", "not_in_spec"),
        (GARBLED, "not_in_spec"),
        ("doctor", "duplicate"),
        (f"d2w_exoskeleton.{GARBLED}", "bad_slug"),
        ("d2w_exoskeleton.Knee Motor", "bad_slug"),
        ("d2w_exoskeleton.ankle_sensor", "duplicate"),
        ("doctor.stethoscope", "not_in_spec"),
        (f"{GARBLED}.part", "not_in_spec"),
        ("d2w_exoskeleton.hip_motor", "over_limit"),  # 2 per component
        ("patient.right_leg", "over_limit"),  # 3 in all
    ]
    assert exo.id == "d2w_exoskeleton"


def test_every_declared_id_is_present_even_when_the_model_lists_none() -> None:
    empty = json.dumps(
        {
            "system_name": "x",
            "agent_regions": [],
            "component_regions": [],
            "sub_regions": [],
            "error_vector_example": [],
        }
    )
    space = build(empty)
    assert [r.id for r in space.regions] == list(SPEC.region_ids)
    assert space.dropped == ()


@pytest.mark.parametrize(
    ("slug", "valid"),
    [
        ("ankle_sensor", True),
        ("l5_joint_2", True),
        ("a", True),
        ("ankle_position_tracker_left", True),
        ("", False),
        ("2nd_sensor", False),
        ("Ankle", False),
        ("ankle-sensor", False),
        ("ankle__sensor", False),
        ("ankle_", False),
        ("a_b_c_d_e", False),  # five words
        ("proprioceptionsensorx", False),  # a 21-letter run is not a word
        ("ankle.sensor", False),
        ("x" * 16 + "_" + "y" * 16 + "_" + "z" * 8, False),  # 42 characters
    ],
)
def test_sub_region_slugs(slug: str, valid: bool) -> None:
    assert SPEC.is_region_id(f"d2w_exoskeleton.{slug}") is valid


def test_a_pinned_space_may_only_name_declared_ids_or_their_parts() -> None:
    base = SPEC.model_dump(mode="json")
    ankle = {**region("d2w_exoskeleton.ankle"), "type": "hardware"}
    regions = [region("doctor"), region("chief"), ankle]
    SystemSpec.model_validate(base | {"hazard_space": {"regions": regions}})
    with pytest.raises(ValueError, match="a region id is a declared agent or component id"):
        SystemSpec.model_validate(
            base | {"hazard_space": {"regions": [*regions, {**region(GARBLED), "type": "other"}]}}
        )


# ------------------------------------------------------------------ through the daemon


def _phase_one_garbled(messages: Sequence[ChatMessage], schema: dict[str, Any] | None) -> str:
    if schema is None:
        return "I saw nothing unusual."
    if "agent_regions" in schema.get("properties", {}):
        return garbled_answer()
    return json.dumps(fill(schema, bit=1))


def _labels(text: str, metric: str, label: str) -> set[str]:
    return set(re.findall(rf'^{metric}\{{[^}}]*{label}="([^"]*)"', text, re.MULTILINE))


async def test_garbled_phase_one_never_reaches_metrics_or_the_wire(tmp_path: Path) -> None:
    backend = ScriptedBackend(_phase_one_garbled)
    async with in_process_daemon(tmp_path, SPEC, backend) as daemon, client_of(daemon) as client:
        start = pb.IngestRequest(session_start=pb.SessionStart(session_id="s1", system="cortex"))
        say = pb.IngestRequest(
            agent_message=pb.AgentMessage(
                session_id="s1", index=0, kind=pb.MESSAGE_KIND_AGENT, sender="doctor", content="hi"
            )
        )
        await client.send([start, say])
        first = await client.trigger("s1", "fall")
        [e async for e in client.watch(first.investigation_id)]
        second = await client.trigger("s1", "fall again")
        [e async for e in client.watch(second.investigation_id)]
        record = await client.get(second.investigation_id)
        space = await client.investigations.GetHazardSpace(pb.GetHazardSpaceRequest())
        async with httpx.AsyncClient(timeout=5) as http:
            metrics = (await http.get(f"http://127.0.0.1:{daemon.metrics_port}/metrics")).text

    phase_one = [c for c in backend.calls if "agent_regions" in str(c.schema)]
    assert len(phase_one) == 1, "built once, then cached"
    expected = set(KEPT)
    assert {r.id for r in space.regions} == expected
    assert {r.id for r in record.hazard_space.regions} == expected
    assert record.state == pb.INVESTIGATION_STATE_SUCCEEDED
    for metric in ("poirot_attribution_score", "poirot_attribution_top"):
        assert _labels(metrics, metric, "component") == expected
    assert _labels(metrics, "poirot_vote_components_total", "component") <= expected
    assert GARBLED not in metrics and "Knee Motor" not in metrics
    dropped = {
        reason: float(value)
        for reason, value in re.findall(
            r'^poirot_hazard_regions_dropped_total\{reason="(\w+)",system="cortex"\} (\S+)',
            metrics,
            re.MULTILINE,
        )
    }
    # Counted once, when the space was built, not again by the investigation that reused it.
    assert dropped == {"not_in_spec": 4.0, "bad_slug": 2.0, "duplicate": 2.0, "over_limit": 2.0}


# ------------------------------------------------------------------ the embedded model


@pytest.mark.slow
@pytest.mark.timeout(600)  # 54 s on a busy 2-core box (embedded model)
@pytest.mark.skipif(
    importlib.util.find_spec("llama_cpp") is None, reason="needs the 'embedded' extra"
)
async def test_demo_phase_one_on_the_embedded_model_names_only_spec_ids() -> None:
    """The demo's must-show: whatever SmolLM2-135M writes, every region id is a spec id or a
    derived slug, and every declared id is there."""
    from poirotd.llm.embedded import EmbeddedBackend

    spec = load_spec(Path(str(resources.files("poirotd.demo").joinpath("cortex.yaml"))))
    assert spec.hazard_space is None
    backend = await EmbeddedBackend.load(EmbeddedLLMSpec(context_tokens=8192))
    try:
        run = RunContext(backend, _ignore)
        space = await resolve_hazard_space(spec, MemoryCache(), run)
    finally:
        await backend.aclose()

    ids = [r.id for r in space.regions]
    assert ids[: len(spec.region_ids)] == list(spec.region_ids)
    assert all(spec.is_region_id(i) for i in ids), ids
    assert all("." in i for i in ids[len(spec.region_ids) :])


async def _ignore(event: ProtocolEvent) -> None:
    pass


def test_the_cache_key_covers_the_sub_region_bounds_phase_one_is_told() -> None:
    tighter = SPEC.model_copy(
        update={"protocol": SPEC.protocol.model_copy(update={"max_sub_regions": 1})}
    )
    assert tighter.description_version() != SPEC.description_version()
    assert "at most 2 per component and 3 in all" in hazard_space_request(SPEC)[1].content
