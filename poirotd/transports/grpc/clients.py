"""Who a gRPC call comes from, and the limits on what one client may hold open or do per second.

Every limit here refuses with RESOURCE_EXHAUSTED and a message naming the POIROTD_* setting
that sets it, except the ingest rate, which paces a client's streams instead (see
`IngestServicer`). The counts live in this process: behind a load balancer each replica applies
them on its own.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass

import grpc

from poirotd.config import Settings
from poirotd.errors import ResourceExhausted
from poirotd.transports.grpc.auth import caller
from poirotd.transports.peers import peer_host
from poirotd.transports.token_bucket import Clock, TokenBucket


def client_identity(context: grpc.aio.ServicerContext) -> str:
    """The client every per-client limit counts a call against: the authenticated caller's name
    when authentication is on (whichever host it calls from), else the peer's host without the
    port, so that all of one machine's connections count together."""
    identity = caller()
    if identity is not None:
        return identity.qualified_name
    return peer_host(context.peer() or "") or "unknown"


@dataclass(frozen=True)
class Bound:
    """A limit's value and the `Settings` field that sets it, for the refusal's message."""

    value: float
    field: str

    @property
    def setting(self) -> str:
        value = int(self.value) if float(self.value).is_integer() else self.value
        return f"POIROTD_{self.field.upper()}={value}"


class OpenCalls:
    """Long-lived calls of one kind (Ingest streams, Watch streams) open now, per client and, when
    `total` is given, in all; a call over either bound is refused before it holds anything."""

    def __init__(
        self, kind: str, *, reason: str, per_client: Bound, total: Bound | None = None
    ) -> None:
        self._kind, self._reason = kind, reason
        self._per_client, self._total = per_client, total
        self._open: dict[str, int] = {}
        self._open_total = 0

    def hold(self, client: str) -> AbstractContextManager[None]:
        """Counts a call of `client` as open until the returned context manager exits; raises
        ResourceExhausted when a bound is reached."""
        if self._total is not None and self._open_total >= self._total.value:
            raise self._refusal(f"{self._open_total} {self._kind} are open", self._total)
        held = self._open.get(client, 0)
        if held >= self._per_client.value:
            raise self._refusal(f"client {client} has {held} {self._kind} open", self._per_client)
        self._open[client] = held + 1
        self._open_total += 1
        return self._released(client)

    def _refusal(self, what: str, bound: Bound) -> ResourceExhausted:
        return ResourceExhausted(f"{what}; the limit is {bound.setting}", reason=self._reason)

    @contextmanager
    def _released(self, client: str) -> Iterator[None]:
        try:
            yield
        finally:
            self._open_total -= 1
            self._open[client] -= 1
            if not self._open[client]:
                del self._open[client]


class ClientRates:
    """A rate per client (`unit`s per second, with a burst), one token bucket each. A bucket that
    has filled up again is forgotten (a new one would be the same), so the map holds only the
    clients active within the last burst/rate seconds; each use looks its bucket up anew."""

    def __init__(
        self, unit: str, *, reason: str, rate: Bound, burst: Bound, clock: Clock = time.monotonic
    ) -> None:
        self._unit, self._reason = unit, reason
        self._rate, self._burst = rate, burst
        self._clock = clock
        self._buckets: dict[str, TokenBucket] = {}

    def take(self, client: str) -> None:
        """One `unit` now, or ResourceExhausted saying when to come back."""
        wait = self._bucket(client).try_take()
        if wait:
            raise ResourceExhausted(
                f"client {client} is over {self._rate.setting} {self._unit}s per second (burst "
                f"{self._burst.setting}); retry in {wait:.1f} s",
                reason=self._reason,
            )

    def reserve(self, client: str, n: int) -> float:
        """`n` units taken now; the seconds they must wait so that the client keeps to the rate
        (see `TokenBucket.reserve`)."""
        return self._bucket(client).reserve(n)

    def _bucket(self, client: str) -> TokenBucket:
        bucket = self._buckets.get(client)
        if bucket is None:
            for idle in [c for c, b in self._buckets.items() if b.full]:
                del self._buckets[idle]
            bucket = TokenBucket(self._rate.value, self._burst.value, clock=self._clock)
            self._buckets[client] = bucket
        return bucket


@dataclass(frozen=True)
class ClientLimits:
    """What one client may hold open or do per second, as the settings set it."""

    ingest_streams: OpenCalls
    ingest_rate: ClientRates | None  # None: a client's streams are read as fast as they come
    watchers: OpenCalls
    triggers: ClientRates | None  # None: Trigger is bounded by the investigation queue alone

    @classmethod
    def from_settings(cls, s: Settings) -> ClientLimits:
        def per_client(unit: str, reason: str, rate: Bound, burst: Bound) -> ClientRates | None:
            if not rate.value:
                return None
            return ClientRates(unit, reason=reason, rate=rate, burst=burst)

        ingest_rate = per_client(
            "item",
            "ingest_rate",
            Bound(s.ingest_rate_per_client, "ingest_rate_per_client"),
            Bound(s.ingest_burst_per_client, "ingest_burst_per_client"),
        )
        triggers = per_client(
            "trigger",
            "trigger_rate",
            Bound(s.trigger_rate_per_client, "trigger_rate_per_client"),
            Bound(s.trigger_burst_per_client, "trigger_burst_per_client"),
        )
        ingest_streams = OpenCalls(
            "Ingest streams",
            reason="too_many_streams",
            per_client=Bound(s.max_ingest_streams_per_client, "max_ingest_streams_per_client"),
        )
        watchers = OpenCalls(
            "Watch streams",
            reason="too_many_watchers",
            per_client=Bound(s.max_watchers_per_client, "max_watchers_per_client"),
            total=Bound(s.max_watchers, "max_watchers"),
        )
        return cls(ingest_streams, ingest_rate, watchers, triggers)
