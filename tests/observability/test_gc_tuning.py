"""The daemon's collector setting, checked in a fresh interpreter (it is process-wide)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from pydantic import ValidationError

from poirotd.config import Settings
from poirotd.observability.gc_tuning import YOUNG_THRESHOLD

CHECK = """
import gc, sys
from poirotd.observability.gc_tuning import tune_for_daemon
before = gc.get_threshold()
tune_for_daemon(*map(int, sys.argv[1:]))
print(gc.get_freeze_count() > 0, gc.get_threshold()[0], gc.get_threshold()[1:] == before[1:])
"""


def tuned(*args: str) -> list[str]:
    return subprocess.run(
        [sys.executable, "-c", CHECK, *args], capture_output=True, text=True, check=True
    ).stdout.split()


def test_tuning_freezes_start_up_and_raises_the_young_threshold() -> None:
    assert tuned() == ["True", str(YOUNG_THRESHOLD), "True"]
    assert tuned("5000") == ["True", "5000", "True"]


def test_the_threshold_is_a_setting_and_never_below_cpythons_default() -> None:
    assert Settings().gc_young_threshold == YOUNG_THRESHOLD
    assert Settings(gc_young_threshold=5_000).gc_young_threshold == 5_000
    with pytest.raises(ValidationError):
        Settings(gc_young_threshold=10)
