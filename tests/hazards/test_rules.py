"""Each rule kind fires on the input it is for and stays quiet on clean input. Hysteresis, cooldown,
composites, stale checks and evidence bounds hold, and batch size never changes the outcome."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from pydantic import ValidationError

from poirotd.devtools.hazard_inputs import (
    ANKLE,
    EXO,
    at,
    engine,
    feed,
    message,
    rule,
    sample,
    series,
)
from poirotd.hazards.window import CHUNK
from poirotd.model import (
    AgentMessage,
    HazardEvent,
    MessageKind,
    SessionEnd,
    TelemetryBatch,
    row_of,
)

# One sample at a time, a small odd batch, and batches larger than the engine's chunk.
BATCHES = [1, 7, 3 * CHUNK + 5]


def fired(events: list[HazardEvent]) -> list[tuple[str, str]]:
    """(rule, time) of each event, for comparing runs."""
    return [(e.rule, e.at.isoformat()) for e in events]


# ------------------------------------------------------------------ threshold


@pytest.mark.parametrize("batch", BATCHES)
def test_threshold_fires_after_for_samples_consecutive_samples(batch: int) -> None:
    eng = engine(rule("threshold", "ankle_high", severity="critical", above=35.0, for_samples=3))
    values = [30, 36, 37, 30, 38, 39, 41.2, 42, 30]
    [event] = feed(eng, series(values, dt=0.1), batch)
    assert event.rule == "ankle_high"
    assert event.severity == "critical"
    assert event.session_id == "s1"
    assert event.at == at(0.6)
    assert event.summary == "d2w_exoskeleton.ankle_angle_deg = 41.2 above 35.0 for 3 samples"
    assert [s.value for s in event.evidence] == values[:7]


@pytest.mark.parametrize("batch", BATCHES)
def test_threshold_quiet_on_clean_input(batch: int) -> None:
    eng = engine(rule("threshold", above=35.0, below=-35.0))
    clean = 35.0 * np.sin(np.linspace(0, 20 * np.pi, 2000))  # touches both levels, never past
    assert feed(eng, series(clean), batch) == []


def test_threshold_below() -> None:
    eng = engine(rule("threshold", below=-5.0))
    [event] = eng.observe_telemetry(series([0.0, -6.0]))
    assert event.summary == "d2w_exoskeleton.ankle_angle_deg = -6.0 below -5.0"


@pytest.mark.parametrize("batch", BATCHES)
def test_threshold_rearms_only_past_the_clear_level(batch: int) -> None:
    values = [36, 33, 36, 29, 36]
    with_hysteresis = engine(rule("threshold", above=35, clear_above=30, cooldown_seconds=0))
    events = feed(with_hysteresis, series(values, dt=1.0), batch)
    assert [e.at for e in events] == [at(0), at(4)]
    without = engine(rule("threshold", above=35, cooldown_seconds=0))
    events = feed(without, series(values, dt=1.0), batch)
    assert [e.at for e in events] == [at(0), at(2), at(4)]


def test_a_continuous_excursion_fires_once() -> None:
    eng = engine(rule("threshold", above=35, cooldown_seconds=1))
    assert len(eng.observe_telemetry(series([40.0] * 1000))) == 1  # 10 s, ten cooldowns


# ------------------------------------------------------------------ cooldown


@pytest.mark.parametrize("batch", BATCHES)
def test_cooldown_is_per_session_and_in_sample_time(batch: int) -> None:
    eng = engine(rule("threshold", above=35, cooldown_seconds=10))
    s1 = [sample(36, 0), sample(30, 1), sample(36, 2), sample(30, 3), sample(36, 11)]
    s2 = [sample(36, 0.5, session="s2"), sample(30, 1.5, session="s2")]
    events = feed(eng, sorted(s1 + s2, key=lambda s: s.measured_at), batch)
    assert [(e.session_id, e.at) for e in events] == [
        ("s1", at(0)),
        ("s2", at(0.5)),
        ("s1", at(11)),
    ]


def test_an_excursion_suppressed_by_cooldown_fires_when_the_cooldown_ends() -> None:
    eng = engine(rule("threshold", above=35, cooldown_seconds=10))
    events = eng.observe_telemetry([sample(36, 0), sample(30, 1), sample(36, 2), sample(36, 10.5)])
    assert [e.at for e in events] == [at(0), at(10.5)]


# ------------------------------------------------------------------ range


@pytest.mark.parametrize("batch", BATCHES)
def test_range_fires_outside_and_rearms_inside_the_margin(batch: int) -> None:
    eng = engine(rule("range", min=-20, max=20, hysteresis=5, cooldown_seconds=0))
    events = feed(eng, series([0, 21, 17, 22, 14, -21, 19], dt=1.0), batch)
    assert [e.summary for e in events] == [
        "d2w_exoskeleton.ankle_angle_deg = 21.0 above 20.0",
        "d2w_exoskeleton.ankle_angle_deg = -21.0 below -20.0",
    ]
    assert feed(engine(rule("range", min=-20, max=20)), series(np.zeros(100)), batch) == []


# ------------------------------------------------------------------ rate


@pytest.mark.parametrize("batch", BATCHES)
def test_rate_fires_on_a_jump_not_on_smooth_motion(batch: int) -> None:
    eng = engine(rule("rate", max_rate_per_second=100.0))
    [event] = feed(eng, series([0.0, 0.5, 1.0, 3.0, 3.5]), batch)
    assert event.at == at(0.03)
    assert event.summary == (
        "d2w_exoskeleton.ankle_angle_deg = 3.0 changing at 200.0/s, limit 100.0/s"
    )
    smooth = 10.0 * np.sin(2 * np.pi * np.arange(0, 10, 0.01))  # at most 63 deg/s
    assert feed(engine(rule("rate", max_rate_per_second=100.0)), series(smooth), batch) == []


def test_rate_ignores_samples_without_time_between_them() -> None:
    eng = engine(rule("rate", max_rate_per_second=1.0))
    assert eng.observe_telemetry([sample(0.0, 1.0), sample(50.0, 1.0)]) == []


# ------------------------------------------------------------------ zscore / rolling mean


@pytest.mark.parametrize("batch", BATCHES)
def test_zscore_fires_on_a_spike_after_min_samples(batch: int) -> None:
    noise = np.random.default_rng(1).normal(0.0, 1.0, 2000)
    spec = rule("zscore", window_samples=50, threshold=5.0, min_samples=20)
    assert feed(engine(spec), series(noise), batch) == []
    spiky = noise.copy()
    spiky[10] = 10.0  # too early: only 10 samples in the window
    spiky[500] = 10.0
    [event] = feed(engine(spec), series(spiky), batch)
    assert event.at == at(5.0)
    assert event.summary.startswith("d2w_exoskeleton.ankle_angle_deg = 10.0, z = ")
    assert event.summary.endswith("over 50 samples (limit 5.0)")


def test_zscore_min_std_floors_a_constant_window() -> None:
    values = [1.0] * 20 + [1.001]
    strict = rule("zscore", window_samples=20, threshold=3.0, min_samples=10)
    assert len(engine(strict).observe_telemetry(series(values))) == 1
    floored = rule("zscore", window_samples=20, threshold=3.0, min_samples=10, min_std=0.01)
    assert engine(floored).observe_telemetry(series(values)) == []


@pytest.mark.parametrize("batch", BATCHES)
def test_rolling_mean_fires_when_the_window_mean_passes_a_level(batch: int) -> None:
    eng = engine(rule("rolling_mean", window_samples=10, min_samples=10, above=5.0))
    [event] = feed(eng, series([0.0] * 20 + [8.0] * 20), batch)
    assert event.at == at(0.26)  # 7 of the last 10 samples at 8: mean 5.6
    assert event.summary == "d2w_exoskeleton.ankle_angle_deg mean 5.6 over 10 samples above 5.0"


# Two readings at the float limit (each finite, their squares and their difference not), and two
# whose squares overflow.
EXTREMES = [(1.797e308, -1.797e308), (1e300, 1e300)]


@pytest.mark.filterwarnings("error")  # numpy prints nothing either
@pytest.mark.parametrize("extremes", EXTREMES)
@pytest.mark.parametrize("batch", BATCHES)
def test_window_rules_fire_again_once_extreme_readings_leave_their_window(
    extremes: tuple[float, float], batch: int
) -> None:
    """Issue 28: with running sums, two such readings made a session's zscore and rolling_mean
    rules never fire again. Now only the windows that hold them measure NaN."""
    values = np.random.default_rng(5).normal(0.0, 1.0, 400)
    values[100:102] = extremes
    values[160] = 10.0  # the zscore window before it (50 samples) is clean from sample 152 on
    values[200:220] = 8.0  # the rolling mean's (20 samples) from sample 121 on
    spike = rule("zscore", "spike", window_samples=50, threshold=5.0, min_samples=20)
    offset = rule("rolling_mean", "offset", window_samples=20, min_samples=10, above=5.0)
    eng = engine(spike | {"cooldown_seconds": 0.0}, offset | {"cooldown_seconds": 0.0})
    events = [e for e in feed(eng, series(values), batch) if e.at > at(1.01)]
    assert ("spike", at(1.6)) in [(e.rule, e.at) for e in events]
    [offset_event] = [e for e in events if e.rule == "offset"]
    assert at(2.0) < offset_event.at < at(2.2)
    assert offset_event.summary.endswith("over 20 samples above 5.0")


def gait(seconds: float, *, offset_from: float | None = None, rate_hz: float = 100.0) -> np.ndarray:
    """Ankle angle over a gait cycle, 10·sin(2πt) deg plus 0.5 deg noise. From
    ``offset_from`` on, a Sensor-X calibration fault adds +15 deg."""
    t = np.arange(0.0, seconds, 1.0 / rate_hz)
    angle = 10.0 * np.sin(2 * np.pi * t) + np.random.default_rng(7).normal(0.0, 0.5, t.size)
    if offset_from is not None:
        angle[t >= offset_from] += 15.0
    return angle


SENSOR_X_RULES = (
    rule(
        "rolling_mean",
        "ankle_offset",
        window_seconds=2.0,
        min_samples=100,
        above=5.0,
        below=-5.0,
        clear_above=2.0,
        clear_below=-2.0,
    ),
    # A weaker detector for an offset on a large oscillation: with this generator, clean gait
    # peaks at |z| ~ 1.65 and the fault's first cycle at ~ 2.6.
    rule("zscore", "ankle_jump", window_seconds=2.0, min_samples=100, threshold=2.2),
)


@pytest.mark.parametrize("batch", [1, 100, 1000])
def test_sensor_x_offset_fires_and_clean_gait_does_not(batch: int) -> None:
    assert feed(engine(*SENSOR_X_RULES), series(gait(60.0)), batch) == []
    events = feed(engine(*SENSOR_X_RULES), series(gait(60.0, offset_from=30.0)), batch)
    assert {e.rule for e in events} == {"ankle_offset", "ankle_jump"}
    assert all(at(30.0) <= e.at <= at(31.5) for e in events)
    offset = next(e for e in events if e.rule == "ankle_offset")
    assert "mean" in offset.summary and "above 5.0" in offset.summary


@pytest.mark.parametrize("batch", [7, 100, 3 * CHUNK + 5])
def test_batch_size_never_changes_which_events_fire(batch: int) -> None:
    rng = np.random.default_rng(3)
    values = np.cumsum(rng.normal(0.0, 1.0, 3000))  # a random walk crosses every level often
    rules = [
        rule("threshold", "hi", above=5, clear_above=2, for_samples=4, cooldown_seconds=0.5),
        rule("range", "band", min=-8, max=8, hysteresis=1, cooldown_seconds=0.2),
        rule("rate", "jump", max_rate_per_second=250, cooldown_seconds=0.3),
        rule("zscore", "z", window_samples=30, threshold=2.5, cooldown_seconds=0.1),
        rule("rolling_mean", "drift", window_seconds=0.5, above=3, cooldown_seconds=0),
        rule("all", "both", rules=["hi", "jump"], within_seconds=0.2, cooldown_seconds=0),
    ]
    one_by_one = feed(engine(*rules), series(values), 1)
    assert len(one_by_one) > 50
    assert fired(feed(engine(*rules), series(values), batch)) == fired(one_by_one)


@pytest.mark.parametrize("batch", [1, 100, 3 * CHUNK + 5])
def test_an_input_batch_fires_as_its_samples_do(batch: int) -> None:
    """A TelemetryBatch (an input's readings of one session) gives the same events, evidence
    included, as the same data sent as samples; a stream no rule watches is ignored."""
    rng = np.random.default_rng(5)
    walk = np.cumsum(rng.normal(0.0, 1.0, 2000))
    rules = [
        rule("threshold", "hi", above=5, clear_above=2, cooldown_seconds=0.5),
        rule("zscore", "z", window_samples=30, threshold=2.5, cooldown_seconds=0.1),
        rule("threshold", "torque", signal="knee_torque_nm", above=4, emit=False),
        rule("all", "both", rules=["hi", "torque"], within_seconds=0.2, cooldown_seconds=0),
    ]
    mixed = [
        s
        for i, v in enumerate(walk)
        for s in (
            sample(float(v), i * 0.01),
            sample(float(-v), i * 0.01, signal="knee_torque_nm"),
            sample(float(v), i * 0.01, signal="unwatched"),
        )
    ]
    as_samples = feed(engine(*rules), mixed, batch)
    as_batches: list[HazardEvent] = []
    eng = engine(*rules)
    for i in range(0, len(mixed), batch):
        rows = list(map(row_of, mixed[i : i + batch]))
        as_batches += eng.observe_batch(TelemetryBatch("s1", rows))
    assert len(as_samples) > 20 and {e.rule for e in as_samples} == {"hi", "z", "both"}
    assert as_batches == as_samples


# ------------------------------------------------------------------ stale


def test_stale_fires_on_tick_once_per_silence() -> None:
    eng = engine(rule("stale", "ankle_silent", timeout_seconds=1.0, cooldown_seconds=0))
    first = sample(1.0, 0.0)
    eng.observe_telemetry([first])
    assert eng.tick(at(1.0)) == []
    [event] = eng.tick(at(1.5))
    assert event.at == at(1.5)
    assert event.summary == (
        "d2w_exoskeleton.ankle_angle_deg silent for 1.5 s since its last sample (timeout 1 s)"
    )
    assert event.evidence == (first,)
    assert eng.tick(at(2.5)) == []
    eng.observe_telemetry([sample(2.0, 3.0)])
    assert eng.tick(at(3.5)) == []
    assert len(eng.tick(at(4.5))) == 1


def test_stale_counts_from_session_start_when_the_signal_never_came() -> None:
    eng = engine(rule("stale", timeout_seconds=1.0))
    eng.observe_message(message("starting the session", 0.0, session="s2"))
    [event] = eng.tick(at(2.0))
    assert event.session_id == "s2"
    assert "since the session began" in event.summary
    assert event.evidence == ()


def test_ended_sessions_are_forgotten() -> None:
    eng = engine(rule("stale", timeout_seconds=1.0))
    eng.observe_telemetry([sample(1.0, 0.0)])
    eng.end_session("s1")
    assert eng.tick(at(5.0)) == []


# ------------------------------------------------------------------ messages


def test_message_pattern_with_sender_and_kind_filters() -> None:
    eng = engine(
        rule(
            "message_pattern",
            "plan4",
            pattern=r"(?i)plan\s*4",
            sender="chief",
            message_kind="agent",
            cooldown_seconds=0,
        )
    )
    [event] = eng.observe_message(message("I select Plan 4 for Ana.", sender="chief", index=3))
    assert event.summary == r"message #3 from chief matches '(?i)plan\\s*4': 'Plan 4'"
    assert event.evidence == ()
    assert eng.observe_message(message("Plan 4", sender="doctor")) == []
    assert eng.observe_message(message("Plan 4", sender="chief", kind=MessageKind.HUMAN)) == []
    assert eng.observe_message(message("I select Plan 3.", sender="chief")) == []


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (
            "Torque check.\n[HAZARD] knee torque above limit\nDetails follow.",
            "knee torque above limit",
        ),
        ('{"hazard": true, "reason": "ankle sensor drifts"}', "ankle sensor drifts"),
        ('  {"hazard": true}  ', ""),
    ],
)
def test_agent_flag_raised(content: str, reason: str) -> None:
    [event] = engine(rule("agent_flag")).observe_message(message(content, index=5))
    head = "agent physio_general flagged a hazard in message #5"
    assert event.summary == (f"{head}: {reason}" if reason else head)


@pytest.mark.parametrize(
    "content",
    [
        "All readings nominal.",
        '{"hazard": false}',
        '{"hazard": "true"}',
        '{"hazard": true',
        'The JSON {"hazard": true} is the flag format.',
    ],
)
def test_agent_flag_not_raised(content: str) -> None:
    assert engine(rule("agent_flag")).observe_message(message(content)) == []


def test_agent_flag_only_from_agents() -> None:
    tool = message("[HAZARD] from a tool", kind=MessageKind.TOOL)
    assert engine(rule("agent_flag")).observe_message(tool) == []


def test_message_repeat_fires_on_an_agent_saying_again_what_it_just_said() -> None:
    eng = engine(rule("message_repeat", within_messages=2, cooldown_seconds=0))
    order = "Proposed order: BUY 400 shares ACME, limit 100.35."
    assert eng.observe_message(message(order, 1.0, sender="trader", index=3)) == []
    [event] = eng.observe_message(
        message(
            "  proposed ORDER: buy 400\nshares ACME, limit 100.35. ", 2.0, sender="trader", index=4
        )
    )
    assert event.at == at(2.0)
    assert event.summary.startswith("message #4 from trader repeats its message #3: ")


def test_message_repeat_compares_within_each_agents_last_messages() -> None:
    eng = engine(rule("message_repeat", within_messages=2, cooldown_seconds=0))
    plan = "I select Plan 3 for Ana: six sessions."
    other = ["Heart rate is steady at 92 bpm.", "Proprioception score 4.2 this week."]
    feed_in = [message(plan, 0.0, sender="chief", index=0)]
    feed_in += [message(text, 1.0 + i, sender="chief", index=1 + i) for i, text in enumerate(other)]
    feed_in += [message(plan, 5.0, sender="doctor", index=3)]  # another agent: not a repeat
    feed_in += [message(plan, 6.0, sender="chief", index=4)]  # three messages back: forgotten
    assert eng.observe_messages(feed_in) == []


@pytest.mark.parametrize(
    ("first", "again"),
    [
        (message("OK, done.", 0.0, index=0), message("OK, done.", 1.0, index=1)),  # too short
        (
            message("Order 7781 filled: 400 ACME.", 0.0, kind=MessageKind.TOOL, index=0),
            message("Order 7781 filled: 400 ACME.", 1.0, kind=MessageKind.TOOL, index=1),
        ),  # not an agent's
        (
            message("Plan 3 is the right plan here.", 0.0, index=2),
            message("Plan 3 is the right plan here.", 0.0, index=2),
        ),  # the same message delivered twice
        (
            message("Plan 3 is the right plan here.", 0.0, index=5),
            message("Plan 3 is the right plan here.", 0.0, index=2),
        ),  # an older message delivered again
        (
            message("Plan 3 is the right plan here.", 0.0, session="s1", index=0),
            message("Plan 3 is the right plan here.", 1.0, session="s2", index=0),
        ),  # another session
    ],
)
def test_message_repeat_quiet(first: AgentMessage, again: AgentMessage) -> None:
    eng = engine(rule("message_repeat", cooldown_seconds=0))
    assert eng.observe_messages([first, again]) == []


def test_message_repeat_forgets_an_ended_session() -> None:
    eng = engine(rule("message_repeat", sender="chief", cooldown_seconds=0))
    text = "I select Plan 3 for Ana: six sessions."
    eng.observe_message(message(text, 0.0, sender="chief", index=0))
    eng.end_session("s1")
    assert eng.observe_message(message(text, 1.0, sender="chief", index=1)) == []


ORDER = {"sender": "trader", "pattern": "(?i)proposed order"}
REVIEW = {"sender": "risk_manager", "pattern": "(?i)approved|rejected"}


def reply_rule(**fields: Any) -> dict[str, Any]:
    return rule("reply_expected", "unreviewed", after=ORDER, expect=REVIEW, within_seconds=5.0,
                cooldown_seconds=0) | fields  # fmt: skip


def order(t: float, index: int, session: str = "s1") -> AgentMessage:
    text = "Proposed order: BUY 400 shares ACME."
    return message(text, t, sender="trader", index=index, session=session)


def test_reply_expected_quiet_when_the_reply_comes_in_time() -> None:
    eng = engine(reply_rule())
    review = message("Approved: BUY 400 ACME.", 4.0, sender="risk_manager", index=1)
    later = message("Filled 400 ACME.", 60.0, sender="trader", index=2)
    assert eng.observe_messages([order(0.0, 0), review, later]) == []
    assert eng.observe([SessionEnd(session_id="s1", ended_at=at(61.0))]) == []


def test_reply_expected_fires_at_the_first_message_past_the_deadline() -> None:
    eng = engine(reply_rule())
    chatter = message("ACME trades at 100.31.", 3.0, sender="market_analyst", index=1)
    late = message("Approved: BUY 400 ACME.", 6.0, sender="risk_manager", index=2)
    [event] = eng.observe_messages([order(0.0, 0), chatter, late])
    assert event.at == at(6.0)
    assert event.summary == (
        "message #0 from trader got no reply (message from risk_manager matching "
        "'(?i)approved|rejected') within 5 s"
    )


def test_reply_expected_fires_when_the_session_ends_waiting() -> None:
    eng = engine(reply_rule())
    assert eng.observe_messages([order(0.0, 0), order(1.0, 1, session="s2")]) == []
    [event] = eng.observe([SessionEnd(session_id="s1", ended_at=at(2.0))])
    assert (event.session_id, event.at) == ("s1", at(2.0))
    assert event.summary.endswith("before the session ended")
    # s2 still waits; s1 is forgotten and fires no more.
    assert eng.observe([SessionEnd(session_id="s1", ended_at=at(3.0))]) == []
    [event] = eng.observe([SessionEnd(session_id="s2", ended_at=at(3.0))])
    assert event.session_id == "s2"


def test_reply_expected_ignores_messages_delivered_again() -> None:
    eng = engine(reply_rule())
    review = message("Approved: BUY 400 ACME.", 2.0, sender="risk_manager", index=1)
    second = order(10.0, 2)
    # The order and the approval again, as a producer resends what it was not acked for.
    again = [order(0.0, 0), review, second, review]
    assert eng.observe_messages([order(0.0, 0), review, *again]) == []
    [event] = eng.observe([SessionEnd(session_id="s1", ended_at=at(11.0))])
    assert event.summary.startswith("message #2 from trader got no reply")


def test_reply_expected_waits_on_the_first_unanswered_message() -> None:
    eng = engine(reply_rule(expect={"message_kind": "tool"}))
    second = order(4.0, 1)  # does not move the deadline of the first
    [event] = eng.observe_messages([order(0.0, 0), second, message("x", 5.5, index=2)])
    assert event.summary == "message #0 from trader got no reply (tool message) within 5 s"


@pytest.mark.parametrize("empty", [{}, {"sender": None}])
def test_reply_expected_refuses_an_empty_filter(empty: dict[str, Any]) -> None:
    with pytest.raises(ValidationError, match="empty filter"):
        engine(reply_rule(expect=empty))


# ------------------------------------------------------------------ composites


def test_all_fires_when_every_part_held_within_the_window() -> None:
    rules = [
        rule("threshold", "ankle_high", above=35, cooldown_seconds=0),
        rule("message_pattern", "stop_said", pattern="STOP", emit=False),
        rule("all", "ankle_and_stop", rules=["ankle_high", "stop_said"], within_seconds=2),
    ]
    eng = engine(*rules)
    assert eng.observe_message(message("STOP the session", 10.0)) == []
    events = eng.observe_telemetry([sample(36.0, 11.0)])
    assert [e.rule for e in events] == ["ankle_high", "ankle_and_stop"]
    assert events[1].at == at(11.0)
    assert events[1].summary == "all of ankle_high, stop_said held within 2 s (ankle_high last)"
    assert [s.value for s in events[1].evidence] == [36.0]

    late = engine(*rules)
    late.observe_message(message("STOP the session", 10.0))
    assert [e.rule for e in late.observe_telemetry([sample(36.0, 12.5)])] == ["ankle_high"]


def test_all_across_two_signals_in_one_batch() -> None:
    rules = [
        rule("threshold", "ankle_high", above=35, emit=False),
        rule(
            "threshold",
            "torque_high",
            component=EXO,
            signal="knee_torque_nm",
            above=20,
            emit=False,
        ),
        rule("all", "both", rules=["ankle_high", "torque_high"], within_seconds=0.5),
    ]
    batch = [
        sample(36.0, 1.0),
        sample(5.0, 1.0, signal="knee_torque_nm"),
        sample(25.0, 1.3, signal="knee_torque_nm"),
    ]
    [event] = engine(*rules, evidence_limit=4).observe_telemetry(batch)
    assert event.at == at(1.3)
    assert "(torque_high last)" in event.summary
    assert len(event.evidence) <= 4
    assert {s.signal for s in event.evidence} == {ANKLE, "knee_torque_nm"}


def test_any_and_nested_composites() -> None:
    rules = [
        rule("agent_flag", "flag", emit=False),
        rule("message_pattern", "plan4", pattern="Plan 4", emit=False),
        rule("any", "clinical", rules=["flag", "plan4"], severity="critical"),
        rule("threshold", "ankle_high", above=35, emit=False),
        rule("all", "hurt", rules=["clinical", "ankle_high"], within_seconds=5),
    ]
    eng = engine(*rules)
    [event] = eng.observe_message(message("Going with Plan 4.", 1.0))
    assert (event.rule, event.severity) == ("clinical", "critical")
    assert event.summary == "any of flag, plan4: plan4"
    [event] = eng.observe_telemetry([sample(40.0, 3.0)])
    assert event.rule == "hurt"


def test_a_batch_of_messages_fires_as_its_messages_one_by_one() -> None:
    rules = [
        rule("agent_flag", "flag", cooldown_seconds=0),
        rule("message_pattern", "stop", pattern="STOP", emit=False),
        rule("message_pattern", "plan", pattern="Plan 4", emit=False),
        rule("all", "stop_and_plan", rules=["stop", "plan"], within_seconds=2),
        rule("any", "either", rules=["stop", "plan"], cooldown_seconds=5),
    ]
    messages = [
        message("STOP the session", 1.0, index=0),
        message("[HAZARD] cable slack", 1.5, index=1),
        message("Going with Plan 4.", 2.5, index=2),
        message("Plan 4 again, and STOP", 9.0, index=3),
        message("[HAZARD] again", 9.1, index=4),
    ]
    one_by_one = engine(*rules)
    expected = [e for m in messages for e in one_by_one.observe_message(m)]
    # At 9.0 s both parts hold again, but stop_and_plan is still in its cooldown.
    assert [e.rule for e in expected] == ["either", "flag", "stop_and_plan", "either", "flag"]
    assert engine(*rules).observe_messages(messages) == expected


@pytest.mark.parametrize("batch", [1, 3, 50])
def test_value_rules_fire_the_same_with_or_without_arrays(batch: int) -> None:
    """A stream watched only by value rules (threshold, range) skips its arrays on chunks that
    change nothing; with a rate rule beside them (never firing) every chunk takes the array
    path. Both must fire the same events, evidence included, also on late samples."""
    rng = np.random.default_rng(11)
    values = np.cumsum(rng.normal(0.0, 1.0, 3000))
    times = np.arange(3000) * 0.01
    late = rng.random(3000) < 0.05
    times[late] -= 0.5  # late samples: evaluated at the stream's newest time
    samples = [sample(float(v), float(t)) for v, t in zip(values, times, strict=True)]
    value_rules = [
        rule("threshold", "hot", above=8.0, clear_above=6.0, cooldown_seconds=0.2),
        rule("threshold", "run", below=-8.0, for_samples=3, cooldown_seconds=0.0),
        rule("range", "band", min=-12.0, max=12.0, hysteresis=1.0, cooldown_seconds=0.5),
    ]
    never = rule("rate", "never", max_rate_per_second=1e12)
    plain = feed(engine(*value_rules, evidence_limit=5), samples, batch)
    arrays = feed(engine(*value_rules, never, evidence_limit=5), samples, batch)
    assert len(plain) > 20
    assert [(e.rule, e.at, e.summary, e.evidence) for e in plain] == [
        (e.rule, e.at, e.summary, e.evidence) for e in arrays
    ]


# ------------------------------------------------------------------ evidence and robustness


@pytest.mark.parametrize("batch", BATCHES)
def test_evidence_is_the_bounded_tail_up_to_the_trigger(batch: int) -> None:
    values = [float(i % 10) for i in range(600)] + [40.0, 41.0, 42.0]
    [event] = feed(engine(rule("threshold", above=35), evidence_limit=5), series(values), batch)
    assert [s.value for s in event.evidence] == [6.0, 7.0, 8.0, 9.0, 40.0]
    [event] = feed(engine(rule("threshold", above=35), evidence_limit=0), series(values), batch)
    assert event.evidence == ()


def test_samples_for_unwatched_signals_are_ignored() -> None:
    eng = engine(rule("threshold", above=35))
    assert eng.observe_telemetry([sample(99.0, 0.0, signal="hip_angle_deg")]) == []


@pytest.mark.parametrize("late_first", [True, False], ids=["chunk-of-one", "start-of-chunk"])
def test_a_late_sample_is_windowed_at_the_newest_time(late_first: bool) -> None:
    # At the newest time (2.0 s) the late 20 shares the 0.5 s window with the 0 taken then:
    # mean 10. At its own time (0.5 s) the window would hold every sample: mean 5.
    eng = engine(rule("rolling_mean", window_seconds=0.5, min_samples=2, above=9.0))
    eng.observe_telemetry([sample(0.0, 0.0), sample(0.0, 1.0), sample(0.0, 2.0)])
    late = [sample(20.0, 0.5)] if late_first else [sample(20.0, 0.5), sample(0.0, 2.0)]
    assert [e.rule for e in eng.observe_telemetry(late)] == ["r"]


def test_a_late_sample_is_still_evaluated() -> None:
    eng = engine(rule("threshold", above=35), rule("rate", "jump", max_rate_per_second=1e6))
    eng.observe_telemetry([sample(0.0, 1.0)])
    [event] = eng.observe_telemetry([sample(40.0, 0.5)])
    assert (event.rule, event.at) == ("r", at(0.5))


@pytest.mark.parametrize("batch", BATCHES)
def test_composite_evidence_does_not_depend_on_the_batch(batch: int) -> None:
    """A composite's evidence is read once a round's chunks are all recorded: a hit early in a
    stream's round (its first chunk of several) still has the samples up to it."""
    rules = [
        rule("threshold", "ankle_high", above=35, emit=False),
        rule("threshold", "torque_high", signal="knee_torque_nm", above=20, emit=False),
        rule("all", "both", rules=["ankle_high", "torque_high"], within_seconds=0.5),
    ]
    ankle = [40.0 if i == 10 else 1.0 for i in range(3 * CHUNK)]
    samples = sorted(
        [*series(ankle), sample(25.0, 0.1, signal="knee_torque_nm")],
        key=lambda s: s.measured_at,
    )
    [event] = feed(engine(*rules, evidence_limit=8), samples, batch)
    assert event.at == at(0.1)
    assert [(s.signal, s.value) for s in event.evidence] == [
        *[(ANKLE, 1.0)] * 3,
        (ANKLE, 40.0),
        ("knee_torque_nm", 25.0),
    ]
