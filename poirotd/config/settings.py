"""Process settings from the environment (POIROTD_*); the system itself is described in the spec."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from poirotd.observability.gc_tuning import YOUNG_THRESHOLD


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="POIROTD_", extra="forbid")

    spec_path: Path | None = None
    db_path: Path = Path("poirotd.db")
    grpc_host: str = "127.0.0.1"
    grpc_port: int = Field(default=50051, ge=0, le=65535)
    metrics_host: str = "127.0.0.1"
    metrics_port: int = Field(default=9464, ge=0, le=65535)
    # Largest gRPC message accepted; larger ones are refused with RESOURCE_EXHAUSTED.
    max_message_bytes: int = Field(default=1 << 20, ge=1024)
    # Ingest items committed in one transaction at most.
    ingest_batch_max: int = Field(default=512, ge=1)
    # Distinct signal names a component may have; a reading that would add one more is refused.
    max_signals_per_component: int = Field(default=1024, ge=1)
    # Investigations waiting to run; a full queue refuses Trigger with RESOURCE_EXHAUSTED.
    queue_capacity: int = Field(default=16, ge=1)
    concurrent_investigations: int = Field(default=1, ge=1)
    # On SIGTERM, how long running investigations may take before they are kept as interrupted.
    drain_seconds: float = Field(default=30.0, ge=0.0)
    # Net allocations between young collections of CPython's cyclic collector
    # (poirotd.observability.gc_tuning).
    gc_young_threshold: int = Field(default=YOUNG_THRESHOLD, ge=700)
    # Where the audit chain's head is appended every audit_checkpoint_seconds when it moved
    # (default: beside the database, DB_PATH.checkpoints.jsonl).
    audit_checkpoint_path: Path | None = None
    audit_checkpoint_seconds: float = Field(default=60.0, gt=0)
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
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    log_format: Literal["json", "console"] = "json"
