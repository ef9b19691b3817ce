"""The operator's commands against a locked daemon (TLS, tokens and roles): a reader reads
investigations and session counts, an auditor also the prompts and answers and the sessions'
messages, an operator triggers; a refusal is the daemon's own, on stderr, with exit code 1."""

from __future__ import annotations

import asyncio
import re
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from poirotd.daemon import Daemon
from poirotd.devtools.ingest_requests import session
from tests.support.cli import poirotd
from tests.support.pki import Pki, client, locked_daemon

# each command is a Python process of its own
pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

ROLES = {
    "reader": ["reader"],
    "operator": ["operator"],
    "auditor": ["auditor"],
    "agents": ["ingest"],
}


@pytest.fixture
async def locked(tmp_path: Path) -> AsyncIterator[tuple[Daemon, Pki]]:
    pki = Pki.create(tmp_path / "pki")
    pki.write_access({f"{name}-token": (name, roles) for name, roles in ROLES.items()}, {})
    for name in ROLES:
        (tmp_path / name).write_text(f"{name}-token\n")
    async with locked_daemon(tmp_path, pki, auth_file=pki.auth_file) as daemon:
        yield daemon, pki


async def as_(daemon: Daemon, pki: Pki, who: str, *args: str) -> subprocess.CompletedProcess[str]:
    """`poirotd ARGS` with `who`'s token over TLS."""
    token_file = pki.folder.parent / who
    target = f"127.0.0.1:{daemon.grpc_port}"
    connection = ["--target", target, "--ca", str(pki.ca_file), "--token-file", str(token_file)]
    return await asyncio.to_thread(poirotd, *args, *connection)


def denials(daemon: Daemon, rpc: str) -> float:
    value = daemon.metrics.registry.get_sample_value(
        "poirot_auth_denials_total", {"rpc": rpc, "reason": "missing_role"}
    )
    return value or 0.0


async def test_a_reader_is_refused_the_transcript_and_the_messages_an_auditor_reads(
    locked: tuple[Daemon, Pki],
) -> None:
    daemon, pki = locked
    async with client(daemon, pki.client_tls(), token="agents-token") as agents:
        await agents.send(session(2))  # the locked daemon's system has a doctor and a chief

    refused = await as_(daemon, pki, "reader", "investigations", "trigger", "s1", "--reason", "y")
    assert refused.returncode == 1 and refused.stdout == ""
    assert "refused: PERMISSION_DENIED: 'reader' may not call Investigations.Trigger" in (
        refused.stderr
    )
    triggered = await as_(
        daemon, pki, "operator", "investigations", "trigger", "s1", "--reason", "x"
    )
    assert triggered.returncode == 0, triggered.stderr
    investigation_id = triggered.stdout.split(":")[0]
    watched = await as_(daemon, pki, "reader", "investigations", "watch", investigation_id)
    assert "attribution_ready" in watched.stdout.splitlines()[-1]

    shown = await as_(daemon, pki, "reader", "investigations", "show", investigation_id)
    assert shown.returncode == 0 and "SUCCEEDED" in shown.stdout and "[answer]" not in shown.stdout
    transcript = ["investigations", "show", investigation_id, "--transcript"]
    denied = await as_(daemon, pki, "reader", *transcript)
    assert denied.returncode == 1 and denied.stdout == ""
    assert re.fullmatch(
        rf"the daemon at 127\.0\.0\.1:{daemon.grpc_port} refused: PERMISSION_DENIED: 'reader'"
        r" may not call Investigations\.Get: .*needs the role 'auditor'.*\n",
        denied.stderr,
    ), denied.stderr
    audited = await as_(daemon, pki, "auditor", *transcript)
    assert audited.returncode == 0, audited.stderr
    assert "[system]" in audited.stdout and "[answer]" in audited.stdout
    assert re.search(r"#1 hazard_space · - · hazard_space", audited.stdout)

    counts = await as_(daemon, pki, "reader", "sessions", "show", "s1")
    assert counts.returncode == 0 and "turn 0" not in counts.stdout
    messages = await as_(daemon, pki, "reader", "sessions", "show", "s1", "--messages")
    assert messages.returncode == 1 and "PERMISSION_DENIED" in messages.stderr
    assert "may not call Sessions.Get" in messages.stderr and "'auditor'" in messages.stderr
    read = await as_(daemon, pki, "auditor", "sessions", "show", "s1", "--messages")
    assert read.returncode == 0 and "turn 0" in read.stdout and "turn 1" in read.stdout
    assert denials(daemon, "Investigations.Get") == 1 and denials(daemon, "Sessions.Get") == 1
