"""The D2W simulator: clean gait is physiological; each injected fault shows in its signal only."""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from hwbridge import exo
from hwbridge.config import DeadLetterConfig, PipelineConfig, load_config
from hwbridge.deadletter import DeadLetterStore
from hwbridge.ingest import Delivery, TelemetryInput
from hwbridge.topics import Router
from poirotd.model import TelemetryBatch, TelemetrySample

EXAMPLE = Path(__file__).parents[2] / "hwbridge" / "bridge.example.yaml"
ORIGIN = datetime(2026, 1, 1, tzinfo=UTC)


def run(seconds: float, *faults: exo.FaultSpec, rate: float = 1500.0) -> dict[str, np.ndarray]:
    """Signal -> (n, 2) array of (seconds since start, value), from one simulated span."""
    config = exo.ExoSimConfig(rate_hz=rate, seed=7, faults=faults, score_interval_s=1.0)
    simulator = exo.ExoSimulator(config, origin=ORIGIN)
    series: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for sample in exo.samples(simulator.advance(seconds), "s", "d2w_exoskeleton"):
        series[sample.signal].append(((sample.measured_at - ORIGIN).total_seconds(), sample.value))
    return {name: np.array(points) for name, points in series.items()}


def window(series: np.ndarray, start: float, end: float) -> np.ndarray:
    values: np.ndarray = series[(series[:, 0] >= start) & (series[:, 0] < end), 1]
    return values


def test_clean_gait_is_physiological_at_the_configured_rate() -> None:
    clean = run(30.0)
    for name, spec in exo.SIGNALS.items():
        values = clean[name][:, 1]
        assert spec.low <= values.min() and values.max() <= spec.high, name
    frame_samples = sum(len(clean[s]) for c in exo.FRAME_CHANNELS for s in c.signals)
    assert frame_samples == pytest.approx(1500 * 30, rel=0.01)
    # ~1 Hz cadence: the gait phase wraps about once a second.
    phase = clean["gait_phase"][:, 1]
    assert 28 <= int(np.sum(np.diff(phase) < -0.5)) <= 32
    # Legs in anti-phase; knee flexion peaks in swing (about 60 deg).
    assert np.corrcoef(clean["hip_left_deg"][:, 1], clean["hip_right_deg"][:, 1])[0, 1] < -0.9
    assert 55 < clean["knee_right_deg"][:, 1].max() < 65
    assert 95 < clean["heart_rate_bpm"][:, 1].mean() < 115


def test_calibration_offset_shifts_the_mean_inside_its_window_only() -> None:
    fault = exo.FaultSpec(
        signal="ankle_left_deg", kind="offset", magnitude=8, start_s=4, duration_s=3
    )
    clean, faulty = run(10.0)["ankle_left_deg"], run(10.0, fault)["ankle_left_deg"]
    shift = faulty[:, 1] - clean[:, 1]
    assert np.allclose(window(np.column_stack([clean[:, 0], shift]), 4, 7), 8.0)
    assert np.allclose(window(np.column_stack([clean[:, 0], shift]), 0, 4), 0.0)
    assert np.allclose(window(np.column_stack([clean[:, 0], shift]), 7, 10), 0.0)


def test_sensor_x_reports_an_implausibly_low_proprioception_score() -> None:
    fault = exo.FaultSpec(signal="proprioception_score", kind="offset", magnitude=-4, start_s=2)
    scores = run(5.0, fault)["proprioception_score"]
    assert list(scores[:, 1]) == [6.0, 6.0, 2.0, 2.0, 2.0]


def test_stuck_value_has_zero_variance() -> None:
    fault = exo.FaultSpec(signal="knee_right_deg", kind="stuck", start_s=2, duration_s=5)
    knee = run(10.0, fault)["knee_right_deg"]
    assert np.var(window(knee, 2, 7)) == 0.0
    assert np.var(window(knee, 7, 10)) > 100.0


def test_dropout_removes_readings_and_spares_the_rest_of_the_frame() -> None:
    fault = exo.FaultSpec(signal="hip_left_deg", kind="dropout", start_s=3, duration_s=2)
    series = run(6.0, fault)
    assert len(window(series["hip_left_deg"], 3, 5)) == 0
    assert len(window(series["hip_left_deg"], 0, 3)) == 300
    assert len(window(series["hip_right_deg"], 3, 5)) == 200


def test_spikes_hit_about_the_configured_share_of_samples() -> None:
    fault = exo.FaultSpec(
        signal="traction_tension_n", kind="spikes", magnitude=40, probability=0.1, start_s=1
    )
    tension = run(11.0, fault)["traction_tension_n"]
    deviation = np.abs(window(tension, 1, 11) - 60.0)
    spikes = int(np.sum(deviation > 20))
    assert 60 <= spikes <= 140  # 10 % of 1000 samples
    assert np.all(np.abs(window(tension, 0, 1) - 60.0) < 20)


def test_drift_grows_linearly_from_its_start() -> None:
    fault = exo.FaultSpec(signal="pelvic_current_a", kind="drift", magnitude=0.5, start_s=2)
    clean, faulty = run(8.0)["pelvic_current_a"], run(8.0, fault)["pelvic_current_a"]
    t, shift = clean[:, 0], faulty[:, 1] - clean[:, 1]
    assert np.allclose(shift, np.where(t >= 2, 0.5 * (t - 2), 0.0))


def test_fault_specs_are_validated() -> None:
    with pytest.raises(ValidationError, match="unknown signal"):
        exo.FaultSpec(signal="elbow_deg", kind="stuck")
    with pytest.raises(ValidationError, match="non-zero magnitude"):
        exo.FaultSpec(signal="knee_left_deg", kind="offset")
    with pytest.raises(ValidationError):
        exo.ExoSimConfig(rate_hz=50_000)


def test_published_layout_round_trips_through_the_example_config() -> None:
    """What `simulate exo` publishes, the example bridge config decodes to the same samples."""
    config = load_config(EXAMPLE)
    assert config.mqtt is not None
    router = Router([m.route() for m in config.mqtt.mappings])
    dead_letters = DeadLetterStore(DeadLetterConfig(), log_interval_s=60)

    async def sink(samples: object) -> None:
        raise AssertionError("not called: decode only")

    pipeline = TelemetryInput(router, "s", sink, dead_letters, PipelineConfig())
    fault = exo.FaultSpec(
        signal="ankle_right_current_a", kind="dropout", start_s=0.5, duration_s=0.5
    )
    simulator = exo.ExoSimulator(
        exo.ExoSimConfig(rate_hz=1500, seed=3, faults=(fault,)), origin=ORIGIN
    )
    blocks = simulator.advance(2.0)
    decoded: list[TelemetrySample] = []
    for topic, payload in exo.messages(blocks, "p7"):
        readings = pipeline.decode(Delivery(topic, payload, ORIGIN, lambda: None))
        decoded += TelemetryBatch("s", readings).samples()
    assert pipeline.stats.undecodable == 0
    expected = exo.samples(blocks, "s", "d2w_exoskeleton")

    def key(s: TelemetrySample) -> tuple[str, datetime]:
        return s.signal, s.measured_at

    assert sorted(map(key, decoded)) == sorted(map(key, expected))
    values = {key(s): s.value for s in expected}
    # Frames carry float32: equal to about 7 significant digits.
    assert all(s.value == pytest.approx(values[key(s)], rel=1e-6, abs=1e-5) for s in decoded)
