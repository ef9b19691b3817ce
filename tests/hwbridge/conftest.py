"""The bridge's tests forward to a daemon of the bridge's clinic (poirotd/devtools/clinic.py)."""

from __future__ import annotations

from typing import Any

import pytest

from poirotd.config import SystemSpec
from poirotd.devtools.clinic import BRIDGE_CLINIC


@pytest.fixture
def daemon_spec() -> SystemSpec:
    return BRIDGE_CLINIC


@pytest.fixture
def daemon_settings() -> dict[str, Any]:
    return {"drain_seconds": 0}
