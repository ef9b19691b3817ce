"""Secrets named in a config, never written in it: a file (a mounted Kubernetes Secret, a
systemd credential) or an environment variable, read each time the secret is used.

Read at use, not at load: a rotated file is picked up by the next connection, and a config can be
checked on a machine that does not hold the secret. Errors name the file or the variable, never
the value.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator


class SecretError(ValueError):
    """A secret that cannot be read; the message names where it was looked for."""


def read_secret_file(path: Path) -> SecretStr:
    """The file's text without its final line break (``echo secret > file`` adds one)."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise SecretError(f"cannot read secret file {path}: {exc}") from None
    value = text.removesuffix("\n").removesuffix("\r")
    if not value:
        raise SecretError(f"secret file {path} is empty")
    return SecretStr(value)


class SecretRef(BaseModel):
    """``{file: PATH}`` or ``{env: NAME}``; a secret written in clear is refused."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    file: Path | None = None
    env: str | None = Field(default=None, min_length=1)

    @model_validator(mode="before")
    @classmethod
    def _not_in_clear(cls, data: Any) -> Any:
        if not isinstance(data, Mapping | SecretRef):
            raise ValueError(
                "a secret is not written in the config: give {file: PATH} (e.g. a mounted "
                "Secret) or {env: NAME} (an environment variable that holds it)"
            )
        return data

    @model_validator(mode="after")
    def _one_source(self) -> SecretRef:
        if (self.file is None) == (self.env is None):
            raise ValueError("give exactly one of file or env")
        return self

    def read(self, environ: Mapping[str, str] = os.environ) -> SecretStr:
        if self.file is not None:
            return read_secret_file(self.file)
        assert self.env is not None
        value = environ.get(self.env, "")
        if not value:
            raise SecretError(f"environment variable {self.env} is not set or empty")
        return SecretStr(value)
