"""Where an attribution's span goes: into the session's trace when the OTLP receiver started the
session (a child of the span it evaluates, the other traces linked), into a trace of its own
otherwise (linked to the spans the messages name), as the span carries it; how its page is
linked; and the export settings' checks."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from poirotd.config import Settings
from poirotd.exporters.evaluations import attribution_span
from poirotd.exporters.page_links import PageLinks
from poirotd.exporters.placement import EVALUATED, MAX_LINKS, SESSION_TRACE, place
from poirotd.model import AgentMessage, Attribution, InvestigationState
from tests.support.store import investigation, message, space

OTLP = {"input": "otlp"}
TRACE_A, TRACE_B = "a" * 32, "b" * 32


def traced(index: int, trace: str, span: str) -> AgentMessage:
    return message(index).model_copy(update={"trace_id": trace, "span_id": span})


def test_the_span_is_a_child_of_the_message_at_the_step_in_its_trace() -> None:
    messages = [traced(0, TRACE_A, "01" * 8), traced(2, TRACE_B, "02" * 8)]
    placement = place(OTLP, [*messages, traced(5, TRACE_B, "03" * 8)], step=2)
    assert placement.trace_id.hex() == TRACE_B
    assert placement.parent_span_id.hex() == "02" * 8
    # The session's other trace, by its latest span.
    assert [
        (link.to.trace_id.hex(), link.to.span_id.hex(), link.reason) for link in placement.links
    ] == [(TRACE_A, "01" * 8, SESSION_TRACE)]


def test_without_a_step_the_last_message_is_evaluated() -> None:
    messages = [traced(0, TRACE_A, "01" * 8), traced(1, TRACE_A, "02" * 8), message(2)]
    placement = place(OTLP, messages, step=None)
    assert (placement.trace_id.hex(), placement.parent_span_id.hex()) == (TRACE_A, "02" * 8)
    assert placement.links == ()


def test_a_session_from_another_transport_gets_its_own_trace_linked_to_its_spans() -> None:
    messages = [traced(0, TRACE_A, "01" * 8), traced(1, TRACE_B, "02" * 8)]
    placement = place({"input": "grpc"}, messages, step=0)
    assert placement.trace_id.hex() not in (TRACE_A, TRACE_B)
    assert any(placement.trace_id) and placement.parent_span_id == b""
    assert [(link.to.span_id.hex(), link.reason) for link in placement.links] == [
        ("01" * 8, EVALUATED),
        ("02" * 8, SESSION_TRACE),
    ]


def test_messages_without_valid_ids_give_a_trace_of_its_own_and_no_link() -> None:
    messages = [message(0), traced(1, "0" * 32, "01" * 8), traced(2, "zz" * 16, "01" * 8)]
    placement = place(OTLP, messages, step=1)
    assert placement.parent_span_id == b"" and placement.links == ()


def test_links_are_bounded() -> None:
    messages = [traced(i, f"{i + 1:032x}", "01" * 8) for i in range(MAX_LINKS + 10)]
    assert len(place(OTLP, messages, step=None).links) == MAX_LINKS
    assert len(place({}, messages, step=None).links) == MAX_LINKS


def test_the_page_link_fills_the_template_with_encoded_fields() -> None:
    record = investigation("inv/1", sid="visit 7")
    links = PageLinks("https://ops.example/poirot/", "/s/{session_id}/i/{investigation_id}")
    assert links.url(record) == "https://ops.example/poirot/s/visit%207/i/inv%2F1"
    assert PageLinks("http://h").url(record) == "http://h/investigations/inv%2F1"


@pytest.mark.parametrize(
    ("settings", "named"),
    [
        ({"otlp_export_link_path": "/i/{id}"}, "POIROTD_OTLP_EXPORT_LINK_PATH"),
        ({"otlp_export_headers": "authorization:s3cret"}, "POIROTD_OTLP_EXPORT_HEADERS"),
        ({"otlp_export_resource_attributes": "=x"}, "POIROTD_OTLP_EXPORT_RESOURCE_ATTRIBUTES"),
        ({"otlp_export_endpoint": "collector:4318"}, "POIROTD_OTLP_EXPORT_ENDPOINT"),
        ({"otlp_export_client_cert_file": "c.pem"}, "POIROTD_OTLP_EXPORT_CLIENT_CERT_FILE"),
    ],
)
def test_unusable_export_settings_are_refused_naming_the_setting(
    settings: dict[str, str], named: str
) -> None:
    with pytest.raises(ValidationError, match=named) as refused:
        Settings(**settings)  # type: ignore[arg-type]
    assert "s3cret" not in str(refused.value)


def test_header_values_are_percent_decoded_and_never_shown() -> None:
    settings = Settings(otlp_export_headers="authorization=Bearer%20s3cret, x-tenant=ops")
    assert settings.otlp_export_header_map() == {
        "authorization": "Bearer s3cret",
        "x-tenant": "ops",
    }
    assert "s3cret" not in repr(settings)


def test_the_span_carries_its_placement_and_links_on_the_wire() -> None:
    record = investigation("i1", state=InvestigationState.SUCCEEDED).model_copy(
        update={
            "hazard_space": space(),
            "attribution": Attribution(
                scores=(0.5, 1.0), top=(1,), tie=False, decision=(0, 1), rule="argmax", beta=0.25
            ),
        }
    )
    messages = [traced(0, TRACE_A, "01" * 8), traced(1, TRACE_B, "02" * 8)]
    placement = place({"input": "grpc"}, messages, step=1)
    span = attribution_span(record, placement, b"\x07" * 8)
    assert (span.trace_id, span.parent_span_id) == (placement.trace_id, b"")
    assert [
        (link.trace_id.hex(), link.span_id.hex(), link.attributes[0].value.string_value)
        for link in span.links
    ] == [(TRACE_B, "02" * 8, EVALUATED), (TRACE_A, "01" * 8, SESSION_TRACE)]
    assert [e.attributes[2].value.string_value for e in span.events] == ["cleared", "blamed"]
