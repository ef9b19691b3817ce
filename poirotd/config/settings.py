"""Process settings from the environment (POIROTD_*); the system itself is described in the spec."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator
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
    # TLS on the gRPC and metrics ports: the server's certificate chain and key (PEM), re-read
    # when the files are replaced (no restart for a renewal).
    tls_cert_file: Path | None = None
    tls_key_file: Path | None = None
    # With it, clients must present a certificate this CA (PEM) signed, on both ports.
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
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    log_format: Literal["json", "console"] = "json"

    @model_validator(mode="after")
    def _tls_files_together(self) -> Settings:
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ValueError("POIROTD_TLS_CERT_FILE and POIROTD_TLS_KEY_FILE go together")
        if self.tls_client_ca_file is not None and self.tls_cert_file is None:
            raise ValueError("POIROTD_TLS_CLIENT_CA_FILE needs POIROTD_TLS_CERT_FILE and _KEY_FILE")
        return self
