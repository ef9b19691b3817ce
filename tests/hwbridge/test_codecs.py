"""Codecs: good payloads decode to readings; malformed ones raise DecodeError and nothing else."""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Literal

import cbor2
import pytest

from hwbridge.codecs import DecodeError, DocumentCodec, FrameCodec

NOW = datetime(2026, 1, 1, tzinfo=UTC)
T = 1_767_225_600.0  # 2026-01-01T00:00:00Z


def document(
    kind: Literal["json", "cbor"] = "json",
    *,
    fields: tuple[str, ...] = (),
    prefix_field: str | None = None,
    timestamp_unit: Literal["s", "ms"] = "s",
) -> DocumentCodec:
    return DocumentCodec(
        kind,
        timestamp_field="ts",
        timestamp_unit=timestamp_unit,
        fields=fields,
        prefix_field=prefix_field,
    )


def _json(document: object) -> bytes:
    return json.dumps(document).encode()


def frame(
    fmt: str = "<dff", fields: tuple[str, ...] = ("t", "tension_n", "current_a")
) -> FrameCodec:
    return FrameCodec(fmt, fields, timestamp_field="t", timestamp_unit="s")


@pytest.mark.parametrize("kind, encode", [("json", _json), ("cbor", cbor2.dumps)])
def test_documents_decode_records_lists_and_bare_numbers(
    kind: Literal["json", "cbor"], encode: Callable[[object], bytes]
) -> None:
    codec = document(kind)
    record = {"ts": T, "hr": 101.5, "spo2": 97, "unit": "bpm"}
    assert codec.decode(encode(record), NOW) == [
        ("hr", 101.5, datetime.fromtimestamp(T, UTC)),
        ("spo2", 97.0, datetime.fromtimestamp(T, UTC)),
    ]
    many = codec.decode(encode([{"ts": T, "x": 1}, {"ts": T + 1, "x": 2}]), NOW)
    assert [(value, at.timestamp()) for _, value, at in many] == [(1.0, T), (2.0, T + 1)]
    assert codec.decode(encode(42), NOW) == [("value", 42.0, NOW)]


def test_document_options_fields_prefix_units_and_time_forms() -> None:
    codec = document(fields=("price",), prefix_field="symbol", timestamp_unit="ms")
    readings = codec.decode(
        b'{"symbol": "ACME", "ts": 1767225600000, "price": 10, "volume": 5}', NOW
    )
    assert readings == [("ACME.price", 10.0, datetime.fromtimestamp(T, UTC))]
    iso = document().decode(b'{"ts": "2026-01-01T00:00:01", "x": 1}', NOW)
    assert iso[0][2] == datetime(2026, 1, 1, 0, 0, 1, tzinfo=UTC)
    native = document("cbor").decode(
        cbor2.dumps({"ts": datetime(2026, 1, 2, tzinfo=UTC), "x": 1}), NOW
    )
    assert native[0][2] == datetime(2026, 1, 2, tzinfo=UTC)
    # No timestamp field -> stamped on receipt; null / NaN -> no reading for that field.
    assert document().decode(b'{"x": 1, "y": null, "z": NaN}', NOW) == [("x", 1.0, NOW)]


@pytest.mark.parametrize(
    "payload, reason",
    [
        (b"{not json", "invalid JSON"),
        (b"\xff\xfe\x00", "invalid JSON"),
        (b'"text"', "expected a number"),
        (b'{"ts": 1, "status": "ok"}', "no readings"),
        (b'{"ts": "yesterday", "x": 1}', "not ISO-8601"),
        (b'{"ts": 1e300, "x": 1}', "out of range"),
        (b'{"x": Infinity}', "infinite"),
        (b'{"x": 1e999}', "infinite"),
        (b"[" * 100_000 + b"]" * 100_000, "invalid JSON"),
    ],
)
def test_malformed_json_raises_decode_error(payload: bytes, reason: str) -> None:
    with pytest.raises(DecodeError, match=reason):
        document().decode(payload, NOW)


@pytest.mark.parametrize(
    "payload, value",
    [
        (b'{"x": 18446744073709551616}', 18446744073709551616.0),  # over 64 bits
        (b'{"x": 2, "note": "\\ud800"}', 2.0),  # a lone surrogate
        (b'{"x": 3, "y": NaN}', 3.0),
    ],
)
def test_json_that_orjson_refuses_or_bends_reads_as_json_reads_it(
    payload: bytes, value: float
) -> None:
    assert document().decode(payload, NOW) == [("x", value, NOW)]


def test_an_integer_past_a_double_is_refused_as_json_reads_it() -> None:
    with pytest.raises(DecodeError, match="too large for a float"):
        document().decode(b'{"x": 1' + b"0" * 400 + b"}", NOW)


def test_configured_fields_and_prefix_are_required() -> None:
    with pytest.raises(DecodeError, match="'price' is missing"):
        document(fields=("price",)).decode(b'{"volume": 1}', NOW)
    with pytest.raises(DecodeError, match="not a number"):
        document(fields=("price",)).decode(b'{"price": "12"}', NOW)
    with pytest.raises(DecodeError, match="not a number"):
        document(fields=("ok",)).decode(b'{"ok": true}', NOW)
    with pytest.raises(DecodeError, match="prefix field 'symbol'"):
        document(prefix_field="symbol").decode(b'{"price": 1}', NOW)


@pytest.mark.parametrize(
    "payload",
    [b"\xa1", b"\xff\x00", b"\x1c", cbor2.dumps("text"), cbor2.dumps({"x": float("inf")}), b""],
)
def test_malformed_cbor_raises_decode_error(payload: bytes) -> None:
    with pytest.raises(DecodeError):
        document("cbor").decode(payload, NOW)


def test_frames_decode_several_per_payload() -> None:
    payload = struct.pack("<dff", T, 10.0, 1.5) + struct.pack("<dff", T + 0.01, float("nan"), 1.25)
    readings = frame().decode(payload, NOW)
    at0, at1 = datetime.fromtimestamp(T, UTC), datetime.fromtimestamp(T + 0.01, UTC)
    # NaN in a frame = that sensor had no reading; the frame's other fields still count.
    assert readings == [
        ("tension_n", 10.0, at0),
        ("current_a", 1.5, at0),
        ("current_a", 1.25, at1),
    ]
    assert frame().encode([(T, 10.0, 1.5)]) == payload[:16]


@pytest.mark.parametrize(
    "payload, reason",
    [
        (b"", "not a whole number"),
        (b"\x00" * 17, "not a whole number"),
        (struct.pack("<dff", float("nan"), 1, 1), "timestamp is NaN"),
        (struct.pack("<dff", 1e300, 1, 1), "out of range"),
        (struct.pack("<dff", T, float("inf"), 1), "infinite"),
        (struct.pack("<dff", T, float("nan"), float("nan")), "no readings"),
    ],
)
def test_malformed_frames_raise_decode_error(payload: bytes, reason: str) -> None:
    with pytest.raises(DecodeError, match=reason):
        frame().decode(payload, NOW)


@pytest.mark.parametrize(
    "fmt, fields, problem",
    [
        ("<dq", ("t",), "2 items"),
        ("<d4s", ("t", "name"), "byte-string"),
        ("<dZ", ("t", "x"), "invalid struct format"),
        ("<dd", ("t", "t"), "distinct"),
    ],
)
def test_frame_layouts_are_checked_when_built(
    fmt: str, fields: tuple[str, ...], problem: str
) -> None:
    with pytest.raises(ValueError, match=problem):
        frame(fmt, fields)
    with pytest.raises(ValueError, match="timestamp field 'ts'"):
        FrameCodec("<dd", ("t", "x"), timestamp_field="ts", timestamp_unit="s")
