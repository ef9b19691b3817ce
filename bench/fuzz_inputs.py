"""What the fuzzing benchmark (`bench/fuzz.py`) sends: hypothesis strategies that start from
valid requests, MQTT messages and system specs and bend them.

Requests are built from the protobuf descriptors, field by field, so every RPC of poirot.v1 is
covered the same way: each field is left unset, given a valid value (`Hints`, by field name:
the daemon's sessions, agents, investigations...) or a hostile one (edge integers, huge or odd
text, times outside any sane window, unknown enum numbers). Raw bytes are random, valid
serialisations damaged (truncated, a byte replaced, bytes inserted), or hand-made wire damage.
"""

from __future__ import annotations

import copy
import json
import struct
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta, timezone
from functools import partial
from typing import Any, TypeAlias

import cbor2
import yaml
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message
from google.protobuf.message_factory import GetMessageClass
from google.protobuf.timestamp_pb2 import Timestamp
from hypothesis import strategies as st

from poirotd.api.poirot.v1 import poirot_pb2 as pb

# Field name -> valid values for it (a session id, an agent id, an investigation id...).
Hints: TypeAlias = Mapping[str, st.SearchStrategy[Any]]

_UINT64_EDGES = (0, 1, 2**31 - 1, 2**31, 2**32, 2**53 + 1, 2**63 - 1, 2**63, 2**64 - 1)
_UINT32_EDGES = (0, 1, 2**31 - 1, 2**31, 2**32 - 1)
_INT_EDGES = (-(2**63), -(2**31), -1, 0, 1, 2**31 - 1, 2**63 - 1)
# Text without lone surrogates (protobuf cannot encode them; raw bytes cover invalid UTF-8).
_CHARS = st.characters(codec="utf-8")
_ODD_TEXT = (
    "",
    " ",
    "\x00",
    "\u202e",
    "\ufeff",
    "%s%n",
    "../../etc/passwd",
    "[" * 3000,
    "🦀" * 10,
    "-1",
    "9" * 30,
    "null",
    "'; DROP TABLE sessions; --",
)
# Beyond the free-text limit (4,000 characters), the item size and the message size.
_BIG_TEXT_CHARS = (4_000, 4_001, 70_000, 300_000, 1_100_000)
_SHORT_TEXT = st.text(_CHARS, max_size=40)
# Mostly short, odd one time in five, over a limit one time in ten (each costs megabytes).
TEXT = st.integers(0, 9).flatmap(
    lambda k: (
        st.sampled_from(_BIG_TEXT_CHARS).map(lambda n: "x" * n)
        if k == 0
        else st.sampled_from(_ODD_TEXT)
        if k < 3
        else _SHORT_TEXT
    )
)
# Protobuf Timestamp fields: seconds int64, nanos int32; a valid one is 0001..9999 and nanos
# within a second, a sane one (for the daemon) 1970..now + a day.
_SECONDS_EDGES = (
    -(2**63),
    -62_135_596_801,
    -62_135_596_800,
    -1,
    0,
    253_402_300_799,
    253_402_300_800,
    2**63 - 1,
)
_NANOS_EDGES = (-(2**31), -1, 0, 999_999_999, 1_000_000_000, 2**31 - 1)


def _weighted(
    valid: st.SearchStrategy[Any], hostile: st.SearchStrategy[Any]
) -> st.SearchStrategy[Any]:
    """`valid` three times in four, so most inputs reach past the first check. (Repeating a
    branch of `st.one_of` does not weigh it: hypothesis merges equal branches.)"""

    def pick(common: bool) -> st.SearchStrategy[Any]:
        return valid if common else hostile

    return st.sampled_from((True, True, True, False)).flatmap(pick)


def _message_type(field: FieldDescriptor) -> Descriptor:
    assert field.message_type is not None, field.full_name
    return field.message_type


def _is_map(field: FieldDescriptor) -> bool:
    return field.type == FieldDescriptor.TYPE_MESSAGE and bool(
        _message_type(field).GetOptions().map_entry
    )


def _enum_numbers(field: FieldDescriptor) -> list[int]:
    assert field.enum_type is not None, field.full_name
    return [value.number for value in field.enum_type.values]


def timestamps(now: datetime, hostile: bool = True) -> st.SearchStrategy[Message]:
    sane = st.datetimes(
        min_value=(now - timedelta(days=365)).replace(tzinfo=None),
        max_value=now.replace(tzinfo=None),
    ).map(lambda at: _timestamp(int(at.replace(tzinfo=UTC).timestamp()), at.microsecond * 1000))
    if not hostile:
        return sane
    odd = st.builds(
        _timestamp,
        st.one_of(st.sampled_from(_SECONDS_EDGES), st.integers(-(2**63), 2**63 - 1)),
        st.one_of(st.sampled_from(_NANOS_EDGES), st.integers(-(2**31), 2**31 - 1)),
    )
    return _weighted(sane, odd)


def _timestamp(seconds: int, nanos: int) -> Message:
    return Timestamp(seconds=seconds, nanos=nanos)


def _scalar(field: FieldDescriptor) -> st.SearchStrategy[Any]:
    """A hostile value of the field's wire type."""
    t = FieldDescriptor
    if field.type == t.TYPE_STRING:
        return TEXT
    if field.type == t.TYPE_BYTES:
        return st.binary(max_size=64)
    if field.type == t.TYPE_BOOL:
        return st.booleans()
    if field.type in (t.TYPE_UINT64, t.TYPE_FIXED64):
        return st.one_of(st.sampled_from(_UINT64_EDGES), st.integers(0, 2**64 - 1))
    if field.type in (t.TYPE_UINT32, t.TYPE_FIXED32):
        return st.one_of(st.sampled_from(_UINT32_EDGES), st.integers(0, 2**32 - 1))
    if field.type in (t.TYPE_INT64, t.TYPE_SINT64, t.TYPE_SFIXED64):
        return st.one_of(st.sampled_from(_INT_EDGES), st.integers(-(2**63), 2**63 - 1))
    if field.type in (t.TYPE_INT32, t.TYPE_SINT32, t.TYPE_SFIXED32):
        return st.integers(-(2**31), 2**31 - 1)
    if field.type in (t.TYPE_DOUBLE, t.TYPE_FLOAT):
        return st.floats(width=64 if field.type == t.TYPE_DOUBLE else 32)
    if field.type == t.TYPE_ENUM:
        defined = _enum_numbers(field)
        return _weighted(st.sampled_from(defined), st.integers(-(2**31), 2**31 - 1))
    raise TypeError(f"no strategy for field {field.full_name} of type {field.type}")


def _benign(field: FieldDescriptor) -> st.SearchStrategy[Any]:
    """An unremarkable value of the field's wire type (for fields without hints)."""
    t = FieldDescriptor
    if field.type == t.TYPE_STRING:
        return st.text(_CHARS, max_size=20)
    if field.type in (t.TYPE_DOUBLE, t.TYPE_FLOAT):
        return st.floats(-1000, 1000)
    if field.type == t.TYPE_ENUM:
        return st.sampled_from([n for n in _enum_numbers(field) if n] or [0])
    if field.type in (t.TYPE_BOOL, t.TYPE_BYTES):
        return _scalar(field)
    return st.integers(0, 100)


def _value(
    field: FieldDescriptor, hints: Hints, now: datetime, hostile: bool
) -> st.SearchStrategy[Any]:
    """One value of the field (a list for a repeated one, a dict for a map)."""
    scalar = _scalar if hostile else _benign
    if _is_map(field):
        key, value = (_message_type(field).fields_by_name[n] for n in ("key", "value"))
        return st.dictionaries(scalar(key), scalar(value), max_size=4)
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        one: st.SearchStrategy[Any] = message(_message_type(field), hints, now, hostile=hostile)
    elif field.name in hints:
        one = _weighted(hints[field.name], scalar(field)) if hostile else hints[field.name]
    else:
        one = scalar(field)
    if field.is_repeated:
        if field.name in hints and field.type != FieldDescriptor.TYPE_MESSAGE:
            listed = st.lists(hints[field.name], min_size=1, max_size=3)
            return _weighted(listed, st.lists(one)) if hostile else listed
        return st.lists(one, max_size=5)
    return one


def message(
    descriptor: Descriptor, hints: Hints, now: datetime, *, hostile: bool = True
) -> st.SearchStrategy[Message]:
    """A message of this type, each field valid (from `hints`) or, with `hostile`, unset or
    hostile one time in four; one member of each oneof is set (or, with `hostile`, none)."""
    if descriptor.full_name == "google.protobuf.Timestamp":
        return timestamps(now, hostile)
    plain: dict[str, st.SearchStrategy[Any]] = {}
    choices: dict[str, st.SearchStrategy[Any]] = {}
    for oneof in descriptor.oneofs:
        members = [st.tuples(st.just(f.name), _value(f, hints, now, hostile)) for f in oneof.fields]
        choices[oneof.name] = st.one_of(*members, *[st.none()] * hostile)
    for field in descriptor.fields:
        if field.containing_oneof is None:
            value = _value(field, hints, now, hostile)
            plain[field.name] = _weighted(value, st.none()) if hostile else value
    return st.builds(
        partial(_build, descriptor),
        st.fixed_dictionaries(plain),
        st.fixed_dictionaries(choices),
    )


def _build(
    descriptor: Descriptor, plain: dict[str, Any], choices: dict[str, tuple[str, Any] | None]
) -> Message:
    msg = GetMessageClass(descriptor)()
    chosen = [choice for choice in choices.values() if choice is not None]
    for name, value in [*plain.items(), *chosen]:
        if value is None:
            continue
        field = descriptor.fields_by_name[name]
        target = getattr(msg, name)
        if _is_map(field):
            target.update(value)
        elif field.is_repeated:
            target.extend(value)
        elif field.type == FieldDescriptor.TYPE_MESSAGE:
            target.CopyFrom(value)
        else:
            setattr(msg, name, value)
    return msg


# ------------------------------------------------------------------ raw bytes

# Wire damage a random byte string rarely hits.
CRAFTED = (
    b"\x0a\x02\xc3\x28",  # field 1 (a string in most requests) that is not UTF-8
    b"\x0a\x80",  # a length whose varint is cut off
    b"\x08" + b"\xff" * 10 + b"\x01",  # a varint longer than 10 bytes
    b"\x0a\xff\xff\xff\xff\x0f" + b"a",  # a length far beyond the end
    b"\x0b" * 1000,  # a thousand nested group starts
    b"\x0f",  # wire type 7 does not exist
    b"\x00",  # field number 0
    b"\xfa\xff\xff\xff\x0f\x03abc",  # the largest field number
    b"\x12\x06\x52\x04\x0a\x02\xc3\x28",  # a batch item whose session id is not UTF-8
    b"\x08\x01\x5a\x04\x0a\x02\xff\xfe",  # seq 1, then a message whose session id is not UTF-8
)


def damaged(data: bytes) -> st.SearchStrategy[bytes]:
    """`data` truncated, with a byte replaced, or with bytes inserted."""
    last = max(len(data) - 1, 0)
    return st.one_of(
        st.integers(0, last).map(lambda i: data[:i]),
        st.tuples(st.integers(0, last), st.integers(0, 255)).map(
            lambda t: data[: t[0]] + bytes([t[1]]) + data[t[0] + 1 :]
        ),
        st.tuples(st.integers(0, len(data)), st.binary(min_size=1, max_size=8)).map(
            lambda t: data[: t[0]] + t[1] + data[t[0] :]
        ),
    )


def raw(data: bytes) -> st.SearchStrategy[bytes]:
    """Bytes in place of `data`: random, `data` damaged, or hand-made wire damage. (Built per
    input, never as `sampled_from(inputs)`: hypothesis caches such strategies with their
    arguments, megabytes each.)"""
    return st.one_of(st.binary(max_size=200), damaged(data), st.sampled_from(CRAFTED))


def request_bytes(
    descriptor: Descriptor, hints: Hints, now: datetime
) -> st.SearchStrategy[tuple[bool, bytes]]:
    """(raw, bytes): a structured request serialised (raw False), or raw bytes (raw True),
    one in four."""
    valid = message(descriptor, hints, now).map(lambda m: m.SerializeToString())
    return _weighted(valid.map(lambda b: (False, b)), valid.flatmap(raw).map(lambda b: (True, b)))


def ingest_stream(hints: Hints, now: datetime) -> st.SearchStrategy[tuple[bool, list[bytes]]]:
    """(raw, requests) for one Ingest.Stream call: 1-4 requests, half of the streams without
    hostile values, mostly well-formed (one item or a batch, seqs increasing), or raw bytes in
    their place one stream in four."""
    requests = st.one_of(
        *(
            st.lists(message(pb.IngestRequest.DESCRIPTOR, hints, now, hostile=h), max_size=4)
            for h in (False, True)
        )
    )
    return _stream(requests.filter(bool))


@st.composite
def _stream(
    draw: st.DrawFn, requests_of: st.SearchStrategy[list[Message]]
) -> tuple[bool, list[bytes]]:
    requests: list[Any] = draw(requests_of)
    if draw(st.sampled_from((True, True, True, False))):  # one item or a batch, seqs from 1 up
        seq = draw(st.sampled_from((1, 1, 1, 2**64 - 3)))
        for request in requests:
            if request.items:
                request.ClearField("item")
            request.seq = min(seq, 2**64 - 1)  # numbered from near the top: past it
            seq += max(1, len(request.items))
    encoded = [r.SerializeToString() for r in requests]
    if draw(st.sampled_from((True, True, True, False))):
        return False, encoded
    damage = [
        draw(raw(encoded[draw(st.integers(0, len(encoded) - 1))]))
        for _ in range(draw(st.integers(1, 3)))
    ]
    return True, [*encoded[: draw(st.integers(0, len(encoded)))], *damage]


# ------------------------------------------------------------------ MQTT

# A topic level MQTT allows and every broker accepts: no separators or wildcards, no control
# or unassigned characters (Mosquitto disconnects a client that publishes those).
_LEVEL = st.text(
    st.characters(exclude_categories=("Cs", "Cc", "Cn"), exclude_characters="/+#"),
    max_size=20,
)
_NUMBERS = st.one_of(
    st.floats(),
    st.integers(-(2**70), 2**70),
    st.sampled_from((0, -0.0, 1e308, 5e-324, 2**63, 2**64, 10**400)),
)
_JSON_SCALARS = st.one_of(st.none(), st.booleans(), _NUMBERS, st.text(_CHARS, max_size=20))
_JSON = st.recursive(
    _JSON_SCALARS,
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(_CHARS, max_size=10), kids),
    max_leaves=12,
)
_OFFSETS = st.timedeltas(
    min_value=timedelta(hours=-23, minutes=-59), max_value=timedelta(hours=23, minutes=59)
).map(timezone)
_ANY_TIME = st.datetimes(
    min_value=datetime(1, 1, 1), max_value=datetime(9999, 12, 31), timezones=_OFFSETS
)


def _times(now: datetime) -> st.SearchStrategy[Any]:
    """A reading's "ts": mostly a recent epoch time, else anything a sensor could send."""
    recent = st.floats(now.timestamp() - 3600, now.timestamp())
    return _weighted(
        recent,
        st.one_of(
            _NUMBERS,
            _ANY_TIME.map(lambda at: at.isoformat()),
            st.text(_CHARS, max_size=30),
            _JSON,
        ),
    )


def _records(now: datetime) -> st.SearchStrategy[Any]:
    record = st.fixed_dictionaries(
        {"ts": _times(now)},
        optional={
            "value": _NUMBERS,
            "a": _NUMBERS,
            "b": _weighted(_NUMBERS, _JSON),
            "sym": st.text(_CHARS, max_size=8),
        },
    )
    extra = st.dictionaries(st.text(_CHARS, max_size=30), _JSON, max_size=3)
    return st.one_of(
        record,
        st.tuples(record, extra).map(lambda t: {**t[1], **t[0]}),
        st.lists(record, max_size=5),
        _NUMBERS,
        _JSON,
    )


def _json_payloads(now: datetime) -> st.SearchStrategy[bytes]:
    valid = _records(now).map(lambda doc: json.dumps(doc, allow_nan=True).encode())
    nested = st.integers(1, 20_000).map(lambda n: b"[" * n + b"]" * n)
    return st.one_of(_weighted(valid, valid.flatmap(raw)), nested)


def _cbor_values(now: datetime) -> st.SearchStrategy[Any]:
    tagged = st.builds(cbor2.CBORTag, st.integers(0, 2**64 - 1), _JSON)
    return st.one_of(
        _records(now),
        st.dictionaries(st.text(_CHARS, max_size=8), st.one_of(_NUMBERS, tagged), max_size=4),
        st.fixed_dictionaries({"ts": _ANY_TIME}, optional={"value": _NUMBERS}),
        tagged,
    )


def _cbor_payloads(now: datetime) -> st.SearchStrategy[bytes]:
    valid = _cbor_values(now).map(_cbor_or_empty)
    return _weighted(valid, valid.flatmap(raw))


def _cbor_or_empty(value: Any) -> bytes:
    """cbor2 refuses to encode a few values (integers beyond 2^64 as tags): send nothing."""
    try:
        return bytes(cbor2.dumps(value))
    except (cbor2.CBOREncodeError, OverflowError, ValueError):
        return b""


FRAME = struct.Struct("<dff")


def _frame_payloads(now: datetime) -> st.SearchStrategy[bytes]:
    frame = st.tuples(
        _weighted(st.floats(now.timestamp() - 3600, now.timestamp()), st.floats()),
        st.floats(width=32),
        st.floats(width=32),
    )
    valid = st.lists(frame, min_size=1, max_size=8).map(
        lambda frames: b"".join(FRAME.pack(*f) for f in frames)
    )
    return _weighted(valid, valid.flatmap(raw))


def mqtt_messages(now: datetime, components: Sequence[str]) -> st.SearchStrategy[tuple[str, bytes]]:
    """(topic, payload) on one of `bench.fuzz.MAPPINGS`' topics."""
    json_payloads = _json_payloads(now)
    return st.one_of(
        st.tuples(_LEVEL.map("fz/j/{}".format), json_payloads),
        st.tuples(_LEVEL.map("fz/c/{}".format), _cbor_payloads(now)),
        st.tuples(st.just("fz/f"), _frame_payloads(now)),
        st.tuples(
            _weighted(st.sampled_from(components), _LEVEL).map("fz/k/{}/raw".format),
            json_payloads,
        ),
        st.tuples(st.just("fz/ms"), json_payloads),
    )


# ------------------------------------------------------------------ system specs

_YAML_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(),
    st.text(_CHARS, max_size=30),
    st.dates(),
    st.binary(max_size=10),
)
_YAML = st.recursive(
    _YAML_SCALARS,
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(_CHARS, max_size=10), kids),
    max_leaves=10,
)
# Text no tree mutation produces: tags, merge keys, anchors, odd scalars and documents.
_YAML_SNIPPETS = (
    "!!python/object/apply:os.system ['true']",
    "!!binary AAEC",
    "!!set {a, b}",
    "!!omap [a: 1]",
    "!!timestamp 2001-12-14t21:59:43.10-05:00",
    "&x {a: 1}",
    "*undefined",
    "{<<: {a: 1}, b: 2}",
    "[*x, *x]",
    ".nan",
    "-.inf",
    "0x7fffffffffffffffffff",
    "\t",
    "---\n---",
    "...",
    "? complex\n: key",
    "|\n  block",
    "'unterminated",
    '"\\ud800"',
    "\ufeffbom",
    "\x00",
    "%YAML 1.1",
)


def _paths(tree: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path to a value of the tree (dict keys and list indexes)."""
    paths = [prefix] if prefix else []
    if isinstance(tree, dict):
        for key, value in tree.items():
            paths.extend(_paths(value, (*prefix, key)))
    elif isinstance(tree, list):
        for i, value in enumerate(tree):
            paths.extend(_paths(value, (*prefix, i)))
    return paths


def _mutate(tree: Any, path: tuple[Any, ...], change: Callable[[Any, Any], None]) -> None:
    parent = tree
    for step in path[:-1]:
        parent = parent[step]
    change(parent, path[-1])


@st.composite
def _tree_mutation(draw: st.DrawFn, base: dict[str, Any]) -> str:
    tree = copy.deepcopy(base)
    paths = _paths(base)
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(paths))
        try:  # still there after earlier mutations?
            _mutate(tree, path, lambda parent, key: parent[key])
        except (KeyError, IndexError, TypeError):
            continue
        action = draw(st.sampled_from(("replace", "replace", "delete", "add")))
        if action == "replace":
            _mutate(tree, path, partial(_set, draw(_YAML)))
        elif action == "delete":
            _mutate(tree, path, lambda parent, key: parent.__delitem__(key))
        else:
            extra = draw(st.text(_CHARS, min_size=1, max_size=10)), draw(_YAML)
            _mutate(tree, path, partial(_add, extra))
    return yaml.safe_dump(tree, sort_keys=False, allow_unicode=True)


def _set(value: Any, parent: Any, key: Any) -> None:
    parent[key] = value


def _add(extra: tuple[str, Any], parent: Any, key: Any) -> None:
    if isinstance(parent[key], dict):
        parent[key][extra[0]] = extra[1]
    elif isinstance(parent[key], list):
        parent[key].append(extra[1])


@st.composite
def _text_mutation(draw: st.DrawFn, base_text: str) -> str:
    text = base_text
    for _ in range(draw(st.integers(1, 3))):
        at = draw(st.integers(0, len(text)))
        action = draw(st.sampled_from(("insert", "delete", "snippet", "duplicate_line")))
        if action == "insert":
            text = text[:at] + draw(st.text(_CHARS, min_size=1, max_size=10)) + text[at:]
        elif action == "delete":
            text = text[:at] + text[at + draw(st.integers(1, 40)) :]
        elif action == "snippet":
            text = text[:at] + draw(st.sampled_from(_YAML_SNIPPETS)) + text[at:]
        else:
            lines = text.splitlines(keepends=True)
            line = draw(st.integers(0, len(lines) - 1))
            text = "".join([*lines[: line + 1], lines[line], *lines[line + 1 :]])
    return text


def alias_bomb(width: int, depth: int, indent: int) -> str:
    """Block mapping lines (at `indent`) whose last key refers `width` times to the one before,
    `depth` times over: a few hundred bytes of YAML that stand for width**depth values once
    expanded."""
    pad = " " * indent
    lines = [f"{pad}l0: &l0 [{', '.join(['x'] * width)}]"]
    for level in range(1, depth):
        lines.append(f"{pad}l{level}: &l{level} [{', '.join([f'*l{level - 1}'] * width)}]")
    return "\n".join(lines) + "\n"


@st.composite
def _nasty(draw: st.DrawFn, base_text: str) -> str:
    kind = draw(st.sampled_from(("bomb", "deep", "cycle")))
    if kind == "bomb":
        # At most about 5 million values: enough to show a cost, not to take the machine.
        width = draw(st.integers(2, 12))
        depth = draw(st.integers(2, 30))
        while width**depth > 5_000_000:
            depth -= 1
        if draw(st.booleans()):  # where pydantic refuses it as an unknown field
            return f"{base_text}bomb:\n{alias_bomb(width, depth, 2)}"
        # Where any value is taken (an input's hwbridge settings, checked later).
        return base_text.replace(
            "  mqtt:\n", f"  mqtt:\n    junk:\n{alias_bomb(width, depth, 6)}", 1
        )
    if kind == "deep":
        n = draw(st.integers(1, 20_000))
        opener, closer = draw(st.sampled_from((("[", "]"), ("{a: ", "}"), ("- ", ""))))
        if opener == "- ":
            nested = "".join(f"\n{'  ' * i}- " for i in range(min(n, 2_000))) + "x"
        else:
            nested = opener * n + "1" + closer * n
        return f"{base_text}deep: {nested}\n"
    cycle = draw(st.sampled_from(("&a [*a]", "&a {x: *a}", "&a {<<: *a}", "&a [&b [*a, *b]]")))
    return base_text.replace("  mqtt:\n", f"  mqtt:\n    junk: {cycle}\n", 1)


def spec_texts(base: dict[str, Any]) -> st.SearchStrategy[str]:
    """YAML text of a system spec: the valid `base` with its tree mutated, its text edited, or
    YAML's own hazards (alias bombs, deep nesting, cycles) added."""
    base_text = yaml.safe_dump(base, sort_keys=False, allow_unicode=True)
    return st.one_of(
        _tree_mutation(base),
        _text_mutation(base_text),
        _nasty(base_text),
        st.text(_CHARS, max_size=200),
    )
