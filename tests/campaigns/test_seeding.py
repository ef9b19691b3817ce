"""Reputations seeded from a fault campaign: the rule, kept apart from confirmed outcomes in
the store (both adapters) and shown beside them in GetReputation."""

from __future__ import annotations

import asyncio
import json
import re
from datetime import UTC, datetime
from pathlib import Path

import grpc
import pytest

from poirotd.campaigns.seeding import seed_from
from poirotd.cli.seeding import campaign_outcomes
from poirotd.client.wire import PoirotClient
from poirotd.config import SystemSpec
from poirotd.daemon import Daemon
from poirotd.devtools.clinic import CLINIC_REGIONS, clinic
from poirotd.model import AgentReputation, CampaignOutcome, CampaignValue, Vote
from poirotd.protocol.reputation import betas_in_use, updated_beta
from poirotd.store.audit import verify
from tests.support.cli import poirotd
from tests.support.stores import StoreDb

AT = datetime(2025, 1, 1, tzinfo=UTC)
REGIONS = tuple(r.id for r in CLINIC_REGIONS)  # doctor, chief, physio, exo


def spec(weight: float) -> SystemSpec:
    reputation = {"enabled": True, "campaign_weight": weight}
    return clinic(protocol={"max_invocations": 2, "reputation": reputation})


def outcome(case_id: str, truth: str, doctor_votes: str) -> CampaignOutcome:
    """POIROT's result on one case: the doctor votes `doctor_votes`, physio abstains."""
    location = tuple(int(r == doctor_votes) for r in REGIONS)
    return CampaignOutcome(
        case_id=case_id,
        method="poirot",
        region_ids=REGIONS,
        decision=location,
        truth_region_ids=(truth,),
        votes=(
            Vote(agent_id="doctor", location=location),
            Vote(agent_id="physio", abstention_reason="no answer"),
            Vote(agent_id="stranger", location=location),
        ),
    )


def test_a_campaign_moves_its_own_values_by_the_confirmed_rule() -> None:
    seed = seed_from(
        spec(0.5),
        [outcome("a", "doctor", "doctor"), outcome("b", "exo", "doctor")],
        source="c1",
        at=AT,
    )
    rule = spec(0.5).protocol.reputation
    expected = updated_beta(updated_beta(rule.initial, 1.0, rule), 0.0, rule)
    assert seed.agents == {"doctor": CampaignValue(value=expected, cases=2)}
    assert set(seed.methods) == {"poirot"} and seed.methods["poirot"].cases == 2
    with pytest.raises(ValueError, match="no campaign outcome"):
        seed_from(spec(0.5), [], source="c1", at=AT)


def test_the_campaign_is_weighed_in_by_evidence_and_not_at_all_at_weight_0() -> None:
    seed = seed_from(
        spec(0.5), [outcome(f"c{i}", "doctor", "doctor") for i in range(4)], source="c1", at=AT
    )
    campaign = seed.agents["doctor"].value
    assert betas_in_use(spec(0.0), {}, seed)["doctor"] == 0.25
    # No confirmed outcome: the campaign's value alone.
    assert betas_in_use(spec(0.5), {}, seed)["doctor"] == pytest.approx(campaign)
    # Two confirmed outcomes against 4 cases at 0.5 each: equal evidence, the mean.
    stored = {
        "doctor": AgentReputation(
            system="clinic",
            agent_id="doctor",
            beta=0.1,
            confirmations=2,
            investigation_id="i",
            updated_at=AT,
        )
    }
    assert betas_in_use(spec(0.5), stored, seed)["doctor"] == pytest.approx((0.1 + campaign) / 2)
    assert betas_in_use(spec(0.5), stored, seed)["chief"] == 0.25


async def test_the_seed_is_stored_apart_from_confirmed_reputations(store_db: StoreDb) -> None:
    seed = seed_from(spec(0.5), [outcome("a", "doctor", "doctor")], source="c1", at=AT)
    store = await store_db.open()
    try:
        assert await store.campaign_seed("clinic") is None
        await store.put_campaign_seed(seed)
        replaced = seed.model_copy(update={"source": "c2"})
        await store.put_campaign_seed(replaced)
        assert await store.campaign_seed("clinic") == replaced
        assert await store.reputations("clinic") == {}
    finally:
        await store.close()
    assert verify(store_db.target).ok
    kinds = store_db.query("SELECT count(*) FROM audit WHERE kind = 'campaign_seed'")
    assert kinds == [(2,)], "each seed is chained, the replaced one kept"


@pytest.fixture
def daemon_spec() -> SystemSpec:
    return spec(0.5)


def results_file(tmp_path: Path) -> Path:
    """Lines as `poirotd eval` writes them, one failed run among them."""
    lines = [
        {
            "case_id": "a",
            "dataset": "whowhen",
            "method": "poirot",
            "status": "ok",
            "region_ids": list(REGIONS),
            "decision": [1, 0, 0, 0],
            "truth": {"regions": ["doctor"], "step": None},
            "votes": [{"agent_id": "doctor", "location": [1, 0, 0, 0]}],
        },
        {
            "case_id": "b",
            "dataset": "whowhen",
            "method": "baseline",
            "status": "failed",
            "region_ids": list(REGIONS),
            "truth": {"regions": ["exo"], "step": None},
        },
    ]
    path = tmp_path / "results.jsonl"
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    return path


async def test_seed_reputation_is_shown_beside_the_confirmed_values(
    client: PoirotClient, tmp_path: Path
) -> None:
    before = await client.reputation()
    assert before.campaign_source == "" and before.campaign_weight == 0.5
    seeded = await client.seed_reputation("campaign-7", campaign_outcomes(results_file(tmp_path)))
    assert seeded.campaign_source == "campaign-7" and seeded.campaign_cases == 1
    doctor = next(b for b in seeded.betas if b.agent_id == "doctor")
    assert doctor.confirmations == 0 and doctor.confirmed_beta == 0.25
    assert doctor.HasField("campaign") and doctor.campaign.cases == 1
    assert doctor.beta == pytest.approx(doctor.campaign.value) and doctor.beta > 0.25
    chief = next(b for b in seeded.betas if b.agent_id == "chief")
    assert not chief.HasField("campaign") and chief.beta == 0.25
    poirot = next(r for r in seeded.reliabilities if r.method == "poirot")
    assert poirot.confirmations == 0 and poirot.campaign.cases == 1
    # ensemble.reliability.campaign_weight is 0 (its default): shown, not weighed in.
    assert seeded.reliability_campaign_weight == 0 and poirot.campaign.value > 0.25
    assert poirot.reliability == 0.25
    shown = await client.reputation()
    assert shown.campaign_source == "campaign-7"

    bad = campaign_outcomes(results_file(tmp_path))
    bad[0].decision.append(1)
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await client.seed_reputation("broken", bad)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "decision has 5 entries for 4 regions" in (refused.value.details() or "")


async def test_operators_seed_and_read_the_campaign_from_the_command_line(
    daemon: Daemon, tmp_path: Path
) -> None:
    target = f"127.0.0.1:{daemon.grpc_port}"
    results = results_file(tmp_path)
    seeded = await asyncio.to_thread(
        poirotd, "reputation", "seed", "--from", str(results), "--target", target
    )
    assert seeded.returncode == 0, seeded.stderr
    assert "seeded from results.jsonl: 1 outcomes, campaign weight 0.5" in seeded.stdout
    shown = await asyncio.to_thread(poirotd, "reputation", "--target", target)
    assert shown.returncode == 0, shown.stderr
    # doctor: in use 0.300, no confirmation, confirmed 0.250, campaign 0.300 over 1 case.
    assert re.search(r"doctor\W+0\.300\W+0\W+0\.250\W+0\.300 \(1\)", shown.stdout)

    (tmp_path / "bad.jsonl").write_text('{"case_id": "a"}\n')
    refused = await asyncio.to_thread(
        poirotd, "reputation", "seed", "--from", str(tmp_path / "bad.jsonl"), "--target", target
    )
    assert refused.returncode == 2 and "bad.jsonl:1: not a result line" in refused.stderr
