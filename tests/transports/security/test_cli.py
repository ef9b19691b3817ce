"""`poirotd token` and the client commands against a locked daemon."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
from pathlib import Path

import yaml

from poirotd.transports.security.access import load_access_file, token_hash
from tests.support.pki import Pki, issue, locked_daemon


def poirotd(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "poirotd", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_token_new_prints_a_token_and_the_line_that_grants_it(tmp_path: Path) -> None:
    result = poirotd("token", "new", "--name", "ward 3 dashboard", "--role", "reader")
    assert result.returncode == 0, result.stderr
    token = result.stdout.splitlines()[1].strip()
    line = result.stdout.splitlines()[3].strip()
    assert len(token) >= 40 and token not in line
    (tmp_path / "access.yaml").write_text(f"tokens:\n  {line}\n")
    grant = load_access_file(tmp_path / "access.yaml").tokens[token_hash(token)]
    assert grant.name == "ward 3 dashboard" and {r.value for r in grant.roles} == {"reader"}


def test_token_hash_reads_the_token_from_standard_input() -> None:
    result = poirotd(
        "token",
        "hash",
        "--name",
        "bridge",
        "--role",
        "ingest",
        "--role",
        "reader",
        stdin="s3cret\n",
    )
    assert result.returncode == 0, result.stderr
    line = yaml.safe_load(result.stdout)
    assert line == {token_hash("s3cret"): {"name": "bridge", "roles": ["ingest", "reader"]}}
    assert poirotd("token", "hash", "--name", "x", "--role", "ingest").returncode == 2
    assert (
        "no token on standard input"
        in poirotd("token", "hash", "--name", "x", "--role", "ingest").stderr
    )


async def test_client_commands_take_tls_a_client_certificate_and_a_token(tmp_path: Path) -> None:
    pki = Pki.create(tmp_path / "pki")
    pki.write_access({"operator-token": ("control", ["reader"])}, {})
    client_pem = issue(pki.ca, "control.clinic.test")
    (tmp_path / "client.pem").write_bytes(client_pem.cert)
    (tmp_path / "client.key").write_bytes(client_pem.key)
    (tmp_path / "token").write_text("operator-token\n")
    (tmp_path / "wrong").write_text("nope\n")
    async with locked_daemon(
        tmp_path, pki, auth_file=pki.auth_file, tls_client_ca_file=pki.ca_file
    ) as daemon:
        target = f"127.0.0.1:{daemon.grpc_port}"  # the server's certificate names the address
        tls = ["--ca", str(pki.ca_file), "--cert", str(tmp_path / "client.pem")]
        tls += ["--key", str(tmp_path / "client.key")]
        ok = await asyncio.to_thread(
            poirotd, "reputation", "--target", target, *tls, "--token-file", str(tmp_path / "token")
        )
        wrong = await asyncio.to_thread(
            poirotd, "reputation", "--target", target, *tls, "--token-file", str(tmp_path / "wrong")
        )
        plain = await asyncio.to_thread(poirotd, "reputation", "--target", target)
    assert ok.returncode == 0, ok.stderr
    assert "doctor" in ok.stdout
    assert wrong.returncode == 1
    assert re.search(r"refused: UNAUTHENTICATED: the bearer token is not known", wrong.stderr)
    assert plain.returncode == 1 and "UNAVAILABLE" in plain.stderr
