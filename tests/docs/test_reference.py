"""The site's generated references (docs/reference/*.md) are what the code declares now: a setting,
spec field, RPC or metric added without regenerating them fails here, saying how to."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

GENERATOR = Path(__file__).resolve().parents[2] / "docs" / "tooling" / "reference.py"


def _generator() -> ModuleType:
    # docs/tooling is dev tooling, not a package: loaded from its file.
    spec = importlib.util.spec_from_file_location("docs_reference", GENERATOR)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_committed_reference_pages_are_a_fresh_generation() -> None:
    stale = _generator().stale_pages()
    assert stale == [], (
        f"docs/reference/{', '.join(stale)} differ from what the code declares: run "
        "`make docs-reference` and commit the result"
    )
