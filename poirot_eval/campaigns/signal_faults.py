"""Hardware and market-feed faults on a declared signal, inside a window of the session.

Each operator changes the samples of one signal (a feed operator: the few signals of one
instrument) whose time falls in the window, and nothing else: other signals, other times and
every message stay as they were. The window starts at a fraction of the session's span (its
first to its last message or sample) and lasts `duration_s` (to the end by default), so it lies
before the point where the session ends and an investigation would be triggered.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

import numpy as np

from poirot_eval.campaigns.agent_faults import NotApplicableError
from poirot_eval.campaigns.plan import SignalFault
from poirotd.model import AgentMessage, TelemetrySample


@dataclass(frozen=True)
class SignalInjection:
    telemetry: tuple[TelemetrySample, ...]
    onset: datetime
    signals: tuple[str, ...]
    # The first value changed, before and after (or what the operator did, for dropout).
    before: str
    after: str


def window(
    fault: SignalFault, messages: Sequence[AgentMessage], telemetry: Sequence[TelemetrySample]
) -> tuple[datetime, datetime]:
    """[onset, end) of the fault in the session's time."""
    times = [m.sent_at for m in messages] + [s.measured_at for s in telemetry]
    first, last = min(times), max(times)
    onset = first + (last - first) * fault.start_fraction
    if fault.duration_s is None:
        return onset, datetime.max.replace(tzinfo=onset.tzinfo)
    return onset, onset + timedelta(seconds=fault.duration_s)


def inject(
    fault: SignalFault, messages: Sequence[AgentMessage], telemetry: Sequence[TelemetrySample]
) -> SignalInjection:
    """The session's telemetry with `fault` applied. Raises NotApplicableError when the signal
    has no sample in the window or the operator would leave every sample as it was."""
    if not telemetry:
        raise NotApplicableError("the session has no telemetry")
    onset, end = window(fault, messages, telemetry)
    names = _signals(fault)
    inside = [
        i
        for i, s in enumerate(telemetry)
        if s.component == fault.component and s.signal in names and onset <= s.measured_at < end
    ]
    if not inside:
        raise NotApplicableError(
            f"no sample of {fault.component}.{'/'.join(names)} between {onset:%H:%M:%S.%f} "
            f"and the window's end"
        )
    changed = _apply(fault, telemetry, inside, onset)
    if all(c == telemetry[i] for i, c in changed.items()):
        raise NotApplicableError(f"{fault.operator} leaves {fault.signal} as it was in the window")
    out = tuple(
        changed.get(i, s) if i in changed else s
        for i, s in enumerate(telemetry)
        if not (i in changed and changed[i] is None)
    )
    first = inside[0]
    before = f"{telemetry[first].signal}={telemetry[first].value:g}"
    now = changed.get(first, telemetry[first])
    after = "no reading" if now is None else f"{now.signal}={now.value:g}"
    return SignalInjection(tuple(s for s in out if s is not None), onset, names, before, after)


def _signals(fault: SignalFault) -> tuple[str, ...]:
    symbol = fault.signal
    if fault.operator == "crossed_book":
        return (f"{symbol}.bid", f"{symbol}.ask", f"{symbol}.spread")
    if fault.operator == "stale_price":
        return (f"{symbol}.price", f"{symbol}.bid", f"{symbol}.ask", f"{symbol}.volume")
    if fault.operator == "price_spike":
        return (f"{symbol}.price",)
    return (fault.signal,)


def _apply(
    fault: SignalFault,
    telemetry: Sequence[TelemetrySample],
    inside: list[int],
    onset: datetime,
) -> dict[int, TelemetrySample | None]:
    """Index -> the changed sample (None: removed) for the samples the operator touches."""
    op, m = fault.operator, fault.magnitude

    def valued(i: int, value: float) -> TelemetrySample:
        return telemetry[i].model_copy(update={"value": value})

    if op == "offset":
        return {i: valued(i, telemetry[i].value + m) for i in inside}
    if op == "gain":
        return {i: valued(i, telemetry[i].value * m) for i in inside}
    if op == "stuck":
        held = telemetry[inside[0]].value if fault.value is None else fault.value
        return {i: valued(i, held) for i in inside}
    if op == "dropout":
        return {i: None for i in inside}
    if op == "spike":
        return {inside[0]: valued(inside[0], telemetry[inside[0]].value + m)}
    if op == "drift":
        return {
            i: valued(
                i, telemetry[i].value + m * (telemetry[i].measured_at - onset).total_seconds()
            )
            for i in inside
        }
    if op == "noise":
        rng = np.random.default_rng(fault.seed)
        return {i: valued(i, telemetry[i].value + float(rng.normal(0.0, abs(m)))) for i in inside}
    if op == "delay":
        return {i: valued(i, _value_at(telemetry, i, m)) for i in inside}
    if op == "price_spike":
        return {inside[0]: valued(inside[0], telemetry[inside[0]].value * (1.0 + m))}
    if op == "stale_price":
        # The feed repeats its last quote and reports no trades (hwbridge's simulator does too).
        return {
            i: valued(
                i,
                0.0
                if telemetry[i].signal.endswith(".volume")
                else _last_before(telemetry, i, onset),
            )
            for i in inside
        }
    # crossed_book: bid and ask trade places, so the spread turns negative.
    partner = {"bid": "ask", "ask": "bid"}
    out: dict[int, TelemetrySample | None] = {}
    for i in inside:
        sample = telemetry[i]
        field = sample.signal.rpartition(".")[2]
        if field == "spread":
            out[i] = valued(i, -abs(sample.value) if sample.value else -0.01)
            continue
        other = _same_time(telemetry, i, sample.signal.rpartition(".")[0] + "." + partner[field])
        out[i] = valued(i, other)
    return out


def _stream(telemetry: Sequence[TelemetrySample], i: int, signal: str) -> list[TelemetrySample]:
    s = telemetry[i]
    return [x for x in telemetry if x.component == s.component and x.signal == signal]


def _value_at(telemetry: Sequence[TelemetrySample], i: int, delay_s: float) -> float:
    """The value the signal had `delay_s` earlier than sample i (its oldest, if none then)."""
    at = telemetry[i].measured_at - timedelta(seconds=delay_s)
    earlier = [x for x in _stream(telemetry, i, telemetry[i].signal) if x.measured_at <= at]
    stream = _stream(telemetry, i, telemetry[i].signal)
    return (earlier[-1] if earlier else stream[0]).value


def _last_before(telemetry: Sequence[TelemetrySample], i: int, onset: datetime) -> float:
    """What the feed last reported before the window (the first value in it, if nothing)."""
    before = [x for x in _stream(telemetry, i, telemetry[i].signal) if x.measured_at < onset]
    return before[-1].value if before else _stream(telemetry, i, telemetry[i].signal)[0].value


def _same_time(telemetry: Sequence[TelemetrySample], i: int, signal: str) -> float:
    at = telemetry[i].measured_at
    matches = [x.value for x in _stream(telemetry, i, signal) if x.measured_at == at]
    if not matches:
        raise NotApplicableError(f"{signal} has no quote at {at:%H:%M:%S.%f} to cross with")
    return matches[0]
