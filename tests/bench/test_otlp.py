"""bench.otlp at its smallest: every way stores every message (run() checks the store), in both
shapes of span, and the section renders; the two-message shape maps to the same conversation as
the native way sends."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import pytest

from bench import otlp
from bench.sections import otlp as otlp_section
from poirotd.api import convert
from poirotd.devtools.otlp_runs import SPEC
from poirotd.model import AgentMessage
from poirotd.transports.otlp.mapping import map_export


def test_both_ways_carry_the_same_messages_in_either_shape() -> None:
    for per_span in (1, 2):
        now = datetime.now(UTC)
        items = [convert.ingest_item(r, 0, now) for r in otlp.native_requests("s", 8, per_span)]
        native = [m for m in items if isinstance(m, AgentMessage)]
        assert len(native) == 8
        (export,) = otlp.otlp_exports("s", 8, per_span)
        mapped = map_export(export, SPEC.agents_by_alias(), session_by="conversation").messages
        sent = [(m.kind, m.sender, m.recipient, m.content) for m in native]
        assert [(m.kind, m.sender, m.recipient, m.content) for m in mapped] == sent, per_span


@pytest.mark.parametrize("per_span", [1, 2])
async def test_a_smoke_run_stores_every_message_and_renders(per_span: int) -> None:
    rates = await otlp.run(messages=1024, rounds=1, exporters=2, per_span=per_span)
    assert all(len(rounds) == 1 and rounds[0].wall > 0 for rounds in rates.values())
    keys = await asyncio.to_thread(otlp.keys_cpu_us, 1024, per_span, 1)  # runs its own loop
    text = otlp_section.section(rates, 1024, 1, 2, 1.0, keys, per_span, otlp.SPANS_PER_EXPORT)
    assert "| OTLP/HTTP `POST /v1/traces`, 2 exporters |" in text
    assert ("--messages-per-span 2" in text) == (per_span == 2)
