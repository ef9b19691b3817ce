"""The OTLP exporter end to end: a traced run reaches a real in-process daemon over OTLP, its rule
opens an investigation (scripted backend), and the attribution arrives at a plain OTLP receiver
(OTLP/HTTP and OTLP/gRPC) as a span in the run's own trace, parented on the span it evaluates,
with one gen_ai.evaluation.result event per region and the link to the investigation's page;
the receiver's first answer, 503, is retried. Then the exporter alone: a receiver that does not
answer never holds an investigation up, the bounded queue drops (counted) what does not fit,
and what the receiver refuses or keeps failing is given up, counted."""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from datetime import timedelta
from pathlib import Path
from typing import Any

import grpc
import pytest
import trustme
from opentelemetry.proto.common.v1.common_pb2 import KeyValue

from poirotd.devtools.answers import schema_answer
from poirotd.devtools.otlp_runs import SPEC, send_run
from poirotd.devtools.process import free_port
from poirotd.exporters.evaluations import EVALUATION_EVENT, SPAN_NAME
from poirotd.exporters.exporter import AttributionExporter
from poirotd.exporters.otlp_client import (
    ClientTls,
    ExportProtocol,
    ExportSetupError,
    open_client,
)
from poirotd.llm.scripted import ScriptedBackend
from poirotd.model import (
    Attribution,
    Investigation,
    InvestigationState,
)
from poirotd.observability.metrics import Metrics
from poirotd.store import SqliteStore, Store
from tests.support.daemon import finished_investigation, in_process_daemon
from tests.support.otlp_receiver import (
    Received,
    attributions,
    counted,
    grpc_receiver,
    http_receiver,
)
from tests.support.store import T0, investigation, space

Receiver = Callable[..., AbstractAsyncContextManager[Received]]
PAGE = "https://poirot.example.org"


def values(attributes: Any) -> dict[str, Any]:
    """OTLP key-values as a dict of plain values (arrays as lists)."""
    found: dict[str, Any] = {}
    for pair in attributes:
        assert isinstance(pair, KeyValue)
        which = pair.value.WhichOneof("value")
        if which == "array_value":
            found[pair.key] = [v.string_value for v in pair.value.array_value.values]
        else:
            assert which is not None
            found[pair.key] = getattr(pair.value, which)
    return found


@pytest.mark.parametrize(
    ("receiver", "protocol"),
    [(http_receiver, "http/protobuf"), (grpc_receiver, "grpc")],
)
async def test_an_attribution_arrives_in_the_sessions_trace_after_a_503(
    tmp_path: Path, receiver: Receiver, protocol: str
) -> None:
    async with (
        receiver(answers=[503]) as received,
        in_process_daemon(
            tmp_path,
            SPEC,
            ScriptedBackend(schema_answer),
            otlp_http_port=free_port(),
            otlp_export_endpoint=received.endpoint,
            otlp_export_protocol=protocol,
            otlp_export_backoff_seconds=0.05,
            otlp_export_headers="authorization=Bearer%20s3cret",
            otlp_export_resource_attributes="openinference.project.name=clinic",
            otlp_export_link_base_url=PAGE + "/",
        ) as daemon,
    ):
        store = daemon._store
        assert store is not None
        endpoint = f"http://127.0.0.1:{daemon.settings.otlp_http_port}/v1/traces"
        await asyncio.to_thread(send_run, [endpoint], "visit-7")
        record = await finished_investigation(store, "visit-7")
        assert record.state is InvestigationState.SUCCEEDED
        metrics = daemon.metrics
        await counted(metrics, "exported", 1)
        assert metrics.otlp_export_retries.labels("unavailable")._value.get() == 1
        messages = await store.session_messages("visit-7")

    [first, second] = received.exports
    assert [first[2], second[2]] == [503, 200]
    assert first[0] == second[0], "the retry sends the same export"
    assert second[1]["authorization"] == "Bearer s3cret"
    resource = values(second[0].resource_spans[0].resource.attributes)
    assert resource == {
        "service.name": "poirotd",
        "poirot.system": "clinic",
        "openinference.project.name": "clinic",
    }
    [span] = received.delivered_spans()
    attribution, hazard_space = record.attribution, record.hazard_space
    assert attribution is not None and hazard_space is not None
    # In the run's own trace, parented on the message where the fault shows (else the last).
    evaluated = next((m for m in messages if m.index == attribution.step), messages[-1])
    assert {m.trace_id for m in messages} == {evaluated.trace_id}
    assert span.trace_id.hex() == evaluated.trace_id
    assert span.parent_span_id.hex() == evaluated.span_id
    assert span.name == SPAN_NAME
    assert not span.links, "one trace: nothing to link"
    url = f"{PAGE}/investigations/{record.investigation_id}"
    attributes = values(span.attributes)
    assert attributes["poirot.investigation.id"] == record.investigation_id
    assert attributes["poirot.session.id"] == "visit-7"
    assert attributes["poirot.investigation.url"] == url
    assert attributes["poirot.attribution.top"] == [
        hazard_space.regions[i].id for i in attribution.top
    ]
    events = [values(event.attributes) for event in span.events]
    assert {event.name for event in span.events} == {EVALUATION_EVENT}
    assert [e["gen_ai.evaluation.name"] for e in events] == [r.id for r in hazard_space.regions]
    assert [e["gen_ai.evaluation.score.value"] for e in events] == list(attribution.scores)
    assert [e["gen_ai.evaluation.score.label"] for e in events] == [
        "blamed" if bit else "cleared" for bit in attribution.decision
    ]
    assert all(e["poirot.investigation.url"] == url for e in events)
    for event, region in zip(events, hazard_space.regions, strict=True):
        assert event["gen_ai.evaluation.explanation"].startswith(f"{region.name} ({region.type})")


def _succeeded(iid: str) -> Investigation:
    record = investigation(iid, state=InvestigationState.SUCCEEDED)
    attribution = Attribution(
        scores=(1.25, 0.5), top=(0,), tie=False, decision=(1, 0), rule="argmax", beta=0.25
    )
    return record.model_copy(
        update={
            "hazard_space": space(),
            "attribution": attribution,
            "finished_at": T0 + timedelta(seconds=5),
        }
    )


async def _exporter(
    store: Store, endpoint: str, *, queue_size: int = 8, retry_seconds: float = 5
) -> tuple[AttributionExporter, Metrics]:
    metrics = Metrics("cortex")
    client = open_client("http/protobuf", endpoint, headers={}, tls=ClientTls(), timeout=5)
    exporter = AttributionExporter(
        client,
        metrics,
        resource={"service.name": "poirotd"},
        links=None,
        queue_size=queue_size,
        retry_seconds=retry_seconds,
        backoff_seconds=0.05,
    )
    await exporter.start(store)
    return exporter, metrics


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    opened = await SqliteStore.open(tmp_path / "poirotd.db")
    yield opened
    await opened.close()


async def test_a_full_queue_drops_and_counts_and_never_waits(store: Store) -> None:
    async with http_receiver() as received:
        received.hold.clear()  # the receiver takes the first export and does not answer
        exporter, metrics = await _exporter(store, received.endpoint, queue_size=1)
        exporter.offer(_succeeded("i1"))
        await received.wait_for_exports(1)
        started = time.monotonic()
        exporter.offer(_succeeded("i2"))  # queued
        exporter.offer(_succeeded("i3"))  # the queue is full: dropped
        assert time.monotonic() - started < 0.05, "offering never waits for the receiver"
        exporter.offer(investigation("i4", state=InvestigationState.FAILED))  # no attribution
        assert attributions(metrics, "queue_full") == 1
        assert metrics.registry.get_sample_value("poirot_otlp_export_queued_attributions") == 1
        # Stopped while the receiver still holds the first: both left are counted, not lost.
        await exporter.stop(0.2)
        assert attributions(metrics, "shutdown") == 2
        assert attributions(metrics, "exported") == 0


async def test_the_queue_drains_once_the_receiver_answers(store: Store) -> None:
    async with http_receiver() as received:
        received.hold.clear()
        exporter, metrics = await _exporter(store, received.endpoint, queue_size=2)
        exporter.offer(_succeeded("i1"))
        await received.wait_for_exports(1)
        exporter.offer(_succeeded("i2"))
        exporter.offer(_succeeded("i3"))
        received.hold.set()
        await counted(metrics, "exported", 3)
        await exporter.stop(5)
        spans = received.delivered_spans()
        ids = [values(s.attributes)["poirot.investigation.id"] for s in spans]
        assert ids == ["i1", "i2", "i3"], "the two queued go out together, in order"
        # A session the store does not have gives no trace to join: a trace of its own.
        assert all(not s.parent_span_id and not s.links and any(s.trace_id) for s in spans)


async def test_a_refusal_is_not_retried_and_a_failing_receiver_is_given_up(store: Store) -> None:
    async with http_receiver(answers=[400]) as received:
        exporter, metrics = await _exporter(store, received.endpoint)
        exporter.offer(_succeeded("i1"))
        await counted(metrics, "refused", 1)
        await exporter.stop(5)
        assert len(received.exports) == 1
    async with http_receiver(answers=[503] * 100) as received:
        exporter, metrics = await _exporter(store, received.endpoint, retry_seconds=0.5)
        exporter.offer(_succeeded("i2"))
        await counted(metrics, "gave_up", 1)
        await exporter.stop(1)
        tries = len(received.exports)
        assert metrics.otlp_export_retries.labels("unavailable")._value.get() == tries - 1
        assert 2 <= tries < 10, "backoff: tries grow apart within the retry budget"


@pytest.mark.parametrize("protocol", ["http/protobuf", "grpc"])
async def test_tls_with_a_client_certificate(
    store: Store, tmp_path: Path, protocol: ExportProtocol
) -> None:
    """The receiver's certificate is checked against the configured CA, and it is shown this
    daemon's own (mutual TLS); a missing TLS file stops the start with the setting's name."""
    ca = trustme.CA()
    server, client = ca.issue_cert("127.0.0.1"), ca.issue_cert("poirotd.clinic.test")
    ca_file, cert_file, key_file = tmp_path / "ca.pem", tmp_path / "c.pem", tmp_path / "k.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    client.cert_chain_pems[0].write_to_path(str(cert_file))
    client.private_key_pem.write_to_path(str(key_file))
    tls = ClientTls(ca_file, cert_file, key_file)
    if protocol == "grpc":
        credentials = grpc.ssl_server_credentials(
            [(server.private_key_pem.bytes(), server.cert_chain_pems[0].bytes())],
            root_certificates=ca.cert_pem.bytes(),
            require_client_auth=True,
        )
        receiver = grpc_receiver(tls=credentials)
    else:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        server.configure_cert(context)
        ca.configure_trust(context)
        context.verify_mode = ssl.CERT_REQUIRED
        receiver = http_receiver(tls=context)
    async with receiver as received:
        metrics = Metrics("cortex")
        endpoint = received.endpoint
        if protocol == "grpc":
            endpoint = f"https://{endpoint}"
        exporter = AttributionExporter(
            open_client(protocol, endpoint, headers={}, tls=tls, timeout=5),
            metrics,
            resource={"service.name": "poirotd"},
            links=None,
            queue_size=4,
            retry_seconds=5,
            backoff_seconds=0.05,
        )
        await exporter.start(store)
        exporter.offer(_succeeded("i1"))
        await counted(metrics, "exported", 1)
        await exporter.stop(1)
    with pytest.raises(ExportSetupError, match="POIROTD_OTLP_EXPORT_"):
        open_client(protocol, endpoint, headers={}, tls=ClientTls(tmp_path / "no.pem"), timeout=5)
