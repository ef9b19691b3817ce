"""The asyncio client: record agent messages as they happen (the daemon numbers them) while
another task follows every investigation's events.

    python -m examples.record_async --system cortex
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib

from poirotd.client import AsyncClient, Message


async def main(target: str, system: str, session: str = "example-async") -> list[str]:
    """Returns the kinds of the events seen."""
    seen: list[str] = []
    async with AsyncClient(target, system=system) as poirot:

        async def follow() -> None:
            async for event in poirot.watch():  # every investigation's, from now on
                seen.append(event.WhichOneof("event") or "")
                print("event", event.investigation_id, seen[-1])

        follower = asyncio.create_task(follow())
        await poirot.start_session(session)
        for turn, (agent, text) in enumerate(
            [("doctor", "Tests done: offset 15 deg on the left ankle."), ("chief", "Plan 2.")]
        ):
            await poirot.record(session, [Message(agent, text)])
            print("recorded turn", turn)
        queued = await poirot.trigger(session, "an operator asked")
        async for _ in poirot.watch(queued.investigation_id):
            pass  # until it ends
        await asyncio.sleep(0.2)  # the follower prints the last events too
        follower.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await follower
    return seen


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="127.0.0.1:50051")
    parser.add_argument("--system", default="cortex")
    args = parser.parse_args()
    asyncio.run(main(args.target, args.system))
