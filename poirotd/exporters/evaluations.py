"""An attribution as an OTLP span with OpenTelemetry GenAI evaluation events. Pure (no I/O, no
clock): built from the finished record and where it goes (`placement`).

One span per attribution, from the investigation's creation to its end, carrying one
`gen_ai.evaluation.result` event per hazard region (the GenAI semantic conventions' evaluation
event, stability "development"): `gen_ai.evaluation.name` is the region's id, `score.value` its
score S_j, `score.label` the decision rule's verdict on it (`blamed` or `cleared`), and
`explanation` one line saying why (how many votes named it, where it ranks). The investigation's
page is linked from the span and every event (`poirot.investigation.url`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import (
    AnyValue,
    ArrayValue,
    InstrumentationScope,
    KeyValue,
)
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span, Status

from poirotd import __version__
from poirotd.exporters.placement import Placement
from poirotd.model import Attribution, HazardSpace, Investigation

EVALUATION_EVENT = "gen_ai.evaluation.result"
SPAN_NAME = "poirot.attribution"
SCOPE = "poirotd.exporters"
BLAMED = "blamed"
CLEARED = "cleared"
# An explanation's longest text: it is one line in a trace viewer, the page has the rest.
_EXPLANATION_CHARS = 300

AttributeValue = str | bool | int | float | Sequence[str]


def attribution_span(
    record: Investigation, placement: Placement, span_id: bytes, url: str = ""
) -> Span:
    """The span of a succeeded investigation's attribution. `url`: its page ("" for none)."""
    attribution, space = record.attribution, record.hazard_space
    if attribution is None or space is None:
        raise ValueError(f"investigation {record.investigation_id} has no attribution")
    finished = record.finished_at or record.created_at
    linked = {"poirot.investigation.url": url} if url else {}
    span = Span(
        trace_id=placement.trace_id,
        span_id=span_id,
        parent_span_id=placement.parent_span_id,
        name=SPAN_NAME,
        kind=Span.SPAN_KIND_INTERNAL,
        start_time_unix_nano=_nanos(record.created_at),
        end_time_unix_nano=_nanos(finished),
        attributes=_attributes(
            {
                "poirot.system": record.system,
                "poirot.investigation.id": record.investigation_id,
                "poirot.session.id": record.session_id,
                "gen_ai.conversation.id": record.session_id,
                "poirot.method": record.method,
                "poirot.reason": record.reason,
                "poirot.decision.rule": attribution.rule,
                "poirot.attribution.top": [space.regions[i].id for i in attribution.top],
                "poirot.attribution.blamed": _blamed(attribution, space),
                "poirot.attribution.tie": attribution.tie,
                "poirot.degraded_reason": record.degraded_reason,
                **linked,
            }
        ),
        status=Status(code=Status.STATUS_CODE_OK),
    )
    for link in placement.links:
        span.links.add(
            trace_id=link.to.trace_id,
            span_id=link.to.span_id,
            attributes=_attributes({"poirot.link.reason": link.reason}),
        )
    at = _nanos(finished)
    for j, region in enumerate(space.regions):
        span.events.add(
            time_unix_nano=at,
            name=EVALUATION_EVENT,
            attributes=_attributes(
                {
                    "gen_ai.evaluation.name": region.id,
                    "gen_ai.evaluation.score.value": float(attribution.scores[j]),
                    "gen_ai.evaluation.score.label": BLAMED if attribution.decision[j] else CLEARED,
                    "gen_ai.evaluation.explanation": explanation(record, j),
                    **linked,
                }
            ),
        )
    return span


def explanation(record: Investigation, j: int) -> str:
    """Why region j scored what it did, in one line."""
    attribution, space = record.attribution, record.hazard_space
    assert attribution is not None and space is not None
    region = space.regions[j]
    scores = attribution.scores
    rank = 1 + sum(score > scores[j] for score in scores)
    parts = [
        f"{region.name} ({region.type})",
        f"score {scores[j]:.3g}, rank {rank} of {len(scores)}",
    ]
    voters = [v for v in record.votes if not v.abstained]
    if voters:
        named = sum(1 for v in voters if j < len(v.location) and v.location[j])
        parts.append(f"named by {named} of {len(voters)} votes")
    verdict = BLAMED if attribution.decision[j] else CLEARED
    parts.append(f"{verdict} by rule {attribution.rule}")
    if j in attribution.top and attribution.tie:
        parts.append("tied for the top score")
    text = "; ".join(parts)
    return text if len(text) <= _EXPLANATION_CHARS else text[: _EXPLANATION_CHARS - 1] + "…"


def export_request(
    spans: Iterable[Span], resource: Mapping[str, AttributeValue]
) -> ExportTraceServiceRequest:
    """One export of `spans` from this daemon (`resource`: service.name and the like)."""
    scope = ScopeSpans(scope=InstrumentationScope(name=SCOPE, version=__version__), spans=spans)
    resource_spans = ResourceSpans(
        resource=Resource(attributes=_attributes(resource)), scope_spans=[scope]
    )
    return ExportTraceServiceRequest(resource_spans=[resource_spans])


def _blamed(attribution: Attribution, space: HazardSpace) -> list[str]:
    pairs = zip(space.regions, attribution.decision, strict=True)
    return [region.id for region, bit in pairs if bit]


def _nanos(at: datetime) -> int:
    return int(at.timestamp() * 1_000_000) * 1000


def _attributes(values: Mapping[str, AttributeValue]) -> list[KeyValue]:
    """OTLP key-values; empty strings are left out (an attribute that says nothing)."""
    return [KeyValue(key=key, value=_value(v)) for key, v in values.items() if v != ""]


def _value(value: AttributeValue) -> AnyValue:
    if isinstance(value, bool):
        return AnyValue(bool_value=value)
    if isinstance(value, int):
        return AnyValue(int_value=value)
    if isinstance(value, float):
        return AnyValue(double_value=value)
    if isinstance(value, str):
        return AnyValue(string_value=value)
    return AnyValue(array_value=ArrayValue(values=[AnyValue(string_value=v) for v in value]))
