"""The clinic the API tests monitor: three agents planning therapy on an exoskeleton."""

from __future__ import annotations

from typing import Any

from poirotd.config import SystemSpec
from poirotd.model import HazardRegion

CLINIC = SystemSpec.model_validate(
    {
        "system": {"name": "clinic", "description": "Three agents plan therapy on an exoskeleton."},
        "agents": [
            {"id": "doctor", "name": "Doctor", "system_prompt": "You diagnose."},
            {"id": "chief", "name": "Chief", "system_prompt": "You choose the plan."},
            {"id": "physio", "name": "Physio", "system_prompt": "You advise on dosing."},
        ],
        "components": [
            {
                "id": "exo",
                "name": "Exoskeleton",
                "type": "hardware",
                "description": "Error signature: odd readings. Normal behaviour: sane ones.",
            },
        ],
        "protocol": {"max_invocations": 2},
    }
)
CLINIC_AGENTS = ("doctor", "chief", "physio")
# A pinned hazard space for the clinic: its agents, then the exoskeleton.
CLINIC_REGIONS = tuple(
    HazardRegion(id=r, name=r, type="agent" if r in CLINIC_AGENTS else "hardware", description=r)
    for r in (*CLINIC_AGENTS, "exo")
)


def clinic(**fields: Any) -> SystemSpec:
    """The clinic with these top-level fields of the spec replaced (rules, protocol, llm...)."""
    return SystemSpec.model_validate({**CLINIC.model_dump(mode="json"), **fields})


# The clinic as hwbridge/bridge.example.yaml feeds it (its exoskeleton is `d2w_exoskeleton`). Its
# OpenAI-compatible backend is never called (it is built without contacting the server), so that
# `poirotd run` on this spec starts without loading a model.
BRIDGE_CLINIC = clinic(
    components=[
        {
            "id": "d2w_exoskeleton",
            "name": "Discover2Walk exoskeleton",
            "type": "hardware",
            "description": "Error signature: implausible readings. Normal behaviour: gait data.",
        }
    ],
    llm={"backend": "openai", "base_urls": ["http://127.0.0.1:9"], "model": "none"},
)
