"""bench.http_transports at its smallest, against a real daemon process, plain and TLS: every slow
client is ended by the daemon at the request deadline, none costs a thread, and the section
renders."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import http_transports
from bench.http_transports import KINDS, Plan
from bench.report import begin_marker, end_marker
from bench.sections import http_transports as http_transports_section

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


async def test_a_smoke_run_sees_every_slow_client_ended_at_the_deadline(tmp_path: Path) -> None:
    p = Plan("smoke", connections=12, peers=3, deadline=1.0, settle=0.5)
    sides = await http_transports.run_both(p, tmp_path)
    assert [side.tls for side in sides] == [False, True]
    for side in sides:
        assert {(c.transport, c.kind) for c in side.clients} == {
            (transport, kind) for transport in http_transports.TRANSPORTS for kind in KINDS
        }
        assert all(c.opened and not c.refused and not c.hung_up for c in side.clients)
        assert all(c.ended_after is not None and c.ended_after < 3.0 for c in side.clients)
        before, held, past, _ = side.readings
        assert held.open_connections == 12 and past.open_connections == 0
        assert held.threads == before.threads
        assert side.refusals == {
            "reason=request_deadline,transport=metrics": 6,
            "reason=request_deadline,transport=otlp_http": 6,
        }
    text = http_transports_section.section(p, sides)
    assert text.startswith(begin_marker("bench.http_transports smoke"))
    assert text.endswith(end_marker("bench.http_transports smoke"))
    assert "### Plain HTTP" in text and "### TLS" in text
