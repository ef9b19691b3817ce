"""The OTLP transports under random mutations of valid exports (bench/otlp_fuzz.py, quick): every
input is answered without a crash, and nothing acknowledged is lost."""

from __future__ import annotations

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from bench.otlp_fuzz import Input, run, seeds, unique
from poirotd.devtools.otlp_runs import DIAGNOSIS


async def test_300_mutated_exports_crash_nothing_and_lose_nothing() -> None:
    tally = await run(300, seed=19)
    assert tally.inputs == 300
    assert tally.total("crash") == 0, tally.crash_examples
    assert tally.lost_spans == 0, tally.lost_examples
    # The mutations reach both the decoders and the mapping, and stored messages were checked.
    assert tally.total("clear_error") > 50
    assert tally.total("partial_success") > 50
    assert tally.stored_messages > 100


async def test_a_span_resent_with_other_content_is_a_copy_not_a_loss() -> None:
    """Two inputs with the same trace and span ids but another text: the store keeps the
    message that was committed first and drops the other as a copy of it (its key is the
    span's); the checker counts it a copy, whichever of the two its workers check first."""
    first = unique(seeds()[0], 0)
    second = ExportTraceServiceRequest()
    second.CopyFrom(first)
    for resource_spans in second.resource_spans:
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                for pair in span.attributes:
                    text = pair.value.string_value
                    pair.value.string_value = text.replace(DIAGNOSIS, DIAGNOSIS.upper())
    inputs = [first, second]

    def make(n: int) -> tuple[str, Input]:
        return "protobuf", Input("grpc", inputs[n].SerializeToString())

    tally = await run(2, seed=19, make=make)
    assert tally.total("partial_success") == 2
    assert tally.lost_spans == 0, tally.lost_examples
    assert tally.copies >= 1
