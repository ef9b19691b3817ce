"""A bounded fuzz of the OTLP transports (issue 19): random mutations of valid exports against a
real in-process daemon, over gRPC and HTTP, and what became of each.

    .venv/bin/python -m bench.otlp_fuzz                        # 10,000 inputs, a few minutes
    .venv/bin/python -m bench.otlp_fuzz --inputs 300 --no-write

Seeds: the four recorded runs of tests/data/otlp (GenAI attributes, GenAI events, OpenInference,
and Microsoft Agent Framework's own spans of examples/agent_framework_genai.py, with workflow spans
and links), each given its own trace id and conversation per input, so that what an input stored
can be read back alone. Half the inputs are protobuf byte mutations (bits flipped, bytes set to
edge values, ranges deleted, inserted or repeated, truncation, two seeds spliced, an overlong
varint), sent in turn over gRPC as raw bytes and over HTTP as `application/x-protobuf` (some
gzipped, some of those with the gzip stream itself mutated). The other half are OTLP/JSON structure
mutations (a node deleted, replaced by a value of another type, a list item repeated, an
attribute's value retyped, a string cut or garbled, the JSON inside an attribute mutated the same
ways, a parent loop, edge timestamps), sent over HTTP as JSON and, when protobuf's JSON mapping
still reads them, in turn over gRPC as protobuf.

Each answer is one of: accepted, partial_success (some spans rejected), a clear error (a 4xx or
a gRPC status other than INTERNAL / UNKNOWN / UNAVAILABLE, with a message), throttled, or a
crash (500, INTERNAL, UNKNOWN, UNAVAILABLE, no answer in time, an error without a message).
An acknowledged input is then checked stored: the daemon's own mapping of it (pure, so run again
here) gives the messages it must hold, and every span whose messages are missing must be one of
the spans the answer reported rejected, or a copy: a message whose idempotency key (its span's
start, trace and span id and its place in it) another input's message, or an earlier one of its
own, has too, and that one is stored (a mutation may repeat a span, splice another seed's spans
in, or make two inputs' ids alike; the store keeps one message a key). Any other is
acknowledged-but-lost. Goals: 0 crashes, 0 lost. The result replaces this bench's section of
BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import gzip
import json
import random
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import grpc
import httpx
from google.protobuf import json_format
from google.protobuf.message import DecodeError
from google.rpc.status_pb2 import Status
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from bench import report
from bench.otlp import started_daemon
from bench.sections.otlp_fuzz import SECTION, section
from poirotd.config import Settings
from poirotd.devtools.otlp_runs import RUNS, SPEC, otlp_json, recorded_export
from poirotd.errors import ServiceError
from poirotd.model import AgentMessage, ItemKey
from poirotd.observability import logs
from poirotd.store import Store
from poirotd.transports.otlp.http import JSON, PROTOBUF, _decode
from poirotd.transports.otlp.mapping import MappedExport, MappedMessage, map_export

# Microsoft Agent Framework's run as the framework itself traced it (tests/data/otlp, recorded by
# tests/support/otlp_runs.py): read as data, since rebuilding it needs the framework's example.
AGENT_FRAMEWORK_EXPORT = Path(__file__).parents[1] / "tests/data/otlp/agent_framework.pb"
EXPORT = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
# Requests in flight at once: enough to overlap the commits, few enough not to be throttled.
CONCURRENCY = 8
TIMEOUT_SECONDS = 30.0
_CONVERSATION_KEYS = ("gen_ai.conversation.id", "session.id")
_CRASH_CODES = (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN, grpc.StatusCode.UNAVAILABLE)


# ------------------------------------------------------------------ seeds


def seeds() -> list[ExportTraceServiceRequest]:
    recorded = AGENT_FRAMEWORK_EXPORT.read_bytes()
    return [recorded_export(RUNS[name]) for name in sorted(RUNS)] + [
        ExportTraceServiceRequest.FromString(recorded)
    ]


def unique(seed: ExportTraceServiceRequest, n: int) -> ExportTraceServiceRequest:
    """The seed as input n's own: a trace id and a conversation no other input has."""
    export = ExportTraceServiceRequest()
    export.CopyFrom(seed)
    trace_id = (0xF0 << 120 | n).to_bytes(16, "big")
    for resource_spans in export.resource_spans:
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                span.trace_id = trace_id
                for link in span.links:
                    link.trace_id = trace_id
                for pair in span.attributes:
                    if pair.key in _CONVERSATION_KEYS:
                        pair.value.string_value = f"fuzz-{n:06d}"
    return export


# ------------------------------------------------------------------ protobuf byte mutations

_EDGE_BYTES = (0x00, 0x01, 0x7F, 0x80, 0xFF)


def mutate_bytes(rng: random.Random, data: bytes, other: bytes) -> tuple[bytes, str]:
    """1 to 3 byte mutations of `data` (`other`: a second seed to splice with), and their names."""
    out = bytearray(data)
    names = []
    for _ in range(rng.randint(1, 3)):
        name, mutation = rng.choice(_BYTE_MUTATIONS)
        mutation(rng, out, other)
        names.append(name)
    return bytes(out), "+".join(names)


def _flip(rng: random.Random, out: bytearray, other: bytes) -> None:
    for _ in range(rng.randint(1, 8)):
        if out:
            out[rng.randrange(len(out))] ^= 1 << rng.randrange(8)


def _set_edge(rng: random.Random, out: bytearray, other: bytes) -> None:
    for _ in range(rng.randint(1, 4)):
        if out:
            out[rng.randrange(len(out))] = rng.choice(_EDGE_BYTES)


def _delete(rng: random.Random, out: bytearray, other: bytes) -> None:
    if out:
        start = rng.randrange(len(out))
        del out[start : start + rng.randint(1, 64)]


def _insert(rng: random.Random, out: bytearray, other: bytes) -> None:
    at = rng.randint(0, len(out))
    out[at:at] = rng.randbytes(rng.randint(1, 32))


def _repeat(rng: random.Random, out: bytearray, other: bytes) -> None:
    if out:
        start = rng.randrange(len(out))
        chunk = out[start : start + rng.randint(1, 256)]
        at = rng.randint(0, len(out))
        out[at:at] = chunk * rng.randint(1, 4)


def _truncate(rng: random.Random, out: bytearray, other: bytes) -> None:
    if out:
        del out[rng.randrange(len(out)) :]


def _splice(rng: random.Random, out: bytearray, other: bytes) -> None:
    cut = rng.randint(0, len(out))
    out[cut:] = other[rng.randint(0, len(other)) :]


def _overlong_varint(rng: random.Random, out: bytearray, other: bytes) -> None:
    at = rng.randint(0, len(out))
    out[at:at] = b"\xff" * rng.randint(9, 11)


_BYTE_MUTATIONS: tuple[tuple[str, Callable[[random.Random, bytearray, bytes], None]], ...] = (
    ("flip", _flip),
    ("edge", _set_edge),
    ("delete", _delete),
    ("insert", _insert),
    ("repeat", _repeat),
    ("truncate", _truncate),
    ("splice", _splice),
    ("varint", _overlong_varint),
)


# ------------------------------------------------------------------ OTLP/JSON structure mutations

# Values of every JSON type, and of the shapes OTLP's JSON gives values, ids and times.
_VALUES: tuple[Any, ...] = (
    None,
    True,
    0,
    -1,
    2**64,
    1.5,
    float("1e308"),
    "",
    "zz",
    "x" * 5000,
    "\u0000\ud7ff\ufffd",
    "\ud800 a lone surrogate",
    [],
    {},
    [1, "a", None],
    {"stringValue": 5},
    {"intValue": "abc"},
    {"intValue": "99999999999999999999"},
    {"doubleValue": "NaN"},
    {"bytesValue": "!!"},
    {"bytesValue": "AAEC"},
    {"arrayValue": {"values": [{"stringValue": "a"}, {"kvlistValue": {"values": []}}]}},
    {"kvlistValue": {"values": [{"key": "k", "value": {"boolValue": True}}]}},
    "0",
    "-1",
    "18446744073709551615",
    "18446744073709551616",
    "abc",
    "00000000000000000000000000000000",
    "0000000000000000",
    [
        [
            [
                [
                    [
                        [
                            [
                                [
                                    [
                                        [
                                            [
                                                [
                                                    [
                                                        [
                                                            [
                                                                [
                                                                    [
                                                                        [
                                                                            [
                                                                                [
                                                                                    [
                                                                                        [
                                                                                            [
                                                                                                [
                                                                                                    [
                                                                                                        [
                                                                                                            [
                                                                                                                [
                                                                                                                    [
                                                                                                                        [
                                                                                                                            [
                                                                                                                                [
                                                                                                                                    [
                                                                                                                                        [
                                                                                                                                            [
                                                                                                                                                [
                                                                                                                                                    [
                                                                                                                                                        [
                                                                                                                                                            [
                                                                                                                                                                [
                                                                                                                                                                    [
                                                                                                                                                                        [
                                                                                                                                                                            [
                                                                                                                                                                                [
                                                                                                                                                                                    [
                                                                                                                                                                                        [
                                                                                                                                                                                            [
                                                                                                                                                                                                [
                                                                                                                                                                                                    []
                                                                                                                                                                                                ]
                                                                                                                                                                                            ]
                                                                                                                                                                                        ]
                                                                                                                                                                                    ]
                                                                                                                                                                                ]
                                                                                                                                                                            ]
                                                                                                                                                                        ]
                                                                                                                                                                    ]
                                                                                                                                                                ]
                                                                                                                                                            ]
                                                                                                                                                        ]
                                                                                                                                                    ]
                                                                                                                                                ]
                                                                                                                                            ]
                                                                                                                                        ]
                                                                                                                                    ]
                                                                                                                                ]
                                                                                                                            ]
                                                                                                                        ]
                                                                                                                    ]
                                                                                                                ]
                                                                                                            ]
                                                                                                        ]
                                                                                                    ]
                                                                                                ]
                                                                                            ]
                                                                                        ]
                                                                                    ]
                                                                                ]
                                                                            ]
                                                                        ]
                                                                    ]
                                                                ]
                                                            ]
                                                        ]
                                                    ]
                                                ]
                                            ]
                                        ]
                                    ]
                                ]
                            ]
                        ]
                    ]
                ]
            ]
        ]
    ],
)


def mutate_document(rng: random.Random, document: dict[str, Any]) -> str:
    """1 to 3 structure mutations of an OTLP/JSON document, in place; their names."""
    names = []
    for _ in range(rng.randint(1, 3)):
        name, mutation = rng.choice(_JSON_MUTATIONS)
        mutation(rng, document)
        names.append(name)
    return "+".join(names)


def _places(node: Any) -> Iterator[tuple[Any, Any]]:
    """(container, key) of every value under `node`."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield node, key
            yield from _places(value)
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield node, index
            yield from _places(value)


def _some_place(rng: random.Random, node: Any) -> tuple[Any, Any] | None:
    places = list(_places(node))
    return rng.choice(places) if places else None


def _json_delete(rng: random.Random, node: Any) -> None:
    if place := _some_place(rng, node):
        container, key = place
        del container[key]


def _json_replace(rng: random.Random, node: Any) -> None:
    if place := _some_place(rng, node):
        container, key = place
        container[key] = copy.deepcopy(rng.choice(_VALUES))


def _json_repeat(rng: random.Random, node: Any) -> None:
    lists = [c[k] for c, k in _places(node) if isinstance(c[k], list) and c[k]]
    if lists:
        chosen = rng.choice(lists)
        item = rng.choice(chosen)
        chosen.extend(copy.deepcopy(item) for _ in range(rng.randint(1, 3)))


def _json_retype_attribute(rng: random.Random, node: Any) -> None:
    attributes = [
        c for c, k in _places(node) if k == "value" and isinstance(c, dict) and "key" in c
    ]
    if attributes:
        rng.choice(attributes)["value"] = copy.deepcopy(rng.choice(_VALUES))


def _json_garble_string(rng: random.Random, node: Any) -> None:
    strings = [(c, k) for c, k in _places(node) if isinstance(c[k], str)]
    if strings:
        container, key = rng.choice(strings)
        container[key] = _garbled(rng, container[key])


def _garbled(rng: random.Random, text: str) -> str:
    choice = rng.randrange(5)
    if choice == 0:
        return text[: rng.randint(0, len(text))]
    if choice == 1:
        return text + rng.choice(("\\", '"', "\u0000", "}", "]", "\ud83d\ude00", "é"))
    if choice == 2 and text:
        at = rng.randrange(len(text))
        return text[:at] + chr(rng.randrange(0x20, 0x3000)) + text[at + 1 :]
    if choice == 3:
        return text * rng.randint(2, 50)
    return ""


def _json_inner(rng: random.Random, node: Any) -> None:
    """Mutates the JSON an attribute holds as a string (gen_ai.*.messages, arguments, metadata)."""
    holders = []
    for container, key in _places(node):
        value = container[key]
        if isinstance(value, str) and value[:1] in "[{":
            try:
                holders.append((container, key, json.loads(value)))
            except ValueError:
                continue
    if holders:
        container, key, inner = rng.choice(holders)
        wrapper = {"inner": inner}
        rng.choice((_json_delete, _json_replace, _json_repeat, _json_garble_string))(rng, wrapper)
        container[key] = json.dumps(wrapper.get("inner"))


def _json_parent_loop(rng: random.Random, node: Any) -> None:
    spans = [c[k] for c, k in _places(node) if k == "spans" and isinstance(c[k], list)]
    flat = [s for group in spans for s in group if isinstance(s, dict) and "spanId" in s]
    if len(flat) >= 2:
        a, b = rng.sample(flat, 2)
        a["parentSpanId"], b["parentSpanId"] = b["spanId"], a["spanId"]
    elif flat:
        flat[0]["parentSpanId"] = flat[0]["spanId"]


def _json_edge_time(rng: random.Random, node: Any) -> None:
    times = [(c, k) for c, k in _places(node) if isinstance(k, str) and k.endswith("UnixNano")]
    if times:
        container, key = rng.choice(times)
        container[key] = rng.choice(
            ("0", "1", "18446744073709551615", "99999999999999999999", -5, 1e30, "abc", None)
        )


_JSON_MUTATIONS: tuple[tuple[str, Callable[[random.Random, Any], None]], ...] = (
    ("delete", _json_delete),
    ("replace", _json_replace),
    ("repeat", _json_repeat),
    ("retype", _json_retype_attribute),
    ("garble", _json_garble_string),
    ("inner", _json_inner),
    ("parent_loop", _json_parent_loop),
    ("edge_time", _json_edge_time),
)


# ------------------------------------------------------------------ inputs and their fate


@dataclass(frozen=True)
class Input:
    transport: str  # "grpc" or "http"
    body: bytes
    content_type: str = PROTOBUF
    encoding: str = "identity"


@dataclass
class Tally:
    outcomes: Counter[tuple[str, str]] = field(default_factory=Counter)
    lost_spans: int = 0
    copies: int = 0
    lost_examples: list[str] = field(default_factory=list)
    crash_examples: list[str] = field(default_factory=list)
    inputs: int = 0
    stored_messages: int = 0

    def count(self, kind: str, outcome: str) -> None:
        self.outcomes[(kind, outcome)] += 1
        self.inputs += 1

    def total(self, outcome: str) -> int:
        return sum(n for (_, o), n in self.outcomes.items() if o == outcome)


def make_input(seed: int, n: int, pool: list[ExportTraceServiceRequest]) -> tuple[str, Input]:
    """Input n of the run `seed`: (its kind, the input); the same whatever order inputs are
    made in. Even n: protobuf bytes; odd n: OTLP/JSON structure."""
    rng = random.Random(seed * 1_000_003 + n)
    export = unique(rng.choice(pool), n)
    if n % 2 == 0:
        other = rng.choice(pool).SerializeToString()
        body, _ = mutate_bytes(rng, export.SerializeToString(), other)
        if n % 4 == 0:
            return "protobuf", Input("grpc", body)
        if rng.random() < 0.25:
            zipped = gzip.compress(body)
            if rng.random() < 0.25:
                zipped, _ = mutate_bytes(rng, zipped, b"")
            return "protobuf+gzip", Input("http", zipped, PROTOBUF, "gzip")
        return "protobuf", Input("http", body)
    document = json.loads(otlp_json(export))
    mutate_document(rng, document)
    body = json.dumps(document).encode()
    if n % 4 == 3:
        try:
            parsed = _decode(ExportTraceServiceRequest, body, JSON, "identity", 1 << 30)
        except ServiceError:
            return "json", Input("http", body, JSON)
        return "json→protobuf", Input("grpc", parsed.SerializeToString())
    return "json", Input("http", body, JSON)


async def send(
    item: Input, channel: grpc.aio.Channel, http: httpx.AsyncClient, url: str
) -> tuple[str, ExportTraceServiceResponse | None, str]:
    """(outcome, the answer if acknowledged, what went wrong if it crashed)."""
    if item.transport == "grpc":
        export = channel.unary_unary(
            EXPORT,
            request_serializer=None,
            response_deserializer=ExportTraceServiceResponse.FromString,
        )
        try:
            answer: ExportTraceServiceResponse = await export(item.body, timeout=TIMEOUT_SECONDS)
        except grpc.aio.AioRpcError as error:
            return _grpc_refusal(error)
        return _acknowledged(answer), answer, ""
    headers = {"Content-Type": item.content_type, "Content-Encoding": item.encoding}
    try:
        response = await http.post(url, content=item.body, headers=headers)
    except httpx.HTTPError as exc:
        return "crash", None, f"http: {exc!r}"
    if response.status_code == 200:
        body = ExportTraceServiceResponse()
        if item.content_type == PROTOBUF:
            body.ParseFromString(response.content)
        else:
            json_format.Parse(response.content, body)
        return _acknowledged(body), body, ""
    return _http_refusal(item, response)


def _acknowledged(answer: ExportTraceServiceResponse) -> str:
    return "partial_success" if answer.partial_success.rejected_spans else "accepted"


def _grpc_refusal(error: grpc.aio.AioRpcError) -> tuple[str, None, str]:
    code, details = error.code(), error.details() or ""
    if code in _CRASH_CODES or code is grpc.StatusCode.DEADLINE_EXCEEDED or not details:
        return "crash", None, f"grpc {code.name}: {details}"
    if code is grpc.StatusCode.RESOURCE_EXHAUSTED and "retry" in details:
        return "throttled", None, ""
    return "clear_error", None, ""


def _http_refusal(item: Input, response: httpx.Response) -> tuple[str, None, str]:
    status = Status()
    try:
        if response.headers.get("Content-Type", "").startswith(PROTOBUF):
            status.ParseFromString(response.content)
        else:
            json_format.Parse(response.content, status)
    except Exception:  # an answer that is not a Status is no clear error
        return "crash", None, f"http {response.status_code}: {response.text[:200]}"
    if response.status_code >= 500 or not status.message:
        return "crash", None, f"http {response.status_code}: {status.message}"
    if response.status_code == 429:
        return "throttled", None, ""
    return "clear_error", None, ""


def mapped(item: Input, settings: Settings) -> MappedExport | None:
    """The daemon's own mapping of the input (pure, so run again here), or None: it does not
    decode, and the daemon refuses it."""
    try:
        if item.transport == "grpc":
            request = ExportTraceServiceRequest.FromString(item.body)
        else:
            request = _decode(
                ExportTraceServiceRequest,
                item.body,
                item.content_type,
                item.encoding,
                settings.otlp_max_body_bytes,
            )
    except (DecodeError, ServiceError):
        return None
    try:
        return map_export(request, SPEC.agents_by_alias(), session_by=settings.otlp_session)
    except Exception:  # the daemon's mapping fails the same way: `send` counts its crash
        return None


@dataclass
class Claims:
    """The messages of every input sent so far, by idempotency key: a message missing from the
    store is a copy, not a loss, when another message with its key is stored (whichever input
    was committed first, the concurrent workers may check them in either order)."""

    by_key: dict[ItemKey, list[MappedMessage]] = field(default_factory=dict)

    def add(self, export: MappedExport) -> None:
        for m in export.messages:
            if (key := m.key()) is not None:
                self.by_key.setdefault(key, []).append(m)

    async def stored_copy(self, m: MappedMessage, stored: Stored) -> bool:
        key = m.key()
        others = self.by_key.get(key, []) if key is not None else []
        for other in others:
            if other != m and _key(other) in await stored.of(other.session_id):
                return True
        return False


@dataclass
class Stored:
    """The stored messages of the sessions asked about, read once each."""

    store: Store
    sessions: dict[str, set[tuple[Any, ...]]] = field(default_factory=dict)

    async def of(self, session_id: str) -> set[tuple[Any, ...]]:
        if session_id not in self.sessions:
            messages = await self.store.session_messages(session_id)
            self.sessions[session_id] = {_key(m) for m in messages}
        return self.sessions[session_id]


async def lost_spans(
    export: MappedExport, answer: ExportTraceServiceResponse, store: Store, claims: Claims
) -> tuple[int, int, int, str]:
    """(spans whose messages are missing beyond those the answer reported rejected, messages
    found stored, messages missing as copies of stored ones, an example of what is missing)."""
    stored = Stored(store)
    missing: dict[tuple[str, str], MappedMessage] = {}
    copies = 0
    for m in export.messages:
        if _key(m) in await stored.of(m.session_id):
            continue
        if await claims.stored_copy(m, stored):
            copies += 1
        else:
            missing[(m.trace_id, m.span_id)] = m
    refused_by_pipeline = answer.partial_success.rejected_spans - len(export.rejections)
    lost = max(0, len(missing) - refused_by_pipeline)
    example = ""
    if lost:
        (trace_id, span_id), message = next(iter(missing.items()))
        example = f"span {span_id} of trace {trace_id}: {message.kind} from {message.sender}"
    found = len(export.messages) - len(missing) - copies
    return lost, found, copies, example


def _key(m: AgentMessage | MappedMessage) -> tuple[Any, ...]:
    return (m.trace_id, m.span_id, m.kind, m.sender, m.recipient, m.content, m.tool_calls)


async def run(
    inputs: int, seed: int, make: Callable[[int], tuple[str, Input]] | None = None
) -> Tally:
    """Sends `inputs` inputs (input n: `make(n)`, by default `make_input(seed, n, ...)`) and
    checks what became of each."""
    pool = seeds()
    make = make or partial(make_input, seed, pool=pool)
    tally = Tally()
    spec = SPEC.model_copy(update={"rules": ()})
    with tempfile.TemporaryDirectory() as folder:
        daemon = await started_daemon(Path(folder), spec)
        settings = daemon.settings
        store = daemon._store
        assert store is not None
        url = f"http://127.0.0.1:{settings.otlp_http_port}/v1/traces"
        try:
            async with (
                grpc.aio.insecure_channel(f"127.0.0.1:{daemon.grpc_port}") as channel,
                httpx.AsyncClient(timeout=TIMEOUT_SECONDS) as http,
            ):
                queue = iter(range(inputs))
                claims = Claims()

                async def worker() -> None:
                    for n in queue:
                        kind, item = make(n)
                        export = mapped(item, settings)
                        if export is not None:
                            claims.add(export)
                        outcome, answer, problem = await send(item, channel, http, url)
                        tally.count(f"{item.transport} {kind}", outcome)
                        if problem and len(tally.crash_examples) < 5:
                            tally.crash_examples.append(f"input {n} ({kind}): {problem}")
                        if answer is not None:
                            assert export is not None, f"input {n} acknowledged, not decoded"
                            lost, found, copies, example = await lost_spans(
                                export, answer, store, claims
                            )
                            tally.lost_spans += lost
                            tally.stored_messages += found
                            tally.copies += copies
                            if example and len(tally.lost_examples) < 5:
                                tally.lost_examples.append(f"input {n} ({kind}): {example}")

                async with asyncio.TaskGroup() as group:
                    for _ in range(CONCURRENCY):
                        group.create_task(worker())
                # The daemon still serves: a valid export is stored whole.
                outcome, _, problem = await send(
                    Input("grpc", unique(pool[0], inputs).SerializeToString()), channel, http, url
                )
                if outcome not in ("accepted", "partial_success"):
                    tally.count("after the fuzz", "crash")
                    tally.crash_examples.append(f"a valid export afterwards: {problem}")
        finally:
            await daemon.stop()
    return tally


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inputs", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=19)
    report.add_no_write(parser)
    args = parser.parse_args()
    logs.configure("error", "console")  # a refused input is a warning: 10,000 of them
    started = time.perf_counter()
    tally = asyncio.run(run(args.inputs, args.seed))
    seconds = time.perf_counter() - started
    report.publish(
        SECTION, section(tally, args.seed, seconds, TIMEOUT_SECONDS), write=not args.no_write
    )


if __name__ == "__main__":
    main()
