"""Safe by default: an unlocked port beyond loopback is refused at start-up, unless the operator
opts out, which is loud."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from poirotd.config import Settings
from poirotd.daemon import Daemon
from poirotd.demo.main import demo_file
from poirotd.llm.scripted import ScriptedBackend
from poirotd.transports.security.exposure import InsecureBindError, check_exposure, is_loopback
from poirotd.transports.security.tls import TlsError
from tests.support.pki import SPEC, Pki, client, locked_daemon

ANY = "0.0.0.0"


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.0.0.53", True),
        ("::1", True),
        ("[::1]", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("", False),
        ("::", False),
        ("10.0.0.7", False),
        ("poirotd.internal", False),
    ],
)
def test_only_addresses_that_are_loopback_everywhere_count_as_loopback(
    host: str, loopback: bool
) -> None:
    assert is_loopback(host) is loopback


def test_the_refusal_names_the_host_and_the_settings_that_are_missing(tmp_path: Path) -> None:
    with pytest.raises(InsecureBindError) as refusal:
        check_exposure(Settings(grpc_host=ANY))
    message = str(refusal.value)
    assert "POIROTD_GRPC_HOST=0.0.0.0 is not a loopback address" in message
    assert "POIROTD_TLS_CERT_FILE" in message and "POIROTD_AUTH_FILE" in message
    assert "POIROTD_ALLOW_INSECURE_BIND=true" in message and "metrics" not in message

    cert = tmp_path / "c.pem"
    with pytest.raises(InsecureBindError, match="the metrics port would serve it without auth"):
        check_exposure(Settings(metrics_host=ANY, tls_cert_file=cert, tls_key_file=cert))
    with_tls_and_auth = Settings(
        grpc_host=ANY, metrics_host=ANY, tls_cert_file=cert, tls_key_file=cert, auth_file=cert
    )
    assert check_exposure(with_tls_and_auth) == ()


async def test_the_daemon_refuses_before_opening_anything(tmp_path: Path) -> None:
    daemon = Daemon(Settings(db_path=tmp_path / "db.sqlite", metrics_host=ANY), SPEC)
    with pytest.raises(InsecureBindError, match="POIROTD_METRICS_HOST"):
        await daemon.start()
    assert not (tmp_path / "db.sqlite").exists()


async def test_the_opt_out_serves_unlocked_warns_and_is_exported(tmp_path: Path) -> None:
    settings = Settings(
        db_path=tmp_path / "db.sqlite",
        grpc_host=ANY,
        grpc_port=0,
        metrics_port=0,
        allow_insecure_bind=True,
    )
    daemon = Daemon(settings, SPEC, backend=ScriptedBackend(lambda m, s: "{}"))
    with capture_logs() as logged:
        await daemon.start()
    try:
        registry = daemon.metrics.registry
        assert registry.get_sample_value("poirot_insecure_bind", {"port": "grpc"}) == 1
        assert registry.get_sample_value("poirot_insecure_bind", {"port": "metrics"}) == 0
        async with client(daemon) as anyone:
            assert (await anyone.reputation()).reputation_enabled is False
    finally:
        await daemon.stop()
    [warning] = [e for e in logged if e["event"].startswith("SERVING WITHOUT PROTECTION")]
    assert warning["log_level"] == "warning" and warning["port"] == "grpc"


async def test_tls_and_auth_make_a_non_loopback_bind_acceptable(tmp_path: Path) -> None:
    pki = Pki.create(tmp_path / "pki")
    async with locked_daemon(
        tmp_path, pki, grpc_host=ANY, metrics_host=ANY, tls_client_ca_file=pki.ca_file
    ) as daemon:
        registry = daemon.metrics.registry
        assert registry.get_sample_value("poirot_insecure_bind", {"port": "grpc"}) == 0


def test_poirotd_run_refuses_with_exit_2_and_the_reason(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "poirotd", "run", "--config", str(demo_file("cortex.yaml"))],
        capture_output=True,
        text=True,
        timeout=60,
        env={"POIROTD_GRPC_HOST": ANY, "POIROTD_DB_PATH": str(tmp_path / "db.sqlite")},
    )
    assert result.returncode == 2, result.stderr
    assert "refusing to start: POIROTD_GRPC_HOST=0.0.0.0" in result.stderr
    assert not (tmp_path / "db.sqlite").exists()


def test_settings_refuse_half_a_tls_configuration(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="go together"):
        Settings(tls_cert_file=tmp_path / "c.pem")
    with pytest.raises(ValueError, match="CLIENT_CA_FILE needs"):
        Settings(tls_client_ca_file=tmp_path / "ca.pem")


async def test_unusable_tls_files_stop_the_start_naming_them(tmp_path: Path) -> None:
    pki = Pki.create(tmp_path / "pki")
    pki.key_file.write_bytes(b"not a key")
    with pytest.raises(TlsError, match=r"server\.key"):
        async with locked_daemon(tmp_path, pki):
            pass
    assert not (tmp_path / "poirotd.db").exists()
