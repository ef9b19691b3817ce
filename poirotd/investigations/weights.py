"""The weights a run uses, read from the store as it starts: each agent's β and, for an
ensemble, each member's reliability, from confirmed outcomes and a campaign's seed. One place for
every reader (the runner, the canaries, GetReputation), so they never weigh differently."""

from __future__ import annotations

from poirotd.config import SystemSpec
from poirotd.model import InvestigationMethod
from poirotd.protocol.ensemble import method_reliabilities
from poirotd.protocol.reputation import betas_in_use
from poirotd.store import Store


async def betas_now(spec: SystemSpec, store: Store) -> dict[str, float]:
    """The β each agent's vote is weighed with from now on."""
    system = spec.system.name
    return betas_in_use(spec, await store.reputations(system), await store.campaign_seed(system))


async def reliabilities_now(
    spec: SystemSpec, store: Store, method: InvestigationMethod
) -> dict[str, float]:
    """The methods' reliabilities, which only an ensemble weighs ({} for another method)."""
    if method != "ensemble":
        return {}
    system = spec.system.name
    return method_reliabilities(
        spec.protocol.ensemble.reliability,
        await store.confirmed_investigations(system),
        await store.campaign_seed(system),
    )
