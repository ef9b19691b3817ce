"""The blocking client: record a short run (messages and a telemetry sample), ask for an
investigation, print its events as they come, and confirm its outcome.

    poirotd run --config poirotd/demo/cortex.yaml &      # or your own spec
    python -m examples.record_and_investigate --system cortex --component d2w_exoskeleton
"""

from __future__ import annotations

import argparse

from poirotd.client import Client, Message, Sample
from poirotd.model import MessageKind


def main(target: str, system: str, component: str, session: str = "example-run") -> str:
    """Returns the investigation's id."""
    with Client(target, system=system) as poirot:
        poirot.start_session(session, labels={"source": "examples"})
        poirot.record(
            session,
            [
                Message(
                    "parent",
                    "Plan my son's gait therapy.",
                    recipient="chief",
                    kind=MessageKind.HUMAN,
                ),
                Message(
                    "doctor", "Proprioception 2/8: proceed at full assistance.", recipient="chief"
                ),
                Sample(component, "proprioception_score", 2.0),
                Message("chief", "Plan 4, full assistance, from Monday.", recipient="parent"),
            ],
        )
        queued = poirot.trigger(session, "the patient fell in session 3")
        print("investigation", queued.investigation_id)
        for event in poirot.watch(queued.investigation_id):
            print(" ", event.event_id, event.WhichOneof("event"))
        done = poirot.get(queued.investigation_id)
        regions = [region.id for region in done.hazard_space.regions]
        for region, score in zip(regions, done.attribution.scores, strict=False):
            print(f"  {region}: {score:.2f}")
        if done.attribution.top:
            # An operator who found the true cause names it; here, the attribution's top region.
            cause = regions[done.attribution.top[0]]
            confirmed = poirot.confirm(done.investigation_id, [cause], note="clinician review")
            print("confirmed", list(confirmed.confirmed.region_ids))
        poirot.end_session(session)
    return done.investigation_id


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="127.0.0.1:50051")
    parser.add_argument("--system", default="cortex")
    parser.add_argument("--component", default="d2w_exoskeleton")
    args = parser.parse_args()
    main(args.target, args.system, args.component)
