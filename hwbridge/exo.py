"""Discover2Walk (D2W) exoskeleton telemetry: what is measured, a gait simulator, sensor faults.

D2W is a paediatric cable-driven gait exoskeleton with pelvic, ankle and traction (body-weight
support) modules under an assist-as-needed controller. The simulator produces what its sensors
would report during treadmill walking: bilateral hip/knee/ankle angles shaped per gait phase
(raised-cosine bumps on a ~1 Hz stride, after normative paediatric gait curves), cable tensions
and motor currents following the assistance profile, heart rate, and the per-session clinical
scores the CORTEX agents reason over (proprioception 0..8, pain VAS 0..10).

Faults are sensor faults, applied to one reported signal after the true value is computed, so
a fault is visible in that signal alone: exactly the Sensor-X situation of the POIROT paper,
where a miscalibrated sensor reports plausible-looking but wrong values.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal

import cbor2
import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, ConfigDict, Field, model_validator

from hwbridge.codecs import FrameCodec
from poirotd.model import TelemetrySample

Array = npt.NDArray[np.float64]


@dataclass(frozen=True)
class SignalSpec:
    unit: str
    # The plausible range; a value outside it is physically or clinically impossible.
    low: float
    high: float


SIGNALS: dict[str, SignalSpec] = {
    "gait_phase": SignalSpec("1", 0.0, 1.0),
    **{
        f"{joint}_{side}_deg": SignalSpec("deg", low, high)
        for joint, low, high in (("hip", -20.0, 45.0), ("knee", -5.0, 75.0), ("ankle", -30.0, 25.0))
        for side in ("left", "right")
    },
    **{
        f"{module}_{quantity}": SignalSpec(unit, 0.0, high)
        for module in ("pelvic", "traction", "ankle_left", "ankle_right")
        for quantity, unit, high in (("tension_n", "N", 150.0), ("current_a", "A", 10.0))
    },
    "heart_rate_bpm": SignalSpec("bpm", 60.0, 200.0),
    "proprioception_score": SignalSpec("score", 0.0, 8.0),
    "pain_vas": SignalSpec("score", 0.0, 10.0),
}


@dataclass(frozen=True)
class Channel:
    """Signals sampled together and sent as one message (one sensor, one topic)."""

    name: str
    # Topic below d2w/<patient>/.
    topic: str
    encoding: Literal["struct", "json", "cbor"]
    # Canonical signal names (SIGNALS keys) and the field names they carry on the wire.
    signals: tuple[str, ...]
    fields: tuple[str, ...]


_JOINTS = tuple(f"{j}_{s}_deg" for j in ("hip", "knee", "ankle") for s in ("left", "right"))
_CABLE_FIELDS = ("tension_n", "current_a")
JOINTS = Channel("joints", "joints", "struct", ("gait_phase", *_JOINTS), ("gait_phase", *_JOINTS))
CABLES = tuple(
    Channel(module, topic, "struct", (f"{module}_tension_n", f"{module}_current_a"), _CABLE_FIELDS)
    for module, topic in (
        ("pelvic", "pelvic/cable"),
        ("traction", "traction/cable"),
        ("ankle_left", "ankle/left/cable"),
        ("ankle_right", "ankle/right/cable"),
    )
)
VITALS = Channel("vitals", "vitals", "json", ("heart_rate_bpm",), ("heart_rate_bpm",))
CLINICAL = Channel(
    "clinical",
    "clinical",
    "cbor",
    ("proprioception_score", "pain_vas"),
    ("proprioception_score", "pain_vas"),
)
# Sampled at the frame rate; vitals come at 1 Hz and the clinical scores per report interval.
FRAME_CHANNELS = (JOINTS, *CABLES)
FRAME_SIGNALS = sum(len(c.signals) for c in FRAME_CHANNELS)
# Frame layout on the wire: float64 epoch seconds, then float32 per field; NaN = no reading.
FRAME_TIME_FIELD = "t"


def frame_codec(channel: Channel) -> FrameCodec:
    fmt = "<d" + "f" * len(channel.fields)
    fields = (FRAME_TIME_FIELD, *channel.fields)
    return FrameCodec(fmt, fields, timestamp_field=FRAME_TIME_FIELD, timestamp_unit="s")


# ------------------------------------------------------------------ faults


class FaultSpec(BaseModel):
    """One sensor fault on one signal, active from start_s for duration_s (None = to the end).

    offset: adds `magnitude` (a calibration error). drift: adds `magnitude` per second since
    start. spikes: adds +-`magnitude` to a `probability` share of samples. stuck: repeats the
    value read at onset. dropout: no readings at all.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    signal: str
    kind: Literal["offset", "drift", "spikes", "stuck", "dropout"]
    start_s: float = Field(default=0.0, ge=0.0)
    duration_s: float | None = Field(default=None, gt=0.0)
    magnitude: float = 0.0
    probability: float = Field(default=0.05, gt=0.0, le=1.0)

    @model_validator(mode="after")
    def _meaningful(self) -> FaultSpec:
        if self.signal not in SIGNALS:
            raise ValueError(f"unknown signal {self.signal!r}; known: {', '.join(SIGNALS)}")
        if self.kind in ("offset", "drift", "spikes") and self.magnitude == 0.0:
            raise ValueError(f"a {self.kind} fault needs a non-zero magnitude")
        return self

    @property
    def end_s(self) -> float:
        return math.inf if self.duration_s is None else self.start_s + self.duration_s


class _Fault:
    """A FaultSpec applied block after block (a stuck sensor remembers what it is stuck at)."""

    def __init__(self, spec: FaultSpec) -> None:
        self.spec = spec
        self._held: float | None = None

    def apply(self, t: Array, values: Array, rng: np.random.Generator) -> None:
        spec = self.spec
        active = (t >= spec.start_s) & (t < spec.end_s)
        if not active.any():
            return
        if spec.kind == "offset":
            values[active] += spec.magnitude
        elif spec.kind == "drift":
            values[active] += spec.magnitude * (t[active] - spec.start_s)
        elif spec.kind == "spikes":
            hit = active & (rng.random(t.size) < spec.probability)
            values[hit] += spec.magnitude * rng.choice((-1.0, 1.0), size=int(hit.sum()))
        elif spec.kind == "stuck":
            if self._held is None:
                self._held = float(values[active][0])
            values[active] = self._held
        else:  # dropout
            values[active] = np.nan


# ------------------------------------------------------------------ simulator


class ExoSimConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    # Aggregate samples per second over the frame channels (joints and cables).
    rate_hz: float = Field(default=1000.0, ge=100.0, le=10_000.0)
    # Strides per second; paediatric treadmill walking in D2W is around 1 Hz.
    cadence_hz: float = Field(default=1.0, gt=0.2, le=2.0)
    # Body-weight support from the traction module, N.
    traction_n: float = Field(default=60.0, ge=0.0, le=150.0)
    resting_heart_rate_bpm: float = Field(default=100.0, ge=60.0, le=160.0)
    proprioception_score: float = Field(default=6.0, ge=0.0, le=8.0)
    pain_vas: float = Field(default=2.0, ge=0.0, le=10.0)
    # How often the clinical scores are reported (they are per session; resent periodically).
    score_interval_s: float = Field(default=30.0, gt=0.0)
    # Measurement noise, in each signal's unit per degree / newton / ampere / bpm.
    angle_noise_deg: float = Field(default=0.5, ge=0.0)
    tension_noise_n: float = Field(default=0.5, ge=0.0)
    faults: tuple[FaultSpec, ...] = ()
    seed: int | None = None

    @property
    def frame_rate_hz(self) -> float:
        return self.rate_hz / FRAME_SIGNALS


@dataclass(frozen=True)
class Block:
    """Samples of one channel: times in epoch seconds, values[i, j] for time i, signal j."""

    channel: Channel
    times: Array
    values: Array


def _bump(phase: Array, center: float, width: float) -> Array:
    """A raised-cosine bump on the gait cycle (wraps around at 0/1)."""
    d = np.mod(phase - center + 0.5, 1.0) - 0.5
    out: Array = np.where(np.abs(d) < width, 0.5 * (1 + np.cos(np.pi * d / width)), 0.0)
    return out


def joint_angles(phase: Array) -> tuple[Array, Array, Array]:
    """Noise-free (hip, knee, ankle) flexion in degrees at gait phase 0..1 (0 = heel strike)."""
    hip = 10 + 20 * np.cos(2 * np.pi * phase)
    knee = 5 + 12 * _bump(phase, 0.15, 0.12) + 55 * _bump(phase, 0.72, 0.2)
    ankle = 2 + 8 * _bump(phase, 0.45, 0.2) - 18 * _bump(phase, 0.62, 0.1)
    return hip, knee, ankle


class ExoSimulator:
    """Deterministic for a given seed; ``advance(until_s)`` returns everything sampled up to
    that simulated time since the previous call, one block per channel that has samples."""

    def __init__(self, config: ExoSimConfig, *, origin: datetime | None = None) -> None:
        self._config = config
        self._origin = (origin or datetime.now(UTC)).timestamp()
        self._rng = np.random.default_rng(config.seed)
        self._faults = {
            name: [_Fault(f) for f in config.faults if f.signal == name] for name in SIGNALS
        }
        self._next = {JOINTS.name: 0, VITALS.name: 0, CLINICAL.name: 0}
        self._periods = {
            JOINTS.name: 1.0 / config.frame_rate_hz,
            VITALS.name: 1.0,
            CLINICAL.name: config.score_interval_s,
        }

    def advance(self, until_s: float) -> list[Block]:
        blocks: list[Block] = []
        frames = self._ticks(JOINTS.name, until_s)
        if frames.size:
            phase = self._phase(frames)
            blocks.append(self._block(JOINTS, frames, self._joints(phase)))
            for channel in CABLES:
                blocks.append(self._block(channel, frames, self._cable(channel.name, phase)))
        beats = self._ticks(VITALS.name, until_s)
        if beats.size:
            blocks.append(self._block(VITALS, beats, self._heart_rate(beats)[:, None]))
        reports = self._ticks(CLINICAL.name, until_s)
        if reports.size:
            scores = np.tile(
                [self._config.proprioception_score, self._config.pain_vas], (reports.size, 1)
            )
            blocks.append(self._block(CLINICAL, reports, scores.astype(np.float64)))
        return blocks

    def _ticks(self, name: str, until_s: float) -> Array:
        """Sample times in [previous until, until) on the channel's fixed grid."""
        period, first = self._periods[name], self._next[name]
        last = math.ceil(until_s / period - 1e-9)
        self._next[name] = max(first, last)
        return np.arange(first, max(first, last), dtype=np.float64) * period

    def _block(self, channel: Channel, t: Array, values: Array) -> Block:
        for j, signal in enumerate(channel.signals):
            for fault in self._faults[signal]:
                fault.apply(t, values[:, j], self._rng)
        return Block(channel, self._origin + t, values)

    def _phase(self, t: Array) -> Array:
        # Stride frequency wanders by +-3 % over 20 s, as a child's cadence does.
        c, wobble, period = self._config.cadence_hz, 0.03, 20.0
        strides = c * (t - wobble * period / (2 * np.pi) * (np.cos(2 * np.pi * t / period) - 1))
        out: Array = np.mod(strides, 1.0)
        return out

    def _noise(self, sigma: float, shape: tuple[int, ...]) -> Array:
        out: Array = self._rng.normal(0.0, sigma, shape)
        return out

    def _joints(self, phase: Array) -> Array:
        right, left = joint_angles(phase), joint_angles(np.mod(phase + 0.5, 1.0))
        angles = np.column_stack([a for pair in zip(left, right, strict=True) for a in pair])
        angles += self._noise(self._config.angle_noise_deg, angles.shape)
        return np.column_stack([phase, angles])

    def _cable(self, module: str, phase: Array) -> Array:
        if module == "traction":
            tension = self._config.traction_n + 4 * np.cos(4 * np.pi * phase)
        elif module == "pelvic":
            tension = 30 + 8 * np.cos(4 * np.pi * phase)
        else:  # ankle: assist-as-needed dorsiflexion help during swing
            side = phase if module == "ankle_right" else np.mod(phase + 0.5, 1.0)
            tension = 8 + 25 * _bump(side, 0.75, 0.18)
        tension = np.maximum(tension + self._noise(self._config.tension_noise_n, phase.shape), 0.0)
        current = 0.3 + 0.04 * tension + self._noise(0.02, phase.shape)
        return np.column_stack([tension, current])

    def _heart_rate(self, t: Array) -> Array:
        # Rises with exercise towards resting + 10 bpm over a couple of minutes, with breathing
        # modulation.
        base = self._config.resting_heart_rate_bpm
        hr: Array = base + 10 * (1 - np.exp(-t / 120)) + 2 * np.sin(2 * np.pi * t / 30)
        return hr + self._noise(1.0, t.shape)


# ------------------------------------------------------------------ output


def samples(blocks: Sequence[Block], session_id: str, component: str) -> list[TelemetrySample]:
    """The in-process view of blocks (dropped-out readings are absent)."""
    out = []
    for block in blocks:
        for i, at in enumerate(block.times):
            measured_at = datetime.fromtimestamp(float(at), UTC)
            for j, signal in enumerate(block.channel.signals):
                value = float(block.values[i, j])
                if not math.isnan(value):
                    out.append(
                        TelemetrySample(
                            session_id=session_id,
                            component=component,
                            signal=signal,
                            value=value,
                            measured_at=measured_at,
                        )
                    )
    return out


def messages(blocks: Sequence[Block], patient: str) -> list[tuple[str, bytes]]:
    """MQTT (topic, payload) per block: binary frames for the sensors, JSON for vitals, CBOR for
    the clinical scores (the bridge's example config decodes exactly this layout)."""
    out = []
    for block in blocks:
        # A sensor whose every signal has dropped out sends nothing at all.
        present = ~np.isnan(block.values).all(axis=1)
        if present.any():
            times, values = block.times[present], block.values[present]
            out.append(
                (f"d2w/{patient}/{block.channel.topic}", _encode(block.channel, times, values))
            )
    return out


def _encode(channel: Channel, times: Array, values: Array) -> bytes:
    if channel.encoding == "struct":
        return frame_codec(channel).encode(np.column_stack([times, values]).tolist())
    records = [
        {"ts": float(at), **{f: _none_if_nan(v) for f, v in zip(channel.fields, row, strict=True)}}
        for at, row in zip(times, values.tolist(), strict=True)
    ]
    if channel.encoding == "json":
        return json.dumps(records if len(records) > 1 else records[0]).encode()
    return cbor2.dumps(records if len(records) > 1 else records[0])


def _none_if_nan(value: float) -> float | None:
    return None if math.isnan(value) else value
