"""Process settings from the environment (POIROTD_*); the system itself is described in the spec."""

from __future__ import annotations

from pathlib import Path
from typing import Literal
from urllib.parse import unquote

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from poirotd.exporters.page_links import DEFAULT_PATH, template_problem
from poirotd.model import DEFAULT_MAX_ABS_VALUE, ValueBound
from poirotd.observability.gc_tuning import YOUNG_THRESHOLD


class Settings(BaseSettings):
    # Errors name the setting, never its value: a DB URL or the exporter's headers hold secrets.
    model_config = SettingsConfigDict(
        env_prefix="POIROTD_", extra="forbid", hide_input_in_errors=True
    )

    # The system spec (YAML) to run; `poirotd run --config` sets it too.
    spec_path: Path | None = None
    # The SQLite store (created on first start) when db_url is unset.
    db_path: Path = Path("poirotd.db")
    # The PostgreSQL store several daemons may share, postgresql://user@host:port/dbname?...
    # (libpq's URL: sslmode, target_session_attrs...); unset, the store is SQLite at db_path.
    # Logged and reported without its password; better, keep the password out of it: in
    # db_password_file (a mounted secret), or libpq's PGPASSFILE / ~/.pgpass.
    db_url: SecretStr | None = None
    db_password_file: Path | None = None
    # The gRPC port (Ingest, Investigations, Sessions, health, OTLP): loopback unless told;
    # any other address needs TLS and authentication (allow_insecure_bind).
    grpc_host: str = "127.0.0.1"
    grpc_port: int = Field(default=50051, ge=0, le=65535)
    # Prometheus' /metrics over HTTP, under the same rule for non-loopback addresses.
    metrics_host: str = "127.0.0.1"
    metrics_port: int = Field(default=9464, ge=0, le=65535)
    # Largest gRPC message accepted; larger ones are refused with RESOURCE_EXHAUSTED.
    max_message_bytes: int = Field(default=1 << 20, ge=1024)
    # Ingest items committed in one transaction at most.
    ingest_batch_max: int = Field(default=512, ge=1)
    # Seconds an ingest item's idempotency key (producer, producer_seq) is kept after its
    # commit: a copy arriving within it is dropped, a later one stored again. The store keeps
    # a row per run of consecutive keys of a producer per commit (a forwarder's keys make one
    # run per commit; keys split among replicas by a shared subscription, a row each).
    idempotency_window_seconds: float = Field(default=3600.0, gt=0)
    # Distinct signal names a component may have; a reading that would add one more is refused.
    max_signals_per_component: int = Field(default=1024, ge=1)
    # |value| a telemetry reading may have unless its component declares the signal's range
    # (`signals:` in the spec); a reading past it is refused (value_out_of_range).
    telemetry_max_abs_value: ValueBound = Field(default=DEFAULT_MAX_ABS_VALUE, gt=0)
    # What one gRPC client (poirotd.transports.grpc.clients.client_identity: the authenticated
    # caller's name, else the peer's host) may hold or do; over a bound, RESOURCE_EXHAUSTED
    # naming the setting. Each open Ingest stream holds up to ingest_batch_max unacknowledged
    # items.
    max_ingest_streams_per_client: int = Field(default=16, ge=1)
    # An Ingest stream that sends no request for this long is ended (DEADLINE_EXCEEDED, once
    # what it sent is acked), so that a producer that stopped sending gives its client's stream
    # slots back: every producer of a sidecar is one client (localhost). Within the longest
    # reconnect backoff of hwbridge's forwarder (30 s), which reopens its stream when it has
    # something to send.
    ingest_idle_seconds: float = Field(default=30.0, gt=0)
    # HTTP/2 keepalive on the gRPC port: a connection that received nothing for this long is
    # pinged, and closed (its calls cancelled, their slots freed) when the ping is not answered
    # within the timeout: a peer that vanished without closing its connections (host down,
    # network cut) holds nothing for longer than their sum.
    grpc_keepalive_seconds: float = Field(default=60.0, gt=0)
    grpc_keepalive_timeout_seconds: float = Field(default=20.0, gt=0)
    # Items per second a client's Ingest streams deliver together, with a burst; over it the
    # daemon reads them more slowly (no refusal, nothing lost). 0: unpaced, which is safe: every
    # stream is already paced by the store's commits, this shares them among clients.
    ingest_rate_per_client: float = Field(default=0.0, ge=0)
    ingest_burst_per_client: int = Field(default=10_000, ge=1)
    # Watch streams open at once, in all and per client (each event wakes every one of them).
    max_watchers: int = Field(default=256, ge=1)
    max_watchers_per_client: int = Field(default=64, ge=1)
    # Trigger RPCs per second per client, with a burst, so that one client cannot keep the queue
    # that every client and the hazard rules share full; 0: bounded by the queue alone.
    trigger_rate_per_client: float = Field(default=1.0, ge=0)
    trigger_burst_per_client: int = Field(default=10, ge=1)
    # LLM tokens (prompt + completion) one investigation may spend; once spent no further call
    # starts and it ends degraded with the votes it has. 0: no budget beyond the spec's own
    # bounds (agents, max_invocations, retries, max_tokens), which already make every run finite.
    llm_token_budget: int = Field(default=0, ge=0)
    # Investigations waiting to run (QUEUED), all replicas of a shared store together. The last
    # queue_reserved_for_rules places are kept for hazard rules: Trigger is refused with
    # RESOURCE_EXHAUSTED once the rest is full, and once its client (as for the rates above) has
    # max_queued_triggers_per_client waiting. A hazard rule's investigation that finds the whole
    # queue full is DEFERRED in the store and queued once there is room (poirotd.investigations.
    # admission).
    queue_capacity: int = Field(default=16, ge=1)
    queue_reserved_for_rules: int = Field(default=4, ge=1)
    max_queued_triggers_per_client: int = Field(default=4, ge=1)
    # Investigations this daemon runs at once (each replica its own).
    concurrent_investigations: int = Field(default=1, ge=1)
    # On SIGTERM, how long running investigations may take before they are kept as interrupted.
    drain_seconds: float = Field(default=30.0, ge=0.0)
    # This daemon among the replicas of one shared store (empty: hostname-pid), the owner named
    # in the leases of the investigations it runs.
    replica_id: str = Field(default="", max_length=200)
    # How long a running investigation's lease lasts without renewal (renewed every third of
    # it): after a replica dies, another takes its investigations over once their lease expired.
    lease_seconds: float = Field(default=30.0, gt=0)
    # With a shared store, how often at least idle workers look for investigations another
    # replica queued or left, and Watch streams for events other replicas stored (they also
    # look at once when the database notifies them of another replica's write).
    shared_poll_seconds: float = Field(default=0.5, gt=0, le=60)
    # Net allocations between young collections of CPython's cyclic collector
    # (poirotd.observability.gc_tuning).
    gc_young_threshold: int = Field(default=YOUNG_THRESHOLD, ge=700)
    # Where the audit chain's head is appended every audit_checkpoint_seconds when it moved
    # (default: DB_PATH.checkpoints.jsonl, also on PostgreSQL, where each daemon keeps its own).
    audit_checkpoint_path: Path | None = None
    audit_checkpoint_seconds: float = Field(default=60.0, gt=0)
    # Calls refused for want of credentials or a role are chained in the audit, but a flood
    # of them is not: per peer (host), call, reason and identity, the first refusal in a window
    # of audit_denial_window_seconds is written at once, the others as one summary row when the
    # window closes (or at stop). At most audit_denial_max_summaries such windows are open; the
    # refusals of further peers are summarised together as "other peers".
    audit_denial_window_seconds: float = Field(default=60.0, gt=0)
    audit_denial_max_summaries: int = Field(default=1024, ge=1)
    # OTLP/HTTP trace receiver (POST /v1/traces, conventionally port 4318); 0 = off. OTLP/gRPC
    # is always served on grpc_port.
    otlp_http_host: str = "127.0.0.1"
    otlp_http_port: int = Field(default=0, ge=0, le=65535)
    # A trace's session: its conversation id (gen_ai.conversation.id, session.id) when it has
    # one, else its trace id; or always its trace id.
    otlp_session: Literal["conversation", "trace"] = "conversation"
    # Largest OTLP/HTTP body, also once decompressed; larger ones are refused with 413.
    otlp_max_body_bytes: int = Field(default=16 << 20, ge=1024)
    # Messages of OTLP exports waiting for their commit at most; an export beyond it is
    # throttled (RESOURCE_EXHAUSTED / HTTP 429 with a retry delay).
    otlp_max_pending_messages: int = Field(default=8192, ge=1)
    # Attributions exported over OTLP as GenAI evaluation results, in the session's own trace
    # (docs/otlp-export.md): the receiver, a Collector, Phoenix, Langfuse... Empty: off.
    # http/protobuf: its URL (http(s)://host:4318; /v1/traces is added when it names no path);
    # grpc: host:4317 (https://host:4317, a CA file or a client certificate for TLS).
    otlp_export_endpoint: str = ""
    otlp_export_protocol: Literal["http/protobuf", "grpc"] = "http/protobuf"
    # Headers sent with every export (authentication), as OTEL_EXPORTER_OTLP_HEADERS writes them:
    # "authorization=Bearer%20abc,x-tenant=ops", values percent-decoded. Never logged.
    otlp_export_headers: SecretStr = SecretStr("")
    # TLS towards the receiver: the CA (PEM) its certificate is checked against (unset: the
    # system's), and this daemon's own certificate and key if it asks for one.
    otlp_export_ca_file: Path | None = None
    otlp_export_client_cert_file: Path | None = None
    otlp_export_client_key_file: Path | None = None
    # Attributes of the exporting resource, OTEL_RESOURCE_ATTRIBUTES' way ("k=v,k2=v2"), beside
    # service.name=poirotd: Phoenix files spans by openinference.project.name, say.
    otlp_export_resource_attributes: str = ""
    # How long one export may take; how long an attribution is tried again at most (exponential
    # backoff from otlp_export_backoff_seconds, or the delay the receiver asks for); how many
    # wait for their turn at most (beyond, dropped and counted: investigations never wait).
    otlp_export_timeout_seconds: float = Field(default=10.0, gt=0)
    otlp_export_retry_seconds: float = Field(default=120.0, ge=0)
    otlp_export_backoff_seconds: float = Field(default=1.0, gt=0)
    otlp_export_queue_size: int = Field(default=1024, ge=1)
    # The investigation's page each export links to: where the operator's page is served (empty:
    # no link), and the path there, with {investigation_id}, {session_id} or {system}.
    otlp_export_link_base_url: str = ""
    otlp_export_link_path: str = DEFAULT_PATH
    # OTLP logs (LogsService on grpc_port, POST /v1/logs on otlp_http_port): GenAI log events
    # name only their span, so they wait for it (and the agent's span above it), parked in the
    # store so a restart loses none, at most otlp_log_wait_seconds (from their arrival, across
    # restarts), then are placed with what is known or rejected (no_span); at most
    # otlp_log_wait_records wait at once, those reloaded at start included (a logs export whose
    # events of unknown spans would pass it is throttled; keep it above the exporter's batch
    # size). Over a shared store, a replica gone leaves its parked events to a live one after
    # twice otlp_log_wait_seconds. The
    # spans of the last otlp_log_remembered_spans exported are remembered for the events
    # exported after them.
    otlp_log_wait_seconds: float = Field(default=120.0, gt=0)
    otlp_log_wait_records: int = Field(default=20_000, ge=1)
    otlp_log_remembered_spans: int = Field(default=100_000, ge=1)
    # The HTTP transports (/metrics, OTLP/HTTP), each on its own: how long a connection has to
    # deliver each whole request, headers and body, from its opening or its previous answer (a
    # TLS handshake has as long again; a connection idle that long after an answer is closed),
    # and how many connections may be open at once, in all and per peer (IP address). Over a
    # bound, the connection is aborted, or answered 503 with Retry-After.
    http_request_seconds: float = Field(default=30.0, gt=0)
    http_max_connections: int = Field(default=256, ge=1)
    http_max_connections_per_peer: int = Field(default=32, ge=1)
    # The operator's page (poirotd.transports.page: investigations, votes, telemetry, live by
    # server-sent events) on its own port, with the same TLS and access file as the other
    # transports; 0 = off. Read-only unless page_confirm: then an operator may confirm or correct
    # an outcome.
    page_host: str = "127.0.0.1"
    page_port: int = Field(default=0, ge=0, le=65535)
    page_confirm: bool = False
    # Where people reach the page from outside (https://poirotd.example.org), when a proxy or an
    # ingress stands in front of it: published as poirot_page_info{url} for the alert rules'
    # and the dashboard's links, and accepted as the Origin of the page's own form posts.
    page_external_url: str = Field(default="", pattern=r"^(https?://[^/?#\s]+)?$")
    # TLS on the gRPC, metrics, OTLP/HTTP and page ports: the server's certificate chain and key
    # (PEM), re-read when the files are replaced (no restart for a renewal).
    tls_cert_file: Path | None = None
    tls_key_file: Path | None = None
    # With it, clients must present a certificate this CA (PEM) signed, on every port.
    tls_client_ca_file: Path | None = None
    # Bearer tokens (by SHA-256) and client-certificate names mapped to roles
    # (poirotd.transports.security.access); re-read when it changes. Unset with no client CA:
    # no authentication.
    auth_file: Path | None = None
    # gRPC server reflection (lists the API to any client; health stays on regardless).
    grpc_reflection: bool = True
    # Serve a non-loopback address without TLS and authentication anyway (logged at WARNING,
    # poirot_insecure_bind); refused at start-up otherwise.
    allow_insecure_bind: bool = False
    # Logging: the daemon's own lines from this level (libraries' from WARNING or this, if
    # higher), as one JSON object a line or for a human at a console.
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    log_format: Literal["json", "console"] = "json"

    @model_validator(mode="after")
    def _queue_has_room_for_triggers(self) -> Settings:
        if self.queue_reserved_for_rules >= self.queue_capacity:
            raise ValueError(
                f"POIROTD_QUEUE_RESERVED_FOR_RULES ({self.queue_reserved_for_rules}) must be "
                f"less than POIROTD_QUEUE_CAPACITY ({self.queue_capacity}): Trigger needs a place"
            )
        return self

    @model_validator(mode="after")
    def _otlp_export_usable(self) -> Settings:
        self.otlp_export_header_map()
        self.otlp_export_resource_map()
        if problem := template_problem(self.otlp_export_link_path):
            raise ValueError(f"POIROTD_OTLP_EXPORT_LINK_PATH: {problem}")
        if (self.otlp_export_client_cert_file is None) != (
            self.otlp_export_client_key_file is None
        ):
            raise ValueError(
                "POIROTD_OTLP_EXPORT_CLIENT_CERT_FILE and _CLIENT_KEY_FILE go together"
            )
        endpoint = self.otlp_export_endpoint
        if (
            endpoint
            and self.otlp_export_protocol == "http/protobuf"
            and not endpoint.startswith(("http://", "https://"))
        ):
            raise ValueError(
                f"POIROTD_OTLP_EXPORT_ENDPOINT {endpoint!r} is not an http(s):// URL "
                "(OTLP/HTTP: http://collector:4318)"
            )
        return self

    def otlp_export_header_map(self) -> dict[str, str]:
        return _pairs("POIROTD_OTLP_EXPORT_HEADERS", self.otlp_export_headers.get_secret_value())

    def otlp_export_resource_map(self) -> dict[str, str]:
        text = self.otlp_export_resource_attributes
        return _pairs("POIROTD_OTLP_EXPORT_RESOURCE_ATTRIBUTES", text)

    @model_validator(mode="after")
    def _tls_files_together(self) -> Settings:
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ValueError("POIROTD_TLS_CERT_FILE and POIROTD_TLS_KEY_FILE go together")
        if self.tls_client_ca_file is not None and self.tls_cert_file is None:
            raise ValueError("POIROTD_TLS_CLIENT_CA_FILE needs POIROTD_TLS_CERT_FILE and _KEY_FILE")
        return self


def _pairs(setting: str, text: str) -> dict[str, str]:
    """ "k=v,k2=v2" as OTEL_EXPORTER_OTLP_HEADERS writes it (percent-encoded values). A bad pair
    is named by its key alone: the values may be secrets."""
    pairs: dict[str, str] = {}
    for i, item in enumerate(part for part in text.split(",") if part.strip()):
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ValueError(f"{setting}: entry {i + 1} is not key=value")
        pairs[key] = unquote(value.strip())
    return pairs
