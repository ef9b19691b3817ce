"""Attributions out over OTLP, as the GenAI conventions' evaluation results, in the session's
own trace (`placement`) with a link to the investigation's page.

Never in the way of an investigation: the recorder offers each finished record without waiting
(`offer`), into a bounded queue; one worker reads the session's messages to place the span,
builds the export and sends it, retrying what the OTLP specification lets it retry with
exponential backoff (or the delay the receiver asked for) for at most `retry_seconds`. An
attribution that finds the queue full, that the receiver refuses, that outlives its retries or
is still queued when the daemon stops is dropped, counted in
poirot_otlp_export_attributions_total by outcome, and logged: the store keeps the record, and
Watch and the metrics have it, whatever happens here. Each replica exports the investigations it
ran, once.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Mapping

import structlog
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from poirotd.config import Settings
from poirotd.exporters.evaluations import AttributeValue, attribution_span, export_request
from poirotd.exporters.otlp_client import ClientTls, ExportError, OtlpClient, open_client
from poirotd.exporters.page_links import PageLinks
from poirotd.exporters.placement import new_span_id, place
from poirotd.model import Investigation, InvestigationState
from poirotd.observability.metrics import Metrics
from poirotd.store import Store

log = structlog.get_logger(__name__)

# Attributions sent in one export at most (they queue only while the receiver is slow or down).
BATCH_MAX = 64
# The longest wait between two tries, whatever the backoff or the receiver asks.
MAX_BACKOFF_SECONDS = 30.0


def exporter_from_settings(
    settings: Settings, metrics: Metrics, system: str
) -> AttributionExporter | None:
    """The exporter POIROTD_OTLP_EXPORT_* describe; None when no endpoint is set (off). Raises
    ExportSetupError when its TLS files cannot be used."""
    s = settings
    if not s.otlp_export_endpoint:
        return None
    client = open_client(
        s.otlp_export_protocol,
        s.otlp_export_endpoint,
        headers=s.otlp_export_header_map(),
        tls=ClientTls(
            s.otlp_export_ca_file, s.otlp_export_client_cert_file, s.otlp_export_client_key_file
        ),
        timeout=s.otlp_export_timeout_seconds,
    )
    base_url = s.otlp_export_link_base_url
    return AttributionExporter(
        client,
        metrics,
        resource={"service.name": "poirotd", "poirot.system": system}
        | s.otlp_export_resource_map(),
        links=PageLinks(base_url, s.otlp_export_link_path) if base_url else None,
        queue_size=s.otlp_export_queue_size,
        retry_seconds=s.otlp_export_retry_seconds,
        backoff_seconds=s.otlp_export_backoff_seconds,
    )


class AttributionExporter:
    def __init__(
        self,
        client: OtlpClient,
        metrics: Metrics,
        *,
        resource: Mapping[str, AttributeValue],
        links: PageLinks | None,
        queue_size: int,
        retry_seconds: float,
        backoff_seconds: float,
    ) -> None:
        self._store: Store | None = None
        self._client = client
        self._metrics = metrics
        self._resource = dict(resource)
        self._links = links
        self._retry_seconds = retry_seconds
        self._backoff = backoff_seconds
        self._queue: asyncio.Queue[Investigation] = asyncio.Queue(queue_size)
        # The batch being exported: counted as shutdown if the stop cuts it off.
        self._sending = 0
        self._task: asyncio.Task[None] | None = None
        metrics.otlp_export_queued.set_function(self._queue.qsize)

    def offer(self, record: Investigation) -> None:
        """Queues a finished record's attribution for export, at once or not at all (a full
        queue drops it, counted): called by the recorder, which must never wait for a
        receiver. Records without an attribution (failed, deferred) are not exported."""
        if record.state is not InvestigationState.SUCCEEDED or record.attribution is None:
            return
        try:
            self._queue.put_nowait(record)
        except asyncio.QueueFull:
            self._count("queue_full")
            log.warning(
                "attribution not exported: the OTLP export queue is full "
                "(POIROTD_OTLP_EXPORT_QUEUE_SIZE)",
                investigation_id=record.investigation_id,
                queued=self._queue.qsize(),
            )

    async def start(self, store: Store) -> None:
        """Exports from now on, reading sessions from `store`."""
        self._store = store
        self._task = asyncio.create_task(self._work(), name="otlp-export")

    async def stop(self, grace: float) -> None:
        """Sends what is queued for at most `grace` seconds, then drops the rest (counted as
        shutdown) and closes the connection."""
        if self._task is not None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(grace):
                    await self._queue.join()
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            left = self._queue.qsize() + self._sending
            if left:
                self._metrics.otlp_export_attributions.labels("shutdown").inc(left)
                log.warning("attributions not exported: the daemon stopped", dropped=left)
        await self._client.close()

    async def _work(self) -> None:
        while True:
            batch = [await self._queue.get()]
            while len(batch) < BATCH_MAX and not self._queue.empty():
                batch.append(self._queue.get_nowait())
            self._sending = len(batch)
            try:
                await self._export(batch)
            except Exception:
                log.exception("exporting attributions failed", attributions=len(batch))
                self._count("refused", len(batch))
            # Not when cancelled: `stop` counts the batch it cut off.
            self._sending = 0
            for _ in batch:
                self._queue.task_done()

    async def _export(self, batch: list[Investigation]) -> None:
        """Places and sends one batch, trying again within the retry budget."""
        deadline = time.monotonic() + self._retry_seconds
        spans: list[Span] | None = None
        attempt = 0
        while True:
            try:
                if spans is None:
                    spans = [await self._span(record) for record in batch]
                rejected = await self._client.send(export_request(spans, self._resource))
                break
            except ExportError as exc:
                error = exc
            if not error.retry:
                self._given_up(batch, "refused", error)
                return
            wait = error.retry_after
            delay = min(MAX_BACKOFF_SECONDS, wait if wait is not None else self._delay(attempt))
            if time.monotonic() + delay > deadline:
                self._given_up(batch, "gave_up", error)
                return
            self._metrics.otlp_export_retries.labels(error.retry).inc()
            log.info(
                "attribution export sent again later",
                reason=error.retry,
                error=str(error),
                delay_seconds=round(delay, 3),
            )
            attempt += 1
            await asyncio.sleep(delay)
        rejected = min(rejected, len(batch))
        self._count("exported", len(batch) - rejected)
        if rejected:
            self._count("rejected", rejected)
            log.warning("the OTLP receiver rejected attribution spans", rejected=rejected)

    async def _span(self, record: Investigation) -> Span:
        assert self._store is not None, "started"
        try:
            session = await self._store.get_session(record.session_id)
            messages = await self._store.session_messages(record.session_id)
        except Exception as exc:  # an outage of the store passes like the receiver's
            raise ExportError(f"the session could not be read: {exc!r}", retry="store") from exc
        step = record.attribution.step if record.attribution is not None else None
        placement = place(session.labels if session is not None else {}, messages, step)
        url = self._links.url(record) if self._links is not None else ""
        return attribution_span(record, placement, new_span_id(), url)

    def _delay(self, attempt: int) -> float:
        """Exponential backoff with jitter, so that replicas do not retry in step."""
        return self._backoff * 2.0**attempt * random.uniform(0.8, 1.2)

    def _given_up(self, batch: list[Investigation], outcome: str, error: ExportError) -> None:
        self._count(outcome, len(batch))
        log.warning(
            "attributions not exported",
            outcome=outcome,
            error=str(error),
            investigation_ids=[record.investigation_id for record in batch[:5]],
            attributions=len(batch),
        )

    def _count(self, outcome: str, n: int = 1) -> None:
        self._metrics.otlp_export_attributions.labels(outcome).inc(n)
