"""Agent-message load for the gRPC ingest benchmark, run as its own process (the agents of a MAS
are other processes): ``python -m bench.agents --target HOST:PORT ...``.

Each stream opens its own session and sends agent messages through ``Ingest.Stream`` from a
generator, so nothing is materialised up front: as fast as acks allow in batched requests, or
paced, one item per request; the daemon commits them in batches and acks each only once
committed. Prints ``ready``, starts on a line on stdin, prints one JSON line of results.
Bounded: a message count per stream, or a rate for a duration. With --ca-file it connects over
TLS (with --cert-file/--key-file, mTLS), with --token-file it sends that bearer token.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

from poirotd.api.poirot.v1 import poirot_pb2 as pb
from poirotd.client.wire import DaemonTls, PoirotClient, batched

SENDERS = ("doctor", "chief", "physio")
# About the length of one turn in the BLAME CORTEX sessions.
CONTENT = (
    "Gait session 14, left knee flexion peaks at 58 degrees, within the expected band; "
    "proprioception assessed 6 of 8, pain VAS 2. Recommend keeping traction support at 60 N "
    "and raising cadence by 5 percent next session if the heart rate stays under 130 bpm."
)


def requests(session_id: str, count: int) -> Iterator[pb.IngestRequest]:
    """The session start, then `count` messages (one item each, not numbered)."""
    yield pb.IngestRequest(session_start=pb.SessionStart(session_id=session_id, system="clinic"))
    for index in range(count):
        message = pb.AgentMessage(
            session_id=session_id,
            index=index,
            kind=pb.MESSAGE_KIND_AGENT,
            sender=SENDERS[index % 3],
            content=CONTENT,
        )
        yield pb.IngestRequest(agent_message=message)


async def paced(items: Iterator[pb.IngestRequest], rate: float) -> AsyncIterator[pb.IngestRequest]:
    """One item per request, numbered from 1, the messages at `rate` per second: an agent that
    says one thing at a time (the original single-item form of the wire)."""
    loop = asyncio.get_running_loop()
    began = loop.time()
    for seq, request in enumerate(items, start=1):
        await asyncio.sleep(max(0.0, began + (seq - 2) / rate - loop.time()))
        request.seq = seq
        yield request


async def stream(client: PoirotClient, session_id: str, count: int, rate: float | None) -> int:
    """Messages acked as durable (the session start is not counted). Unpaced, the items go in
    batched requests, as a client with a backlog sends them."""
    items = requests(session_id, count)
    durable = 0
    async for ack in client.ingest.Stream(batched(items) if rate is None else paced(items, rate)):
        durable = ack.durable_seq
    return max(0, durable - 1)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--target", required=True)
    parser.add_argument("--streams", type=int, default=4)
    parser.add_argument("--messages", type=int, help="per stream, as fast as acks allow")
    parser.add_argument("--rate", type=float, help="messages/s per stream, paced")
    parser.add_argument("--seconds", type=float, help="with --rate: for this long")
    parser.add_argument("--ca-file", type=Path, help="TLS: the CA of the daemon's certificate")
    parser.add_argument("--cert-file", type=Path, help="mTLS: this client's certificate")
    parser.add_argument("--key-file", type=Path, help="mTLS: its key")
    parser.add_argument("--server-name", help="TLS: the name in the daemon's certificate")
    parser.add_argument("--token-file", type=Path, help="a bearer token with the ingest role")
    args = parser.parse_args()
    count = args.messages if args.messages is not None else int(args.rate * args.seconds)
    tls = (
        DaemonTls(
            args.ca_file.read_bytes(),
            args.cert_file and args.cert_file.read_bytes(),
            args.key_file and args.key_file.read_bytes(),
            args.server_name,
        )
        if args.ca_file
        else None
    )
    token = args.token_file.read_text().strip() if args.token_file else None
    async with PoirotClient(args.target, tls=tls, token=token) as client:
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
