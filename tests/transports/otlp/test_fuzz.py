"""The OTLP doors under random mutations of valid exports (bench/otlp_fuzz.py, quick): every
input is answered without a crash, and nothing acknowledged is lost."""

from __future__ import annotations

from bench.otlp_fuzz import run


async def test_300_mutated_exports_crash_nothing_and_lose_nothing() -> None:
    tally = await run(300, seed=19)
    assert tally.inputs == 300
    assert tally.total("crash") == 0, tally.crash_examples
    assert tally.lost_spans == 0, tally.lost_examples
    # The mutations reach both the decoders and the mapping, and stored messages were checked.
    assert tally.total("clear_error") > 50
    assert tally.total("partial_success") > 50
    assert tally.stored_messages > 100
