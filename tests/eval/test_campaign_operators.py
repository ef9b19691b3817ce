"""Each campaign operator changes exactly what it says and nothing else (property tests)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from poirot_eval.campaigns import agent_faults, signal_faults
from poirot_eval.campaigns.agent_faults import NotApplicableError
from poirot_eval.campaigns.plan import SignalFault
from poirotd.model import AgentMessage, MessageKind, TelemetrySample

START = datetime(2025, 1, 1, tzinfo=UTC)
AGENTS = ("planner", "trader", "checker")
_WORDS = st.sampled_from(["approve", "buy", "the", "plan", "order", "safe", "limit", "ok"])
_NUMBERS = st.integers(min_value=1, max_value=9999).map(str)
_TEXT = st.lists(st.one_of(_WORDS, _NUMBERS), min_size=0, max_size=12).map(" ".join)


@st.composite
def sessions(draw: st.DrawFn) -> tuple[AgentMessage, ...]:
    n = draw(st.integers(min_value=2, max_value=10))
    out = []
    for i in range(n):
        kind = draw(st.sampled_from([MessageKind.AGENT, MessageKind.AGENT, MessageKind.TOOL]))
        sender = draw(st.sampled_from(AGENTS)) if kind is MessageKind.AGENT else "tool:search"
        recipient = draw(st.sampled_from(AGENTS)) if kind is MessageKind.TOOL else ""
        out.append(
            AgentMessage(
                session_id="s",
                index=i,
                kind=kind,
                sender=sender,
                recipient=recipient,
                content=draw(_TEXT),
                sent_at=START + timedelta(seconds=i),
            )
        )
    return tuple(out)


def _same_but_index(a: AgentMessage, b: AgentMessage) -> bool:
    return a.model_copy(update={"index": 0}) == b.model_copy(update={"index": 0})


def _assert_contiguous(messages: tuple[AgentMessage, ...]) -> None:
    assert [m.index for m in messages] == list(range(len(messages)))


@settings(max_examples=200, deadline=None)
@given(sessions(), st.data())
def test_change_number_changes_one_number_of_one_message(
    messages: tuple[AgentMessage, ...], data: st.DataObject
) -> None:
    t = data.draw(st.integers(0, len(messages) - 1))
    try:
        hit = agent_faults.change_number(messages, t, number=0, factor=10.0, value=None)
    except NotApplicableError:
        assert messages[t].kind is not MessageKind.AGENT or not any(
            c.isdigit() for c in messages[t].content
        )
        return
    assert hit.step == t and hit.region == messages[t].sender
    assert len(hit.messages) == len(messages)
    for i, (old, new) in enumerate(zip(messages, hit.messages, strict=True)):
        if i != t:
            assert old == new
    old_words, new_words = messages[t].content.split(" "), hit.messages[t].content.split(" ")
    changed = [(a, b) for a, b in zip(old_words, new_words, strict=True) if a != b]
    assert changed == [(hit.before, hit.after)]
    assert int(hit.after) == int(hit.before) * 10
    assert hit.messages[t].model_copy(update={"content": ""}) == messages[t].model_copy(
        update={"content": ""}
    )


@settings(max_examples=200, deadline=None)
@given(sessions(), st.data())
def test_reverse_decision_swaps_one_word(
    messages: tuple[AgentMessage, ...], data: st.DataObject
) -> None:
    t = data.draw(st.integers(0, len(messages) - 1))
    try:
        hit = agent_faults.reverse_decision(messages, t)
    except NotApplicableError:
        return
    assert {hit.before.lower(), hit.after.lower()} in ({"approve", "reject"}, {"buy", "sell"},
                                                       {"safe", "unsafe"})  # fmt: skip
    for i, (old, new) in enumerate(zip(messages, hit.messages, strict=True)):
        assert (old == new) == (i != t)
    assert hit.messages[t].content == messages[t].content.replace(hit.before, hit.after, 1)


@settings(max_examples=200, deadline=None)
@given(sessions(), st.data())
def test_repeat_step_inserts_one_copy(
    messages: tuple[AgentMessage, ...], data: st.DataObject
) -> None:
    t = data.draw(st.integers(0, len(messages) - 1))
    try:
        hit = agent_faults.repeat_step(messages, t)
    except NotApplicableError:
        assert messages[t].kind is not MessageKind.AGENT
        return
    _assert_contiguous(hit.messages)
    assert len(hit.messages) == len(messages) + 1 and hit.step == t + 1
    rest = hit.messages[: t + 1] + hit.messages[t + 2 :]
    assert all(_same_but_index(a, b) for a, b in zip(rest, messages, strict=True))
    copy = hit.messages[t + 1]
    assert copy.content == messages[t].content and copy.sender == messages[t].sender


@settings(max_examples=200, deadline=None)
@given(sessions(), st.data())
def test_withhold_and_drop_remove_exactly_one_message(
    messages: tuple[AgentMessage, ...], data: st.DataObject
) -> None:
    t = data.draw(st.integers(0, len(messages) - 1))
    for operator in (agent_faults.withhold_message, agent_faults.drop_tool_result):
        try:
            hit = operator(messages, t)
        except NotApplicableError:
            continue
        _assert_contiguous(hit.messages)
        kept = messages[:t] + messages[t + 1 :]
        assert all(_same_but_index(a, b) for a, b in zip(hit.messages, kept, strict=True))
        assert len(hit.messages) == len(messages) - 1
        if operator is agent_faults.drop_tool_result:
            # The failure shows at the calling agent's next message.
            assert hit.messages[hit.step].sender == messages[t].recipient == hit.region
        else:
            assert hit.region == messages[t].sender and hit.step == t


@settings(max_examples=100, deadline=None)
@given(sessions(), st.data())
def test_end_early_cuts_after_the_step(
    messages: tuple[AgentMessage, ...], data: st.DataObject
) -> None:
    t = data.draw(st.integers(0, len(messages) - 1))
    try:
        hit = agent_faults.end_early(messages, t)
    except NotApplicableError:
        return
    assert hit.messages == messages[: t + 1] and hit.ends_session


def test_change_number_keeps_the_written_form() -> None:
    messages = (
        AgentMessage(
            session_id="s",
            index=0,
            kind=MessageKind.AGENT,
            sender="doctor",
            content="proprioception (4/8), VO2max 23.5",
            sent_at=START,
        ),
    )
    hit = agent_faults.change_number(messages, 0, number=2, factor=2.0, value=None)
    assert hit.messages[0].content == "proprioception (4/8), VO2max 47.0"
    set_to = agent_faults.change_number(messages, 0, number=0, factor=1.0, value=2)
    assert set_to.messages[0].content == "proprioception (2/8), VO2max 23.5"
    with pytest.raises(NotApplicableError, match="3 numbers"):
        agent_faults.change_number(messages, 0, number=3, factor=2.0, value=None)


# ------------------------------------------------------------------ signals

SIGNALS = ("a", "b")


def _telemetry(n: int) -> tuple[TelemetrySample, ...]:
    return tuple(
        TelemetrySample(
            session_id="s",
            component=component,
            signal=signal,
            value=float(i % 7) + 1.0,
            measured_at=START + timedelta(seconds=i),
        )
        for i in range(n)
        for component in ("exo", "other")
        for signal in SIGNALS
    )


_HARDWARE = st.sampled_from(["offset", "gain", "stuck", "dropout", "spike", "drift", "noise"])


@settings(max_examples=150, deadline=None)
@given(
    _HARDWARE,
    st.floats(min_value=0.0, max_value=0.9),
    st.one_of(st.none(), st.floats(min_value=0.5, max_value=10.0)),
    st.floats(min_value=-5.0, max_value=5.0).filter(lambda m: abs(m) > 0.01),
)
def test_signal_operators_touch_only_their_signal_in_the_window(
    operator: str, start: float, duration: float | None, magnitude: float
) -> None:
    telemetry = _telemetry(20)
    fault = SignalFault.model_validate(
        {
            "operator": operator,
            "component": "exo",
            "signal": "a",
            "start_fraction": start,
            "duration_s": duration,
            "magnitude": magnitude,
            "value": -50.0 if operator == "stuck" else None,
        }
    )
    try:
        hit = signal_faults.inject(fault, (), telemetry)
    except NotApplicableError:
        return
    onset, end = signal_faults.window(fault, (), telemetry)
    assert hit.onset == onset

    def struck(s: TelemetrySample) -> bool:
        return s.component == "exo" and s.signal == "a" and onset <= s.measured_at < end

    untouched = [s for s in telemetry if not struck(s)]
    assert [s for s in hit.telemetry if not struck(s)] == untouched
    before = [s for s in telemetry if struck(s)]
    after = [s for s in hit.telemetry if struck(s)]
    if operator == "dropout":
        assert after == []
        return
    assert [s.measured_at for s in after] == [s.measured_at for s in before]
    deltas = [b.value - a.value for a, b in zip(before, after, strict=True)]
    if operator == "offset":
        assert all(d == pytest.approx(magnitude) for d in deltas)
    elif operator == "gain":
        assert all(
            b.value == pytest.approx(a.value * magnitude)
            for a, b in zip(before, after, strict=False)
        )
    elif operator == "stuck":
        assert all(b.value == -50.0 for b in after)
    elif operator == "spike":
        assert deltas[0] == pytest.approx(magnitude) and all(d == 0 for d in deltas[1:])
    elif operator == "drift":
        seconds = [(a.measured_at - onset).total_seconds() for a in before]
        assert deltas == pytest.approx([magnitude * s for s in seconds])


def _book() -> tuple[TelemetrySample, ...]:
    out = []
    for i in range(10):
        at = START + timedelta(seconds=i)
        price = 100.0 + i
        for field, value in (("price", price), ("bid", price - 0.02), ("ask", price + 0.02),
                             ("spread", 0.04), ("volume", 100.0)):  # fmt: skip
            out.append(TelemetrySample(session_id="s", component="feed", signal=f"X.{field}",
                                       value=value, measured_at=at))  # fmt: skip
    return tuple(out)


def test_feed_operators() -> None:
    book = _book()
    crossed = signal_faults.inject(
        SignalFault(operator="crossed_book", component="feed", signal="X", start_fraction=0.5),
        (),
        book,
    )
    late = [s for s in crossed.telemetry if s.measured_at >= crossed.onset]
    by = {(s.measured_at, s.signal): s.value for s in late}
    for at in {s.measured_at for s in late}:
        assert by[(at, "X.bid")] > by[(at, "X.ask")] and by[(at, "X.spread")] < 0
        assert by[(at, "X.price")] == next(
            s.value for s in book if s.measured_at == at and s.signal == "X.price"
        )
    stale = signal_faults.inject(
        SignalFault(operator="stale_price", component="feed", signal="X", start_fraction=0.5),
        (),
        book,
    )
    held = [s for s in stale.telemetry if s.measured_at >= stale.onset]
    assert {s.value for s in held if s.signal == "X.price"} == {104.0}
    assert {s.value for s in held if s.signal == "X.volume"} == {0.0}
    spike = signal_faults.inject(
        SignalFault(operator="price_spike", component="feed", signal="X", magnitude=0.1),
        (),
        book,
    )
    changed = [(a, b) for a, b in zip(book, spike.telemetry, strict=True) if a != b]
    assert len(changed) == 1 and changed[0][1].value == pytest.approx(changed[0][0].value * 1.1)


def test_a_fault_that_changes_nothing_is_not_applicable() -> None:
    constant = tuple(
        TelemetrySample(
            session_id="s",
            component="exo",
            signal="a",
            value=6.0,
            measured_at=START + timedelta(seconds=i),
        )
        for i in range(10)
    )
    for fault in (
        SignalFault(operator="stuck", component="exo", signal="a"),
        SignalFault(operator="delay", component="exo", signal="a", magnitude=2),
    ):
        with pytest.raises(NotApplicableError, match="as it was"):
            signal_faults.inject(fault, (), constant)
    with pytest.raises(NotApplicableError, match="no sample"):
        signal_faults.inject(
            SignalFault(operator="stuck", component="exo", signal="zz"), (), constant
        )
