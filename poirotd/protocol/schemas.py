"""What the answer formats of every method are made of: a JSON schema for constrained decoding
plus a parser, and the building blocks both are written with.

The schemas stay inside the subset llama.cpp's grammar converter handles (type, properties,
required, additionalProperties false, items, prefixItems, minItems/maxItems, enum, const, anyOf,
string minLength/maxLength/pattern), which vLLM's engines handle too (docs/vllm-grammars.md).
Every free string is bounded: a small model otherwise writes until its token limit and the JSON
never closes. Parsers re-check everything after decoding, because not every backend enforces
the schema, and raise `InvalidAnswerError` with a message short enough to hand back to the model
in a repair prompt. Each method's own formats live in its package (poirot/schemas.py,
echo/schemas.py, errorprobe/schemas.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from pydantic import ValidationError

from poirotd.llm.base import Completion
from poirotd.model import Frozen

T = TypeVar("T")

_SHOWN_ERRORS = 3


class InvalidAnswerError(ValueError):
    """The answer does not satisfy its format; the message says what is wrong."""


@dataclass(frozen=True)
class AnswerFormat(Generic[T]):
    """A schema to constrain decoding (None: free text) and the parser that re-checks the answer."""

    schema: dict[str, Any] | None
    parse: Callable[[str], T]

    def read(self, completion: Completion) -> T:
        return self.parse(completion.text)


# ------------------------------------------------------------------ building blocks


def json_object(**properties: dict[str, Any]) -> dict[str, Any]:
    """An object schema whose every property is required and nothing else is allowed."""
    return {
        "type": "object",
        "properties": properties,
        "required": list(properties),
        "additionalProperties": False,
    }


def bounded_text(max_length: int) -> dict[str, Any]:
    return {"type": "string", "maxLength": max_length}


ModelT = TypeVar("ModelT", bound=Frozen)


def validate_answer(model: type[ModelT], text: str) -> ModelT:
    """The answer's JSON object as `model`."""
    return validate_json(model.model_validate_json, text)


def validate_json(validate: Callable[[str], T], text: str) -> T:
    """The answer's JSON object through `validate` (a model's or a TypeAdapter's validate_json);
    what fails is an `InvalidAnswerError` naming the first few problems."""
    try:
        return validate(_json_object(text))
    except ValidationError as exc:
        raise InvalidAnswerError(_describe(exc)) from exc


def _json_object(text: str) -> str:
    """The outermost {...} of the answer: tolerates prose or code fences around the JSON."""
    start, end = text.find("{"), text.rfind("}")
    if start < 0 or end < start:
        raise InvalidAnswerError("the answer contains no JSON object")
    return text[start : end + 1]


def _describe(exc: ValidationError) -> str:
    errors = exc.errors(include_url=False)
    parts = [
        f"{'.'.join(str(p) for p in e['loc']) or 'answer'}: {e['msg']}"
        for e in errors[:_SHOWN_ERRORS]
    ]
    if len(errors) > _SHOWN_ERRORS:
        parts.append(f"and {len(errors) - _SHOWN_ERRORS} more")
    return "; ".join(parts)
