"""Payload codecs: bytes -> readings (field, value, measured_at). Pure; no I/O, no topics.

Every failure raises ``DecodeError`` with a reason fit for a dead-letter record, never anything
else, so the input loop needs exactly one ``except``. Conventions shared by all codecs: NaN (or a
JSON/CBOR null) means "no reading for this field" and is skipped; an infinite value is implausible
for any sensor or price and makes the whole payload undecodable.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Literal, Protocol, TypeAlias

import cbor2
import orjson

from poirotd.model import MAX_INTEGER, producer_problem

TimestampUnit = Literal["s", "ms", "us", "ns"]
_PER_SECOND: dict[TimestampUnit, float] = {"s": 1.0, "ms": 1e3, "us": 1e6, "ns": 1e9}


# A payload's idempotency key: its producer ("": the topic it came on) and its seq; the bounds
# are the daemon's (the store's largest integer, poirotd.model.producer_problem).
PayloadKey: TypeAlias = tuple[str, int]
MAX_SEQ = MAX_INTEGER


class DecodeError(ValueError):
    """The payload cannot be turned into readings; the message says why."""


# (field, value, measured_at). A plain tuple: one is built per reading at sensor rates, where a
# NamedTuple's constructor costs five times as much.
Reading: TypeAlias = tuple[str, float, datetime]


class Codec(Protocol):
    def decode(self, payload: bytes, received_at: datetime) -> list[Reading]: ...


def epoch_to_datetime(value: float, unit: TimestampUnit) -> datetime:
    """Raises DecodeError for a time outside what a datetime can hold (or not finite)."""
    try:
        return datetime.fromtimestamp(value / _PER_SECOND[unit], UTC)
    except (OverflowError, OSError, ValueError) as exc:
        raise DecodeError(f"timestamp {value!r} {unit} is out of range") from exc


def _number(name: str, raw: object) -> float | None:
    """A reading's value, None for "no reading"; booleans and strings are not numbers."""
    if type(raw) is float and raw - raw == 0.0:  # finite (inf - inf and NaN - NaN are NaN)
        return raw
    if raw is None:
        return None
    if isinstance(raw, bool) or not isinstance(raw, int | float):
        raise DecodeError(f"field {name!r} is not a number: {type(raw).__name__}")
    try:
        value = float(raw)
    except OverflowError as exc:
        raise DecodeError(f"field {name!r} is too large for a float") from exc
    if math.isnan(value):
        return None
    if math.isinf(value):
        raise DecodeError(f"field {name!r} is infinite")
    return value


# ------------------------------------------------------------------ JSON / CBOR documents


def _load_json(payload: bytes) -> object:
    """orjson first (a tenth of json's time on a sensor record); what it refuses (NaN and
    Infinity literals, lone surrogates, integers beyond a double, deep nesting, damage) goes to
    json, so every payload decodes as json reads it, and a bad one fails with json's reason.
    orjson's only other difference, integers beyond 64 bits as the nearest double, is the value
    a reading takes from them anyway."""
    try:
        return orjson.loads(payload)
    except orjson.JSONDecodeError:
        pass
    try:
        # JSON between systems is UTF-8 (RFC 8259); decoding it here skips json's guessing.
        return json.loads(payload.decode())
    except (ValueError, RecursionError) as exc:  # JSONDecodeError and UnicodeDecodeError
        raise DecodeError(f"invalid JSON: {exc}") from exc


def _load_cbor(payload: bytes) -> object:
    try:
        return cbor2.loads(payload)
    # cbor2 raises CBORDecodeError for most damage, but crafted input can surface other
    # exceptions from its tag handlers; whatever it is, the payload is undecodable.
    except Exception as exc:
        raise DecodeError(f"invalid CBOR: {exc}") from exc


_LOADERS: dict[str, Callable[[bytes], object]] = {"json": _load_json, "cbor": _load_cbor}


class DocumentCodec:
    """A JSON or CBOR document: a bare number, one object (record), or a list of records.

    A record yields one reading per value field, all at the record's timestamp. A bare number is
    one reading named ``value`` at the receive time.
    """

    def __init__(
        self,
        kind: Literal["json", "cbor"],
        *,
        timestamp_field: str | None,
        timestamp_unit: TimestampUnit,
        fields: Sequence[str] = (),
        prefix_field: str | None = None,
        key_field: str | None = None,
        producer_field: str | None = None,
    ) -> None:
        self._load = _LOADERS[kind]
        self._key_field = key_field
        self._producer_field = producer_field
        self._timestamp_field = timestamp_field
        self._unit = timestamp_unit
        self._per_second = _PER_SECOND[timestamp_unit]
        self._fields = tuple(fields)
        self._prefix_field = prefix_field
        self._skip = {timestamp_field, prefix_field, key_field, producer_field} - {None}

    @property
    def keyed(self) -> bool:
        """Whether its payloads carry their producer's idempotency key."""
        return self._key_field is not None

    def decode(self, payload: bytes, received_at: datetime) -> list[Reading]:
        return self._readings(self._load(payload), received_at)

    def decode_keyed(
        self, payload: bytes, received_at: datetime
    ) -> tuple[list[Reading], PayloadKey]:
        """The readings and the payload's key: (its producer field, "" without one; its seq).
        A keyed payload is one object whose key field is an integer from 1 to 2**63 - 1."""
        document = self._load(payload)
        readings = self._readings(document, received_at)
        if not isinstance(document, Mapping):
            raise DecodeError("a keyed payload is one object")
        return readings, self._key(document)

    def _key(self, document: Mapping[object, object]) -> PayloadKey:
        assert self._key_field is not None, "only for a keyed codec"
        seq = document.get(self._key_field)
        if type(seq) is not int or not 1 <= seq <= MAX_SEQ:
            raise DecodeError(
                f"key field {self._key_field!r} is not an integer from 1 to {MAX_SEQ}: {seq!r}"
            )
        if self._producer_field is None:
            return "", seq
        producer = document.get(self._producer_field)
        if not isinstance(producer, str) or not producer:
            raise DecodeError(f"producer field {self._producer_field!r} is not a name")
        if problem := producer_problem(producer):
            raise DecodeError(f"producer field {self._producer_field!r}: {problem}")
        return producer, seq

    def _readings(self, document: object, received_at: datetime) -> list[Reading]:
        if type(document) is dict:  # the usual case, ahead of the slower abstract check
            readings = self._record(document, received_at)
        elif isinstance(document, list):
            readings = [r for record in document for r in self._record(record, received_at)]
        elif isinstance(document, Mapping | int | float):
            readings = self._record(document, received_at)
        else:
            raise DecodeError(
                f"expected a number, an object or a list, got {type(document).__name__}"
            )
        if not readings:
            raise DecodeError("no readings in the payload")
        return readings

    def _record(self, record: object, received_at: datetime) -> list[Reading]:
        if type(record) is not dict and not isinstance(record, Mapping):
            value = _number("value", record)
            return [] if value is None else [("value", value, received_at)]
        stamp = self._timestamp_field
        raw = record.get(stamp) if stamp is not None else None
        if type(raw) is float and raw - raw == 0.0:  # a finite epoch time, the usual case
            try:
                at = datetime.fromtimestamp(raw / self._per_second, UTC)
            except (OverflowError, OSError, ValueError):
                at = epoch_to_datetime(raw, self._unit)  # raises, saying why
        else:
            at = self._time(record, received_at)
        prefix = "" if self._prefix_field is None else self._prefix(record)
        readings = []
        if self._fields:
            for name in self._fields:
                if name not in record:
                    raise DecodeError(f"field {name!r} is missing")
                value = _number(name, record[name])
                if value is not None:
                    readings.append((prefix + name, value, at))
            return readings
        skip = self._skip
        for name, raw in record.items():
            if name in skip:
                continue
            if type(raw) is float and raw - raw == 0.0:  # _number's first test, inline
                value = raw
            # Fields are detected by their numbers; NaN (no reading) is skipped.
            elif not _numeric(raw) or (value := _number(name, raw)) is None:
                continue
            readings.append((prefix + name if prefix else name, value, at))
        return readings

    def _time(self, record: Mapping[object, object], received_at: datetime) -> datetime:
        """The record's time, for all but a finite float epoch time (`_record` takes those)."""
        if self._timestamp_field is None or self._timestamp_field not in record:
            return received_at
        raw = record[self._timestamp_field]
        if isinstance(raw, datetime):  # CBOR tag 0/1
            return raw if raw.tzinfo is not None else raw.replace(tzinfo=UTC)
        if isinstance(raw, str):
            try:
                parsed = datetime.fromisoformat(raw)
            except ValueError as exc:
                raise DecodeError(f"timestamp {raw!r} is not ISO-8601") from exc
            return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)
        number = _number(self._timestamp_field, raw)
        if number is None:
            raise DecodeError(f"timestamp field {self._timestamp_field!r} is empty")
        return epoch_to_datetime(number, self._unit)

    def _prefix(self, record: Mapping[object, object]) -> str:
        if self._prefix_field is None:
            return ""
        prefix = record.get(self._prefix_field)
        if not isinstance(prefix, str) or not prefix:
            raise DecodeError(f"prefix field {self._prefix_field!r} is missing or not a string")
        return f"{prefix}."


def _numeric(value: object) -> bool:
    return type(value) is float or (isinstance(value, int | float) and not isinstance(value, bool))


# ------------------------------------------------------------------ binary frames


class FrameCodec:
    """Fixed-size binary frames, e.g. ``<dfff`` = float64 time + three float32 signals.

    A payload holds one or more whole frames back to back: a sensor sampling at kHz rates sends a
    few dozen frames per message instead of one message per sample.
    """

    def __init__(
        self,
        fmt: str,
        fields: Sequence[str],
        *,
        timestamp_field: str | None,
        timestamp_unit: TimestampUnit,
    ) -> None:
        try:
            self._struct = struct.Struct(fmt)
        except struct.error as exc:
            raise ValueError(f"invalid struct format {fmt!r}: {exc}") from exc
        zero = self._struct.unpack(bytes(self._struct.size))
        if any(isinstance(item, bytes) for item in zero):
            raise ValueError(f"struct format {fmt!r} has byte-string items; only numbers decode")
        if len(zero) != len(fields) or len(set(fields)) != len(fields):
            raise ValueError(
                f"struct format {fmt!r} has {len(zero)} items; "
                f"give as many distinct field names (got {list(fields)})"
            )
        if timestamp_field is not None and timestamp_field not in fields:
            raise ValueError(f"timestamp field {timestamp_field!r} is not one of {list(fields)}")
        self.size = self._struct.size
        self._fields = tuple(fields)
        self._time_index = None if timestamp_field is None else fields.index(timestamp_field)
        self._value_fields = [(i, f) for i, f in enumerate(fields) if i != self._time_index]
        self._unit = timestamp_unit

    def decode(self, payload: bytes, received_at: datetime) -> list[Reading]:
        if not payload or len(payload) % self.size:
            raise DecodeError(
                f"payload is {len(payload)} bytes, not a whole number of {self.size}-byte frames"
            )
        readings = []
        for frame in self._struct.iter_unpack(payload):
            at = received_at
            if self._time_index is not None:
                stamp = _number(self._fields[self._time_index], frame[self._time_index])
                if stamp is None:
                    raise DecodeError("frame timestamp is NaN")
                at = epoch_to_datetime(stamp, self._unit)
            for index, name in self._value_fields:
                raw = frame[index]
                # _number's first test, inline: a finite float, the usual case, is taken as is.
                value = raw if type(raw) is float and raw - raw == 0.0 else _number(name, raw)
                if value is not None:
                    readings.append((name, value, at))
        if not readings:
            raise DecodeError("no readings in the payload")
        return readings

    def encode(self, rows: Sequence[Sequence[float]]) -> bytes:
        """Frames for the simulators; each row lists the fields in declaration order."""
        return b"".join(self._struct.pack(*row) for row in rows)
