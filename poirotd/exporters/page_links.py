"""The link from an exported attribution to its investigation's page: a base URL (where the
operator's page is served) and a path template with the record's fields in braces."""

from __future__ import annotations

import string
from dataclasses import dataclass
from urllib.parse import quote

from poirotd.model import Investigation

# The fields a path template may name.
FIELDS = ("investigation_id", "session_id", "system")
DEFAULT_PATH = "/investigations/{investigation_id}"


def template_problem(path: str) -> str:
    """Why `path` is not a usable template ("" if it is)."""
    try:
        named = [name for _, name, _, _ in string.Formatter().parse(path) if name is not None]
    except ValueError as exc:
        return f"{path!r} is not a template: {exc}"
    unknown = [name for name in named if name not in FIELDS]
    if unknown:
        return f"{path!r} names {unknown}; a template may name {list(FIELDS)}"
    return ""


@dataclass(frozen=True)
class PageLinks:
    base_url: str
    path: str = DEFAULT_PATH

    def url(self, record: Investigation) -> str:
        """The page of `record`, each field percent-encoded (an id may hold any character)."""
        fields = {name: quote(str(getattr(record, name)), safe="") for name in FIELDS}
        return self.base_url.rstrip("/") + "/" + self.path.format(**fields).lstrip("/")
