"""Who a client is and whether it may make a call: bearer tokens and client-certificate names
mapped to roles by the access file, which is re-read when it changes.

The access file (YAML, or JSON) never holds a token, only its SHA-256 (`poirotd token new`
prints both):

    tokens:                      # sha256 hex of the token -> who holds it, what it may do
      9f86d081884c7d65...: {name: hwbridge, roles: [ingest]}
    certificates:                # a client certificate's SAN (DNS name, URI, SPIFFE ID) -> ...
      spiffe://clinic.example/ns/mas/sa/control: {name: control, roles: [operator, reader]}

Without an access file but with a client CA, every certificate the CA signed holds every role
(the CA is then the whole policy, as with Mosquitto's `require_certificate` and no ACL).
"""

from __future__ import annotations

import enum
import hashlib
import secrets
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

import structlog
import yaml
from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError

from poirotd.transports.security.files import stamp
from poirotd.transports.security.roles import INCLUDED, Role

log = structlog.get_logger(__name__)

# How often, at most, the access file's stat is looked at (calls in between use the policy held).
_RECHECK_SECONDS = 1.0
_BEARER = "bearer "

TokenHash = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]


def new_token() -> str:
    return secrets.token_urlsafe(32)


def token_hash(token: str) -> str:
    """What the access file keeps of a token."""
    return hashlib.sha256(token.encode()).hexdigest()


class DenialReason(enum.StrEnum):
    NO_CREDENTIALS = "no_credentials"  # neither a token nor a client certificate
    MALFORMED_TOKEN = "malformed_token"  # an authorization value that is not "Bearer <token>"
    UNKNOWN_TOKEN = "unknown_token"
    UNKNOWN_CERTIFICATE = "unknown_certificate"  # signed by the CA, but no name of it is mapped
    MISSING_ROLE = "missing_role"
    CLOSED = "closed"  # a call no role grants (not in the roles table)

    @property
    def authenticated(self) -> bool:
        """The client is known but may not do this (PERMISSION_DENIED, else UNAUTHENTICATED)."""
        return self in (DenialReason.MISSING_ROLE, DenialReason.CLOSED)


class Denied(Exception):
    """A refused call; the message names what is missing, never a credential."""

    def __init__(
        self, reason: DenialReason, message: str, *, identity: str = "", role: str = ""
    ) -> None:
        super().__init__(message)
        self.reason = reason
        self.identity = identity
        self.role = role


class Grant(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(min_length=1, max_length=128)
    roles: frozenset[Role] = Field(min_length=1)


class AccessFile(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    tokens: dict[TokenHash, Grant] = Field(default_factory=dict)
    certificates: dict[str, Grant] = Field(default_factory=dict)


class AccessFileError(ValueError):
    """The access file cannot be read or is not valid; the message says where."""


def load_access_file(path: Path) -> AccessFile:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
        return AccessFile.model_validate(data or {})
    except OSError as exc:
        raise AccessFileError(f"cannot read access file {path}: {exc.strerror or exc}") from exc
    except yaml.YAMLError as exc:
        raise AccessFileError(f"access file {path} is not YAML or JSON: {exc}") from exc
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(map(str, e['loc'])) or '(top)'}: {e['msg']}" for e in exc.errors()
        )
        raise AccessFileError(f"access file {path}: {problems}") from exc


@dataclass(frozen=True)
class Identity:
    """An authenticated client: its name in the access file (or its certificate's) and roles."""

    name: str
    roles: frozenset[Role]
    via: Literal["token", "certificate"]

    @property
    def qualified_name(self) -> str:
        """ "token:<name>" or "certificate:<name>": who it is and by which kind of credential
        (a client's count for limits, the scope of its idempotency keys)."""
        return f"{self.via}:{self.name}"

    def require(self, role: Role, call: str) -> None:
        if role not in self.roles:
            raise Denied(
                DenialReason.MISSING_ROLE,
                f"{self.name!r} may not call {call}: it needs the role {role.value!r}",
                identity=self.name,
                role=role.value,
            )


def _identity(grant: Grant, via: Literal["token", "certificate"]) -> Identity:
    roles = set(grant.roles)
    for role in grant.roles:
        roles |= INCLUDED.get(role, frozenset())
    return Identity(grant.name, frozenset(roles), via)


class AccessPolicy:
    """One version of the access file; None: every verified client certificate holds every
    role (a client CA alone)."""

    def __init__(self, grants: AccessFile | None) -> None:
        self._grants = grants

    def identify(self, authorization: str | None, certificate_names: Sequence[str]) -> Identity:
        """The client behind a call: its bearer token when it sent one (which must then be
        known), else its certificate's first name the access file maps. `certificate_names`:
        its SANs in certificate order, then its common name; empty without a certificate."""
        grants = self._grants
        if grants is None:
            if certificate_names:
                return Identity(certificate_names[0], frozenset(Role), "certificate")
            raise Denied(DenialReason.NO_CREDENTIALS, "a client certificate is required")
        if authorization is not None:
            scheme, token = authorization[: len(_BEARER)], authorization[len(_BEARER) :].strip()
            if scheme.lower() != _BEARER or not token:
                raise Denied(
                    DenialReason.MALFORMED_TOKEN,
                    "the authorization metadata must be 'Bearer <token>'",
                )
            grant = grants.tokens.get(token_hash(token))
            if grant is None:
                raise Denied(DenialReason.UNKNOWN_TOKEN, "the bearer token is not known")
            return _identity(grant, "token")
        for name in certificate_names:
            if (grant := grants.certificates.get(name)) is not None:
                return _identity(grant, "certificate")
        if certificate_names:
            raise Denied(
                DenialReason.UNKNOWN_CERTIFICATE,
                "the client certificate's names are not in the access file",
                identity=certificate_names[0],
            )
        raise Denied(
            DenialReason.NO_CREDENTIALS,
            "no credentials: send 'authorization: Bearer <token>' or a client certificate",
        )


class AccessControl:
    """The policy in force: the access file's, re-read when the file changes (its stat is looked
    at no more than once a second). A change that does not load is logged and counted, and the
    policy before it stays."""

    def __init__(self, path: Path | None, on_reload: Callable[[str], None] | None = None) -> None:
        self._path = path
        self._on_reload = on_reload
        self._lock = threading.Lock()
        self._checked_at = time.monotonic()
        self._stamp = stamp((path,)) if path else ()
        self._policy = AccessPolicy(load_access_file(path) if path else None)

    @property
    def uses_file(self) -> bool:
        return self._path is not None

    def policy(self) -> AccessPolicy:
        if self._path is None or time.monotonic() - self._checked_at < _RECHECK_SECONDS:
            return self._policy
        with self._lock:
            self._checked_at = time.monotonic()
            now = stamp((self._path,))
            if now != self._stamp:
                self._stamp = now
                self._reload(self._path)
            return self._policy

    def _reload(self, path: Path) -> None:
        try:
            self._policy = AccessPolicy(load_access_file(path))
        except AccessFileError as exc:
            log.error(
                "access file changed but cannot be used; the previous one stays", error=str(exc)
            )
            outcome = "error"
        else:
            log.info("access file reloaded", path=str(path))
            outcome = "ok"
        if self._on_reload is not None:
            self._on_reload(outcome)
