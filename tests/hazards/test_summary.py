"""The window summary shown to agents is short and carries the per-signal figures."""

from __future__ import annotations

import numpy as np

from poirotd.devtools.hazard_inputs import EXO, readings, series
from poirotd.hazards import summarise_window

SIGNALS = [
    "ankle_angle_deg",
    "knee_angle_deg",
    "hip_angle_deg",
    "pelvis_force_n",
    "cable_tension_n",
    "treadmill_speed_mps",
]


def test_six_signals_fit_in_600_characters() -> None:
    t = np.arange(0.0, 2.0, 0.01)
    samples = [
        s
        for k, name in enumerate(SIGNALS)
        for s in series(10 * np.sin(2 * np.pi * t + k) + 100 * k, signal=name, start=10.0)
    ]
    text = summarise_window(readings(*samples))
    assert len(text) <= 600, len(text)
    lines = text.splitlines()
    assert lines[0] == "telemetry from 2025-03-01T10:00:10.000+00:00 over 1.99 s:"
    assert lines[1] == f"{EXO}:"
    assert lines[2].startswith(" ankle_angle_deg n=200 t=0.00-1.99 min=-10 mean=")
    assert all(name in text for name in SIGNALS)


def test_figures_and_order() -> None:
    text = summarise_window(readings(*series([3.0, 1.0, 2.0], dt=0.5)[::-1]))  # newest first
    assert text.splitlines()[-1] == " ankle_angle_deg n=3 t=0.00-1.00 min=1 mean=2 max=3 last=2"


def test_many_signals_are_capped() -> None:
    samples = [s for name in SIGNALS for s in series([1.0], signal=name)]
    text = summarise_window(readings(*samples), max_signals=2)
    assert text.endswith("(+4 more signals)")
    assert "hip_angle_deg" not in text


def test_no_samples() -> None:
    assert summarise_window([]) == "telemetry: no samples"
