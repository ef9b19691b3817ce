"""The shared fixtures (tests/support/fixtures.py) are a plugin, so every folder sees them."""

from __future__ import annotations

import pytest

pytest_plugins = ["tests.support.fixtures"]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test marked slow states its own timeout: the default in pyproject.toml is sized for the
    others, and would fail a slow one that is merely slow."""
    untimed = [
        item.nodeid
        for item in items
        if item.get_closest_marker("slow") and not item.get_closest_marker("timeout")
    ]
    if untimed:
        raise pytest.UsageError(f"slow tests without @pytest.mark.timeout(...): {untimed}")
