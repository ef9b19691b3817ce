"""The daemon's collector setting, checked in a fresh interpreter (it is process-wide)."""

from __future__ import annotations

import subprocess
import sys

from poirotd.collector import YOUNG_THRESHOLD

CHECK = """
import gc
from poirotd.collector import tune_for_daemon
before = gc.get_threshold()
tune_for_daemon()
print(gc.get_freeze_count() > 0, gc.get_threshold()[0], gc.get_threshold()[1:] == before[1:])
"""


def test_tuning_freezes_start_up_and_raises_the_young_threshold() -> None:
    out = subprocess.run(
        [sys.executable, "-c", CHECK], capture_output=True, text=True, check=True
    ).stdout.split()
    assert out == ["True", str(YOUNG_THRESHOLD), "True"]
