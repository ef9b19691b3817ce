"""bench.otlp_fuzz's section: what became of each kind of mutated input over each transport, and
the acknowledged spans lost."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING

from bench import report

if TYPE_CHECKING:
    from bench.otlp_fuzz import Tally

SECTION = "bench.otlp_fuzz"
# The table's columns, in order: what an input's answer was.
OUTCOMES = ("accepted", "partial_success", "clear_error", "throttled", "crash")


def section(tally: Tally, seed: int, seconds: float, timeout_seconds: float) -> str:
    kinds = sorted({kind for kind, _ in tally.outcomes})
    rows = "\n".join(
        f"| {kind} | " + " | ".join(f"{tally.outcomes[(kind, o)]:,}" for o in OUTCOMES) + " |"
        for kind in kinds
    )
    totals = " | ".join(f"**{tally.total(o):,}**" for o in OUTCOMES)
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    examples = "".join(f"\n- {e}" for e in tally.crash_examples + tally.lost_examples)
    return f"""{report.begin_marker(SECTION)}
## OTLP transports under {tally.inputs:,} random mutations (`python -m bench.otlp_fuzz`)

{when}, commit {report.commit_text()}; seed {seed}, {tally.inputs:,} inputs in {seconds:.0f} s.

| transport and input | accepted | partial_success | clear error | throttled | crash (goal 0) |
| --- | ---: | ---: | ---: | ---: | ---: |
{rows}
| all | {totals} |

Acknowledged but lost (goal 0): **{tally.lost_spans}** spans; {tally.stored_messages:,} messages
of acknowledged inputs were read back stored, and {tally.copies:,} were copies the store dropped
(a message whose key, its span's start and ids and its place in the span, a stored message
has).
Inputs are mutations of the four recorded runs of `tests/data/otlp` (one of them Microsoft
Agent Framework's own spans), each with its own trace and conversation: protobuf byte mutations
over gRPC (raw bytes) and HTTP (some gzipped), OTLP/JSON structure mutations over HTTP and, when
they still parse, over gRPC as protobuf. A crash is a 500, INTERNAL, UNKNOWN or UNAVAILABLE, no
answer within {timeout_seconds:.0f} s, or an error without a message; lost is a span of an
acknowledged input whose messages are not stored, are no copies and that the answer did not
count rejected. `tests/transports/otlp/test_fuzz.py` runs 300 inputs and asserts both
zeros.{examples}
{report.end_marker(SECTION)}"""
