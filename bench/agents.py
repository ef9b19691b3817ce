"""Agent-message load for the gRPC ingest benchmark, run as its own process (the agents of a MAS
are other processes): ``python -m bench.agents --target HOST:PORT ...``.

Each stream opens its own session and sends agent messages through ``Ingest.Stream`` from a
generator, so nothing is materialised up front; the daemon batches them and acks each batch only
once committed. Prints ``ready``, starts on a line on stdin, prints one JSON line of results.
Bounded: a message count per stream, or a rate for a duration.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections.abc import AsyncIterator

from poirotd.api.poirot.v1 import poirot_pb2 as pb
from poirotd.client import PoirotClient

SENDERS = ("doctor", "chief", "physio")
# About the length of one turn in the BLAME CORTEX sessions.
CONTENT = (
    "Gait session 14, left knee flexion peaks at 58 degrees, within the expected band; "
    "proprioception assessed 6 of 8, pain VAS 2. Recommend keeping traction support at 60 N "
    "and raising cadence by 5 percent next session if the heart rate stays under 130 bpm."
)


async def requests(
    session_id: str, count: int, rate: float | None
) -> AsyncIterator[pb.IngestRequest]:
    """The session start, then `count` messages: at `rate` per second, or as fast as taken."""
    loop = asyncio.get_running_loop()
    began = loop.time()
    start = pb.SessionStart(session_id=session_id, system="clinic")
    yield pb.IngestRequest(seq=1, session_start=start)
    for index in range(count):
        if rate is not None:
            await asyncio.sleep(max(0.0, began + index / rate - loop.time()))
        message = pb.AgentMessage(
            session_id=session_id,
            index=index,
            kind=pb.MESSAGE_KIND_AGENT,
            sender=SENDERS[index % 3],
            content=CONTENT,
        )
        yield pb.IngestRequest(seq=index + 2, agent_message=message)


async def stream(client: PoirotClient, session_id: str, count: int, rate: float | None) -> int:
    """Messages acked as durable (the session start is not counted)."""
    durable = 0
    async for ack in client.ingest.Stream(requests(session_id, count, rate)):
        durable = ack.durable_seq
    return max(0, durable - 1)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--target", required=True)
    parser.add_argument("--streams", type=int, default=4)
    parser.add_argument("--messages", type=int, help="per stream, as fast as acks allow")
    parser.add_argument("--rate", type=float, help="messages/s per stream, paced")
    parser.add_argument("--seconds", type=float, help="with --rate: for this long")
    args = parser.parse_args()
    count = args.messages if args.messages is not None else int(args.rate * args.seconds)
    async with PoirotClient(args.target) as client:
        print("ready", flush=True)
        await asyncio.to_thread(sys.stdin.readline)
        started, cpu_before = time.perf_counter(), time.process_time()
        acked = await asyncio.gather(
            *(
                stream(client, f"agents-{os.getpid()}-{i}", count, args.rate)
                for i in range(args.streams)
            )
        )
        seconds, cpu = time.perf_counter() - started, time.process_time() - cpu_before
    result = {"acked": sum(acked), "seconds": seconds, "cpu_s": cpu}
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
