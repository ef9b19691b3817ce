"""Who a client is and whether it may make a call: bearer tokens and client-certificate names
mapped to roles by the access file, which is re-read when it changes.

The access file (YAML, or JSON) never holds a token, only its SHA-256 (`poirotd token new`
prints both):

    tokens:                      # sha256 hex of the token -> who holds it, what it may do
      9f86d081884c7d65...: {name: hwbridge, roles: [ingest]}
    certificates:                # a client certificate's subject alternative name -> ...
      spiffe://clinic.example/ns/mas/sa/control: {name: control, roles: [operator, reader]}
      dns:control.clinic.example: {name: control-software, roles: [operator]}

A certificate entry names a SAN and its type, and matches only a SAN of that type: `uri:<URI>`
is a URI SAN (a SPIFFE ID is one), `dns:<name>` a DNS SAN; without a prefix, an entry with a
scheme (`spiffe://...`, `https://...`) is a URI SAN and a host name is a DNS SAN. The subject's
common name and the other SAN types (email, IP) are never read: a certificate the CA signed for
a laptop's DNS name must not pass as a workload because its CN or an email SAN spells that
workload's SPIFFE ID.

Without an access file but with a client CA, every certificate the CA signed holds every role
(the CA is then the whole policy, as with Mosquitto's `require_certificate` and no ACL).
"""

from __future__ import annotations

import enum
import hashlib
import ipaddress
import re
import secrets
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

import structlog
import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    field_validator,
)

from poirotd.errors import StartupError
from poirotd.transports.security.files import stamp
from poirotd.transports.security.roles import INCLUDED, Role

log = structlog.get_logger(__name__)

# How often, at most, the access file's stat is looked at (calls in between use the policy held).
_RECHECK_SECONDS = 1.0
_BEARER = "bearer "

TokenHash = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]
# An unprefixed entry with a scheme is a URI SAN; a URI after `uri:` needs only a scheme.
_URI_WITH_AUTHORITY = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://\S+$")
_URI = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:\S+$")
# A DNS SAN as certificates carry them: labels of letters, digits, - and _ (seen in the wild),
# an optional leading wildcard label.
_DNS_NAME = re.compile(
    r"^(\*\.)?[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?"
    r"(\.[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?)*\.?$"
)


def new_token() -> str:
    return secrets.token_urlsafe(32)


def token_hash(token: str) -> str:
    """What the access file keeps of a token."""
    return hashlib.sha256(token.encode()).hexdigest()


class DenialReason(enum.StrEnum):
    NO_CREDENTIALS = "no_credentials"  # neither a token nor a client certificate
    ACCESS_FILE_MISSING = "access_file_missing"  # nobody is admitted until the file is back
    MALFORMED_TOKEN = "malformed_token"  # an authorization value that is not "Bearer <token>"
    UNKNOWN_TOKEN = "unknown_token"
    UNKNOWN_CERTIFICATE = "unknown_certificate"  # signed by the CA, but no name of it is mapped
    MISSING_ROLE = "missing_role"
    CLOSED = "closed"  # a call no role grants (not in the roles table)

    @property
    def authenticated(self) -> bool:
        """The client is known but may not do this (PERMISSION_DENIED, else UNAUTHENTICATED)."""
        return self in (DenialReason.MISSING_ROLE, DenialReason.CLOSED)


class AccessDeniedError(Exception):
    """A refused call; the message names what is missing, never a credential."""

    def __init__(
        self, reason: DenialReason, message: str, *, identity: str = "", role: str = ""
    ) -> None:
        super().__init__(message)
        self.reason = reason
        self.identity = identity
        self.role = role


@dataclass(frozen=True)
class CertificateName:
    """One subject alternative name of a client certificate with its type: a URI SAN (a SPIFFE
    ID is one) or a DNS SAN, the only two an access file can grant to."""

    type: Literal["uri", "dns"]
    value: str

    @classmethod
    def of(cls, type_: Literal["uri", "dns"], value: str) -> CertificateName:
        """DNS names compare case-insensitively; URIs (SPIFFE IDs) exactly."""
        return cls(type_, value.lower().rstrip(".") if type_ == "dns" else value)

    def __str__(self) -> str:
        return f"{self.type}:{self.value}"


def certificate_entry(entry: str) -> CertificateName:
    """The SAN an access-file `certificates` key names: `uri:<URI>`, `dns:<name>`, or without a
    prefix a URI with a scheme (`spiffe://...`) or a DNS name. Raises ValueError otherwise, with
    a message that does not repeat the entry (a secret pasted in the wrong place stays out of
    the log): the caller says which entry."""
    type_, _, value = entry.partition(":")
    if type_ == "uri" and _URI.match(value):
        return CertificateName.of("uri", value)
    if type_ == "dns" and _DNS_NAME.match(value):
        return CertificateName.of("dns", value)
    if type_ in ("uri", "dns"):
        raise ValueError(f"is not a {type_.upper()} name after its '{type_}:' prefix")
    if _URI_WITH_AUTHORITY.match(entry):
        return CertificateName.of("uri", entry)
    if _DNS_NAME.match(entry) and not _is_ip_address(entry):
        return CertificateName.of("dns", entry)
    raise ValueError(
        "is neither a URI (scheme://...) nor a DNS name: certificates are matched by their URI "
        "or DNS subject alternative names only, never by common name, email or IP (write "
        "'uri:<URI>' or 'dns:<name>')"
    )


def _is_ip_address(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


@dataclass(frozen=True)
class ClientCertificate:
    """A verified client certificate as the access check reads it: its URI SANs, then its DNS
    SANs, each in certificate order (a workload's SPIFFE ID before a host name); nothing else
    of it (subject, email or IP SANs)."""

    names: tuple[CertificateName, ...]

    @classmethod
    def of(cls, uris: Iterable[str], dns_names: Iterable[str]) -> ClientCertificate:
        return cls(
            (
                *(CertificateName.of("uri", u) for u in uris),
                *(CertificateName.of("dns", d) for d in dns_names),
            )
        )

    @property
    def display(self) -> str:
        """Its first name, for logs and denials."""
        return str(self.names[0]) if self.names else "(a certificate without URI or DNS names)"


class Grant(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(min_length=1, max_length=128)
    roles: frozenset[Role] = Field(min_length=1)


class AccessFile(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    tokens: dict[TokenHash, Grant] = Field(default_factory=dict)
    # Keys as written; `certificate_grants` reads them as typed names.
    certificates: dict[str, Grant] = Field(default_factory=dict)

    @field_validator("certificates")
    @classmethod
    def _entries_name_one_san_each(cls, certificates: dict[str, Grant]) -> dict[str, Grant]:
        seen: dict[CertificateName, int] = {}
        for n, entry in enumerate(certificates, 1):
            try:
                name = certificate_entry(entry)
            except ValueError as exc:
                raise ValueError(f"entry {n} of certificates: its key {exc}") from None
            if name in seen:
                raise ValueError(
                    f"entries {seen[name]} and {n} of certificates both name the same SAN"
                )
            seen[name] = n
        return certificates

    def certificate_grants(self) -> dict[CertificateName, Grant]:
        return {certificate_entry(entry): grant for entry, grant in self.certificates.items()}


class AccessFileError(StartupError, ValueError):
    """The access file cannot be read or is not valid; the message says where."""


class AccessFileMissingError(AccessFileError):
    """The access file is not there (deleted, or its folder not mounted)."""


def load_access_file(path: Path) -> AccessFile:
    """The file, checked. An error names where the problem is by position ("entry 3 of
    tokens"), never by a key or a value of the file: a token pasted as a key, or a secret in the
    wrong place, must not reach the log. For the same reason it is raised outside the handler
    that caught its cause, so it carries no cause or context (a YAML or pydantic error's text
    quotes the input)."""
    error: AccessFileError
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        error = AccessFileMissingError(f"access file {path} is missing")
    except OSError as exc:
        error = AccessFileError(f"cannot read access file {path}: {exc.strerror or exc}")
    except yaml.YAMLError as exc:
        error = AccessFileError(f"access file {path} is not YAML or JSON{_at(exc)}")
    else:
        try:
            return AccessFile.model_validate(data or {})
        except ValidationError as exc:
            problems = "; ".join(
                _problem(e["loc"], e["type"], e["msg"], data) for e in exc.errors()
            )
            error = AccessFileError(f"access file {path}: {problems}")
    raise error


def _at(exc: yaml.YAMLError) -> str:
    """Where a YAML error is and what it is, without the quoted line."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or "unreadable"
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    return f"{where}: {problem}"


# The access file's own field names: the only keys an error may name.
_FIELDS = frozenset({*AccessFile.model_fields, *Grant.model_fields})


def _problem(loc: tuple[int | str, ...], kind: str, message: str, data: object) -> str:
    """One validation error as "entry 3 of tokens, roles, item 1: <message>"; a key that is not
    one of the file's field names is told by its position. A validator's own message
    (ValueError) already says where."""
    if kind == "value_error":
        return message.removeprefix("Value error, ")
    where: list[str] = []
    node: object = data
    for part in loc:
        if part == "[key]":
            where.append("its key")
            continue
        if isinstance(part, str) and part in _FIELDS:
            where.append(part)
        elif isinstance(node, dict):
            keys = list(node)
            n = f" {keys.index(part) + 1}" if part in keys else ""
            if where and where[-1] in AccessFile.model_fields:
                where[-1] = f"entry{n} of {where[-1]}"
            else:
                where.append(f"key{n}" if where else f"key{n} of the file")
        else:
            where.append(f"item {int(part) + 1}" if isinstance(part, int) else "an item")
        node = _child(node, part)
    return f"{', '.join(where) or 'the file'}: {message}"


def _child(node: object, part: int | str) -> object:
    if isinstance(node, dict):
        return node.get(part)
    if isinstance(node, list) and isinstance(part, int) and part < len(node):
        return node[part]
    return None


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
            raise AccessDeniedError(
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
        self._certificates = grants.certificate_grants() if grants else {}

    def identify(
        self, authorization: str | None, certificate: ClientCertificate | None
    ) -> Identity:
        """The client behind a call: its bearer token when it sent one (which must then be
        known), else its certificate's first name the access file maps (None: it presented
        none)."""
        grants = self._grants
        if grants is None:
            if certificate is not None:
                return Identity(certificate.display, frozenset(Role), "certificate")
            raise AccessDeniedError(DenialReason.NO_CREDENTIALS, "a client certificate is required")
        if authorization is not None:
            scheme, token = authorization[: len(_BEARER)], authorization[len(_BEARER) :].strip()
            if scheme.lower() != _BEARER or not token:
                raise AccessDeniedError(
                    DenialReason.MALFORMED_TOKEN,
                    "the authorization metadata must be 'Bearer <token>'",
                )
            grant = grants.tokens.get(token_hash(token))
            if grant is None:
                raise AccessDeniedError(DenialReason.UNKNOWN_TOKEN, "the bearer token is not known")
            return _identity(grant, "token")
        if certificate is not None:
            for name in certificate.names:
                if (grant := self._certificates.get(name)) is not None:
                    return _identity(grant, "certificate")
            raise AccessDeniedError(
                DenialReason.UNKNOWN_CERTIFICATE,
                "the client certificate's names are not in the access file (only its URI and "
                "DNS subject alternative names are read)",
                identity=certificate.display,
            )
        raise AccessDeniedError(
            DenialReason.NO_CREDENTIALS,
            "no credentials: send 'authorization: Bearer <token>' or a client certificate",
        )


class _Closed(AccessPolicy):
    """What is in force while the access file is missing: nobody is admitted. Keeping the last
    good policy would keep every client the operator meant to revoke by deleting the file."""

    def __init__(self) -> None:
        super().__init__(AccessFile())

    def identify(
        self, authorization: str | None, certificate: ClientCertificate | None
    ) -> Identity:
        raise AccessDeniedError(
            DenialReason.ACCESS_FILE_MISSING,
            "the daemon's access file is missing: no client is admitted until it is back",
        )


class AccessControl:
    """The policy in force: the access file's, re-read when the file changes (its stat is looked
    at no more than once a second). A change that does not load is logged and counted, and the
    policy before it stays; a file that is gone fails closed: every call is refused until it is
    back. `loaded` says whether the policy in force is the file as it is now."""

    def __init__(self, path: Path | None, on_reload: Callable[[str], None] | None = None) -> None:
        self._path = path
        self._on_reload = on_reload
        self._lock = threading.Lock()
        self._checked_at = time.monotonic()
        self._stamp = stamp((path,)) if path else ()
        self._policy = AccessPolicy(load_access_file(path) if path else None)
        self._loaded = True

    @property
    def uses_file(self) -> bool:
        return self._path is not None

    @property
    def loaded(self) -> bool:
        """True while the policy in force is the access file's current content (or no file is
        configured); looks at the file first, so a scrape notices a deletion without calls."""
        self.policy()
        return self._loaded

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
        except AccessFileMissingError as exc:
            self._policy, self._loaded, outcome = _Closed(), False, "missing"
            log.error(
                "access file is missing; every authenticated call is refused until it is back",
                error=str(exc),
            )
        except AccessFileError as exc:
            self._loaded, outcome = False, "error"
            log.error(
                "access file changed but cannot be used; the previous one stays", error=str(exc)
            )
        else:
            self._loaded, outcome = True, "ok"
            log.info("access file reloaded", path=str(path))
        if self._on_reload is not None:
            self._on_reload(outcome)
