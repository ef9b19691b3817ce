"""Answers to poirotd's JSON schemas, for checking the engines that enforce them: hypothesis
draws answers that satisfy a schema (`answers`), and `near_misses` breaks one of them in every
way the schema forbids, one place at a time.

Both walk exactly the schema subset poirotd writes (poirotd/protocol/schemas.py) and refuse any
other keyword, so a schema that grows a new feature fails here until the checks learn it, rather
than being generated from as if the feature were not there. (hypothesis-jsonschema would do the
drawing, but its last release, 0.23.1, does not run with this project's hypothesis.)
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterator
from typing import Any

from hypothesis import strategies as st

KNOWN = frozenset(
    {
        "type", "properties", "required", "additionalProperties", "items", "prefixItems",
        "minItems", "maxItems", "enum", "const", "anyOf", "minLength", "maxLength", "pattern",
        "title", "description",
    }
)  # fmt: skip
# What a model writes in free text: assigned characters (letters, marks, numbers, punctuation,
# symbols, spaces, format characters) in every plane, plus newline and tab. Left out: control
# characters (llguidance refuses an unescaped DEL), surrogates, private use and unassigned code
# points (the embedded tokenizer cannot even spell those of planes 4 to 15).
_WRITTEN = st.characters(exclude_categories=("Cc", "Cs", "Co", "Cn"), include_characters="\n\t")
# Characters JSON must escape inside a string: the quote, the backslash and control characters.
_ESCAPED = {'"', "\\", *map(chr, range(0x20))}


class UnknownKeywordError(ValueError):
    """The schema uses a keyword these generators do not know."""


def _check(schema: dict[str, Any]) -> None:
    unknown = sorted(set(schema) - KNOWN)
    if unknown:
        raise UnknownKeywordError(
            f"schema keywords {unknown} are not handled by tests/support/json_answers.py"
        )


def _branches(schema: dict[str, Any]) -> list[dict[str, Any]]:
    """anyOf's branches, each with the keywords beside anyOf merged in (vLLM's tool schema puts
    "type": "object" next to its anyOf)."""
    siblings = {k: v for k, v in schema.items() if k != "anyOf"}
    return [siblings | branch for branch in schema["anyOf"]]


def answers(schema: dict[str, Any]) -> st.SearchStrategy[Any]:
    """Values satisfying `schema`."""
    _check(schema)
    if "const" in schema:
        return st.just(schema["const"])
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    if "anyOf" in schema:
        return st.one_of([answers(b) for b in _branches(schema)])
    kind = schema.get("type")
    if kind == "object":
        properties = schema.get("properties", {})
        required = set(schema.get("required", ()))
        # Keys in the schema's order, which both engines hold a model to.
        return st.fixed_dictionaries(
            {k: answers(v) for k, v in properties.items() if k in required},
            optional={k: answers(v) for k, v in properties.items() if k not in required},
        ).map(lambda drawn: {k: drawn[k] for k in properties if k in drawn})
    if kind == "array":
        return _arrays(schema)
    if kind == "string":
        least, most = schema.get("minLength", 0), schema.get("maxLength")
        if "pattern" in schema:
            return st.from_regex(schema["pattern"], fullmatch=True).filter(
                lambda s: least <= len(s) and (most is None or len(s) <= most)
            )
        return st.text(_WRITTEN, min_size=least, max_size=most if most is not None else 40)
    if kind == "integer":
        return st.integers(min_value=-(2**40), max_value=2**40)
    if kind == "number":
        return st.floats(allow_nan=False, allow_infinity=False) | st.integers(-1000, 1000)
    if kind == "boolean":
        return st.booleans()
    if kind == "null":
        return st.none()
    raise UnknownKeywordError(f"schema without a type these generators know: {schema}")


def _arrays(schema: dict[str, Any]) -> st.SearchStrategy[list[Any]]:
    prefix = [answers(s) for s in schema.get("prefixItems", [])]
    items = schema.get("items", True)
    least, most = schema.get("minItems", 0), schema.get("maxItems")
    head = st.tuples(*prefix).map(list)
    if items is False or most == len(prefix):
        return head
    if not isinstance(items, dict):
        raise UnknownKeywordError("arrays with items other than a schema or false")
    tail = st.lists(
        answers(items),
        min_size=max(least - len(prefix), 0),
        max_size=(most - len(prefix)) if most is not None else 4,
    )
    return st.tuples(head, tail).map(lambda parts: parts[0] + parts[1])


def plain(value: Any) -> Any:
    """`value` with every character a JSON string must escape replaced by a space: xgrammar
    0.1.21 lets no escape sequence into a string with a maxLength (docs/vllm-grammars.md)."""
    if isinstance(value, str):
        return "".join(" " if c in _ESCAPED else c for c in value)
    if isinstance(value, list):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    return value


def texts(value: Any, floats: str = "") -> list[str]:
    """`value` as a model may write it: compact, spaced as json.dumps does, and indented. Each
    engine lets a model write an enum's number in one spelling only (ECHO's and ErrorProbe's
    levels are such an enum), so fractions are spelled as the engine does: `floats` is a format
    ("" for the shortest spelling, llguidance's; ".17g" for xgrammar's 0.90000000000000002), and
    a whole float is written as the integer it is (1.0 as 1) by both."""
    value = _whole(value)
    spelled: list[str] = []

    def mark(v: Any) -> Any:
        if isinstance(v, float) and floats:
            spelled.append(format(v, floats))
            return f"\0{len(spelled) - 1}\0"
        if isinstance(v, list):
            return [mark(x) for x in v]
        if isinstance(v, dict):
            return {k: mark(x) for k, x in v.items()}
        return v

    marked = mark(value)
    layouts = [
        json.dumps(marked, ensure_ascii=False, separators=(",", ":")),
        json.dumps(marked, ensure_ascii=False),
        json.dumps(marked, ensure_ascii=False, indent=2),
    ]
    return [_MARK.sub(lambda m: spelled[int(m[1])], text) for text in layouts]


# A float's place in the text while `texts` lays it out (NUL cannot occur unescaped in JSON).
_MARK = re.compile(r'"\\u0000(\d+)\\u0000"')


def _whole(value: Any) -> Any:
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return int(value)
    if isinstance(value, list):
        return [_whole(v) for v in value]
    if isinstance(value, dict):
        return {k: _whole(v) for k, v in value.items()}
    return value


# ------------------------------------------------------------------ near misses


def near_misses(schema: dict[str, Any], value: Any) -> Iterator[tuple[str, Any]]:
    """(what was broken, where) and the value broken there, for each way `schema` forbids:
    a required property dropped, an unknown one added, an item too many or too few, a value
    outside its enum or const, a string one character too long or off its pattern, a value of
    the wrong type. Each is exactly one step outside the schema."""
    yield from _misses(schema, value, "$")


def _misses(schema: dict[str, Any], value: Any, where: str) -> Iterator[tuple[str, Any]]:
    if "anyOf" in schema:
        branch = next(b for b in _branches(schema) if _fits(b, value))
        yield from _misses(branch, value, where)
        return
    if "const" in schema or "enum" in schema:
        allowed = [schema["const"]] if "const" in schema else schema["enum"]
        yield f"{where}: outside its enum", _outside(allowed)
        return
    kind = schema.get("type")
    if kind == "object":
        properties = schema.get("properties", {})
        for key in schema.get("required", ()):
            yield f"{where}: {key} dropped", {k: v for k, v in value.items() if k != key}
        if schema.get("additionalProperties") is False:
            yield f"{where}: an unknown property", value | {"unexpected": 1}
        for key, sub in properties.items():
            if key in value:
                for what, broken in _misses(sub, value[key], f"{where}.{key}"):
                    yield what, value | {key: broken}
        yield f"{where}: a list instead of an object", [value]
    elif kind == "array":
        yield from _array_misses(schema, value, where)
    elif kind == "string":
        most = schema.get("maxLength")
        if most is not None:
            yield f"{where}: {most + 1} characters", (value + "x" * (most + 1))[: most + 1]
        if "pattern" in schema:
            yield f"{where}: off its pattern", "Not A Slug!"
        yield f"{where}: a number instead of a string", 7
    elif kind in ("integer", "number"):
        yield f"{where}: a string instead of a number", "7"
        if kind == "integer":
            yield f"{where}: a fraction", 1.5
    elif kind == "boolean":
        yield f"{where}: a string instead of a boolean", "true"
    elif kind == "null":
        yield f"{where}: a number instead of null", 0


def _array_misses(
    schema: dict[str, Any], value: list[Any], where: str
) -> Iterator[tuple[str, Any]]:
    prefix = schema.get("prefixItems", [])
    items = schema.get("items", True)
    most = len(prefix) if items is False else schema.get("maxItems")
    least = max(schema.get("minItems", 0), len(prefix))
    if most is not None and len(value) == most:
        extra = value[-1] if value else (_any_of(items) if isinstance(items, dict) else 0)
        yield f"{where}: {most + 1} items", [*value, copy.deepcopy(extra)]
    if len(value) == least and least > 0:
        yield f"{where}: {least - 1} items", value[:-1]
    # The first item and the last checked in depth: enough to reach every item schema.
    for i in sorted({0, len(value) - 1} & set(range(len(value)))):
        sub = prefix[i] if i < len(prefix) else items
        if isinstance(sub, dict):
            for what, broken in _misses(sub, value[i], f"{where}[{i}]"):
                yield what, [*value[:i], broken, *value[i + 1 :]]
    yield f"{where}: an object instead of a list", {"items": value}


def _any_of(schema: dict[str, Any]) -> Any:
    """Some value of `schema`, for an item added past maxItems."""
    if "const" in schema:
        return schema["const"]
    if "enum" in schema:
        return schema["enum"][0]
    if "anyOf" in schema:
        return _any_of(_branches(schema)[0])
    defaults: dict[str, Any] = {"string": "", "integer": 0, "number": 0, "boolean": False}
    if schema.get("type") == "object":
        return {k: _any_of(v) for k, v in schema.get("properties", {}).items()}
    if schema.get("type") == "array":
        return [_any_of(s) for s in schema.get("prefixItems", [])]
    return defaults.get(schema.get("type", ""))


def _outside(allowed: list[Any]) -> Any:
    """A value of the same JSON type as the allowed ones, equal to none of them."""
    sample = allowed[0]
    if isinstance(sample, bool):
        return not sample if len(allowed) == 1 else None
    if isinstance(sample, int | float):
        return max(allowed) + 7
    if isinstance(sample, str):
        return "not_" + "_".join(str(a) for a in allowed[:2])
    return None


def _fits(schema: dict[str, Any], value: Any) -> bool:
    """Whether `value` was drawn from this anyOf branch (its consts match)."""
    if "const" in schema:
        return bool(value == schema["const"])
    if "enum" in schema:
        return value in schema["enum"]
    if schema.get("type") == "object":
        if not isinstance(value, dict):
            return False
        properties = schema.get("properties", {})
        return all(_fits(properties[k], v) for k, v in value.items() if k in properties) and set(
            value
        ) <= set(properties)
    if schema.get("type") == "null":
        return value is None
    if schema.get("type") == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    return True
