"""PostgreSQL URLs as the daemon and `poirotd audit` take them (POIROTD_DB_URL): checked before any
connection, and named in logs and errors without their password."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit, urlunsplit

SCHEMES = ("postgresql", "postgres")
_HIDDEN = "***"


def check_url(url: str) -> str:
    """The URL if it is a postgresql:// URL libpq can read, else ValueError saying why (the
    message never holds the password)."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number
    except ValueError as exc:
        raise ValueError(f"not a PostgreSQL URL ({exc}): {redacted(url)}") from None
    if parts.scheme not in SCHEMES:
        raise ValueError(f"a PostgreSQL URL starts with postgresql://, not {redacted(url)}")
    return url


def redacted(url: str) -> str:
    """The URL with its password (in the authority or as a `password` parameter) replaced."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "(an unreadable URL)"
    netloc = parts.netloc
    if parts.password is not None:
        user, _, host = netloc.rpartition("@")
        netloc = f"{user.partition(':')[0]}:{_HIDDEN}@{host}"
    query = urlencode(
        [(k, _HIDDEN if k == "password" else v) for k, v in parse_qsl(parts.query, True)]
    )
    return urlunsplit(parts._replace(netloc=netloc, query=query))


def scrubbed(text: str, url: str, password: str | None = None) -> str:
    """`text` (an error of libpq's, which quotes the URL's parts it cannot read, a password
    holding a raw `%` among them) with the URL's password, in its authority or its `password`
    parameter, raw or decoded, and `password` replaced."""
    try:
        parts = urlsplit(url)
    except ValueError:
        parts = None
    secrets = {password or "", parts.password or ""} if parts else {password or ""}
    for field in parts.query.split("&") if parts else ():
        name, _, value = field.partition("=")
        if unquote(name) == "password":
            secrets.add(value)
    for secret in sorted(secrets | {unquote(s) for s in secrets}, key=len, reverse=True):
        if secret:
            text = text.replace(secret, _HIDDEN)
    return text


def read_password(path: Path | None) -> str | None:
    """The password kept in a file (a mounted secret): its content without the final newline.
    OSError when it cannot be read."""
    if path is None:
        return None
    return path.read_text(encoding="utf-8").rstrip("\r\n")
