"""Reading one benchmark file into its format's pydantic model, or an error a user can act on.

Each format a loader reads is a pydantic model; a file that does not fit it is refused with an
error that names the file, the first fields that are wrong and the shape the format expects, not
a bare `KeyError: 'system_prompt'` from deep inside a loader.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, ValidationError

ModelT = TypeVar("ModelT", bound=BaseModel)

_SHOWN_ERRORS = 3


class CaseFileError(ValueError):
    """A benchmark file that does not load; the message says where and what was expected."""


def read_record(path: Path, model: type[ModelT], expected: str) -> ModelT:
    """`path` parsed as `model`. Raises CaseFileError naming the file, each wrong field and
    `expected` (the format's shape in a line), or the position of a JSON syntax error."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise CaseFileError(f"{path}: no such file") from exc
    except UnicodeDecodeError as exc:
        raise CaseFileError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from exc
    try:
        return model.model_validate_json(text)
    except ValidationError as exc:
        if any(e["type"] == "json_invalid" for e in exc.errors()):
            raise CaseFileError(f"{path}: not valid JSON ({_json_problem(text)})") from exc
        raise CaseFileError(f"{path}: {describe(exc)}; expected {expected}") from exc


def describe(exc: ValidationError) -> str:
    """The first few errors as `field.path: message (got value)`."""
    errors = exc.errors(include_url=False)
    parts = []
    for e in errors[:_SHOWN_ERRORS]:
        where = ".".join(str(p) for p in e["loc"]) or "the file"
        got = "" if e["type"] == "missing" else f" (got {_short(e['input'])})"
        parts.append(f"{where}: {e['msg']}{got}")
    if len(errors) > _SHOWN_ERRORS:
        parts.append(f"and {len(errors) - _SHOWN_ERRORS} more")
    return "; ".join(parts)


def _short(value: object) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 60 else f"{text[:57]}..."


def _json_problem(text: str) -> str:
    try:
        json.loads(text)
    except json.JSONDecodeError as exc:
        return f"line {exc.lineno} column {exc.colno}: {exc.msg}"
    return "unreadable"
