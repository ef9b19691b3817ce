"""Compact text summary of a telemetry window, shown to the agents as hardware evidence.

The agents read it inside a prompt. It has to fit a small model's context next to the whole
session log, so it gives per-signal statistics and never lists the raw samples. Times are
seconds relative to the window's start, which is printed once in the header.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from poirotd.model import Reading


def _num(x: float) -> str:
    return f"{x:.4g}"


def summarise_window(readings: Iterable[Reading], *, max_signals: int = 8) -> str:
    """Per signal: sample count, time span, min, mean, max and last value.

    With ``max_signals`` 8 or fewer and ordinary names, this stays under about 100 characters per
    signal.
    """
    by_signal: dict[tuple[str, str], list[Reading]] = {}
    for r in readings:
        by_signal.setdefault((r.component, r.signal), []).append(r)
    if not by_signal:
        return "telemetry: no samples"
    start = min(s.measured_at for group in by_signal.values() for s in group)
    end = max(s.measured_at for group in by_signal.values() for s in group)
    span = (end - start).total_seconds()
    lines = [f"telemetry from {start.isoformat(timespec='milliseconds')} over {span:.2f} s:"]
    component = None
    for (comp, signal), group in list(by_signal.items())[:max_signals]:
        group.sort(key=lambda s: s.measured_at)
        values = np.fromiter((s.value for s in group), np.float64, len(group))
        first = (group[0].measured_at - start).total_seconds()
        last = (group[-1].measured_at - start).total_seconds()
        if comp != component:
            lines.append(f"{comp}:")
            component = comp
        lines.append(
            f" {signal} n={len(group)} t={first:.2f}-{last:.2f} min={_num(values.min())} "
            f"mean={_num(values.mean())} max={_num(values.max())} last={_num(values[-1])}"
        )
    hidden = len(by_signal) - max_signals
    if hidden > 0:
        lines.append(f"(+{hidden} more signals)")
    return "\n".join(lines)
