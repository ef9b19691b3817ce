"""The standalone bridge's link to a locked daemon: TLS, its client certificate and a token."""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime
from pathlib import Path

from hwbridge.config import DeadLetterConfig, PoirotdConfig, PoirotdTlsConfig
from hwbridge.deadletter import DeadLetterStore
from hwbridge.forward import Forwarder
from poirotd.model import TelemetryBatch
from tests.support.pki import SERVER_NAME, Pki, issue, locked_daemon


async def test_the_bridge_forwards_over_mtls_with_its_token(tmp_path: Path) -> None:
    pki = Pki.create(tmp_path / "pki")
    pki.write_access({"bridge-token": ("bridge", ["ingest"])}, {})
    bridge = issue(pki.ca, "bridge.clinic.test")
    (tmp_path / "bridge.pem").write_bytes(bridge.cert)
    (tmp_path / "bridge.key").write_bytes(bridge.key)
    (tmp_path / "token").write_text("bridge-token\n")
    async with locked_daemon(
        tmp_path, pki, auth_file=pki.auth_file, tls_client_ca_file=pki.ca_file
    ) as daemon:
        config = PoirotdConfig(
            target=f"127.0.0.1:{daemon.grpc_port}",
            system="clinic",
            tls=PoirotdTlsConfig(
                ca_file=pki.ca_file,
                cert_file=tmp_path / "bridge.pem",
                key_file=tmp_path / "bridge.key",
                server_name=SERVER_NAME,
            ),
            token_file=tmp_path / "token",
        )
        dead_letters = DeadLetterStore(DeadLetterConfig(), log_interval_s=60)
        now = datetime.now(UTC)
        async with Forwarder(config, "ward-3", dead_letters) as sink:
            await sink(TelemetryBatch("ward-3", [("exo", "knee_deg", 12.5, now)]))
        with sqlite3.connect(daemon.settings.db_path) as db:
            assert db.execute("SELECT value FROM telemetry_samples").fetchall() == [(12.5,)]
