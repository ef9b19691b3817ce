"""Throughput of RuleEngine.observe_telemetry. A measurement script, not a test.

    .venv/bin/python -m bench.rules [--seconds 60] [--batch 1 --batch 100]

Eleven rules of mixed kinds watch three exoskeleton signals sampled at 100 Hz each. The script
reports samples/s at batch sizes 1 and 100 (or those given), and the per-call latency
percentiles. The samples are built before the clock starts, so only rule evaluation is timed;
one batch size per run lets a whole-process timer compare two versions at that size.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from poirotd.devtools.hazard_inputs import ANKLE, EXO, rule, series
from poirotd.hazards import RuleEngine, parse_rules
from poirotd.model import TelemetrySample

KNEE = "knee_torque_nm"
HIP = "hip_angle_deg"

RULES = [
    rule("threshold", "ankle_high", above=35, clear_above=30, for_samples=3),
    rule("range", "ankle_range", min=-40, max=40, hysteresis=2),
    rule("rate", "ankle_jump", max_rate_per_second=400),
    rule("zscore", "ankle_z", window_seconds=2, threshold=4, min_samples=50),
    rule("rolling_mean", "ankle_offset", window_seconds=2, above=5, below=-5, min_samples=100),
    rule("stale", "ankle_silent", timeout_seconds=1),
    rule("threshold", "knee_high", signal=KNEE, above=30, for_samples=3),
    rule("rate", "knee_jump", signal=KNEE, max_rate_per_second=2000),
    rule("zscore", "hip_z", signal=HIP, window_samples=50, threshold=4, min_samples=20),
    rule("agent_flag", "agent_flag"),
    rule("all", "ankle_and_knee", rules=["ankle_high", "knee_high"], within_seconds=1),
]


def workload(seconds: float) -> list[TelemetrySample]:
    """Three signals at 100 Hz, interleaved in time order like a bridge would deliver them."""
    t = np.arange(0.0, seconds, 0.01)
    rng = np.random.default_rng(0)
    signals = {
        ANKLE: 10 * np.sin(2 * np.pi * t) + rng.normal(0, 0.5, t.size),
        KNEE: 12 * np.sin(2 * np.pi * t + 1) + rng.normal(0, 1.0, t.size),
        HIP: 20 * np.sin(2 * np.pi * t + 2) + rng.normal(0, 0.5, t.size),
    }
    streams = [series(values, signal=name, component=EXO) for name, values in signals.items()]
    return [s for trio in zip(*streams, strict=True) for s in trio]


def measure(samples: list[TelemetrySample], batch: int) -> tuple[float, list[float]]:
    engine = RuleEngine(parse_rules(RULES))
    latencies: list[float] = []
    start = time.perf_counter()
    for i in range(0, len(samples), batch):
        t0 = time.perf_counter()
        engine.observe_telemetry(samples[i : i + batch])
        latencies.append(time.perf_counter() - t0)
    return len(samples) / (time.perf_counter() - start), latencies


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=60.0, help="simulated session length")
    parser.add_argument(
        "--batch", type=int, action="append", help="samples per call (repeat it; default 1, 100)"
    )
    args = parser.parse_args()
    samples = workload(args.seconds)
    print(f"{len(RULES)} rules, {len(samples)} samples (3 signals x 100 Hz x {args.seconds:g} s)")
    for batch in args.batch or (1, 100):
        rate, latencies = measure(samples, batch)
        p50, p99, worst = np.percentile(np.array(latencies) * 1e3, [50, 99, 100])
        print(
            f"batch {batch:>3}: {rate:>9,.0f} samples/s; per call p50 {p50:.3f} ms, "
            f"p99 {p99:.3f} ms, max {worst:.3f} ms"
        )


if __name__ == "__main__":
    main()
