"""A campaign's sources from the daemon's store: the spec's system, the time range, clean
sessions by default; their telemetry comes with them. On both store adapters."""

from __future__ import annotations

import asyncio
from datetime import timedelta

from poirot_eval.campaigns.generate import run_campaign
from poirot_eval.campaigns.plan import CampaignPlan
from poirot_eval.campaigns.sources import from_store
from poirot_eval.cases import EvalCase
from poirotd.config import SystemSpec
from tests.support.store import T0, investigation, message, sample, session
from tests.support.stores import StoreDb

SPEC = SystemSpec.model_validate(
    {
        "system": {"name": "cortex", "description": "A planner drives a knee motor."},
        "agents": [{"id": "planner", "name": "Planner", "system_prompt": "You plan."}],
        "components": [
            {"id": "knee_motor", "name": "Knee motor", "type": "hardware", "description": "x"}
        ],
        "rules": [
            {"name": "torque_high", "kind": "threshold", "severity": "critical",
             "component": "knee_motor", "signal": "torque", "above": 50}
        ],
    }
)  # fmt: skip


def _read(store_db: StoreDb, *, with_incidents: bool) -> list[EvalCase]:
    async def go() -> list[EvalCase]:
        store = await store_db.open()
        try:
            hour = timedelta(hours=1)
            for sid, started, system in (
                ("clean", T0, "cortex"),
                ("incident", T0 + hour, "cortex"),
                ("elsewhere", T0, "trading"),
                ("too_early", T0 - 24 * hour, "cortex"),
            ):
                await store.commit_ingest(
                    [
                        session(sid, system=system, started_at=started),
                        *(message(i, sid) for i in range(4)),
                        *(sample(i, 10.0 + i, sid) for i in range(4)),
                    ]
                )
            await store.save_investigation(investigation("i1", sid="incident"))
            return await from_store(
                store,
                SPEC,
                since=T0 - hour,
                until=T0 + 2 * hour,
                with_incidents=with_incidents,
                limit=None,
            )
        finally:
            await store.close()

    return asyncio.run(go())


def test_clean_sessions_of_the_system_in_the_range(store_db: StoreDb) -> None:
    [case] = _read(store_db, with_incidents=False)
    assert case.case_id == "store-clean" and case.spec == SPEC
    assert [m.index for m in case.messages] == [0, 1, 2, 3]
    assert [s.value for s in case.telemetry] == [10.0, 11.0, 12.0, 13.0]
    plan = CampaignPlan.model_validate(
        {
            "faults": [
                {
                    "operator": "offset",
                    "component": "knee_motor",
                    "signal": "torque",
                    "magnitude": 100,
                }
            ]
        }
    )
    outcome = asyncio.run(run_campaign(plan, [case], None))
    [variant] = outcome.kept
    assert variant.truth.regions == ("knee_motor",)
    assert variant.truth.fault is not None
    assert (variant.truth.fault.hazard, variant.truth.fault.source) == (
        "torque_high",
        "campaign:store-clean",
    )


def test_with_incidents_takes_sessions_that_had_an_investigation(store_db: StoreDb) -> None:
    cases = _read(store_db, with_incidents=True)
    assert [c.case_id for c in cases] == ["store-clean", "store-incident"]
