"""The context-budget policy alone: what is cut, in which order, and how it is recorded."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

from poirotd.model import AgentMessage, ContextCut, MessageKind
from poirotd.protocol.context_budget import (
    HEAD_CHARS,
    SHORTEN_OVER,
    TAIL_CHARS,
    fit_view,
    marker,
)

LONG = SHORTEN_OVER * 3


def msg(index: int, kind: MessageKind, sender: str, recipient: str, size: int) -> AgentMessage:
    return AgentMessage(
        session_id="s",
        index=index,
        kind=kind,
        sender=sender,
        recipient=recipient,
        content="x" * size,
        sent_at=datetime(2025, 1, 1, tzinfo=UTC),
    )


# The view of agent "a": first and last are broadcasts by others, so only the rule keeps them.
VIEW = (
    msg(0, MessageKind.HUMAN, "operator", "", 100),
    msg(1, MessageKind.AGENT, "b", "", LONG),  # a long broadcast by a peer
    msg(2, MessageKind.TOOL, "a", "a", LONG),  # a's tool output
    msg(3, MessageKind.AGENT, "a", "b", 200),  # a's own message
    msg(4, MessageKind.AGENT, "b", "a", 300),  # addressed to a
    msg(5, MessageKind.AGENT, "c", "", 400),  # a broadcast by a peer
    msg(6, MessageKind.AGENT, "c", "", 500),
)
SHORT = HEAD_CHARS + TAIL_CHARS + len(marker(LONG - HEAD_CHARS - TAIL_CHARS)) + 2


def chars(view: Sequence[AgentMessage]) -> int:
    return sum(len(m.content) for m in view)


def fit(limit: int, viewer: str = "a") -> tuple[list[tuple[int, str]], list[int]]:
    fitted = fit_view(viewer, VIEW, chars, limit)
    assert fitted.fits and fitted.tokens == chars(fitted.messages) <= limit
    return [(c.index, c.action) for c in fitted.cuts], [m.index for m in fitted.messages]


def test_nothing_is_cut_when_the_prompt_fits() -> None:
    fitted = fit_view("a", VIEW, chars, chars(VIEW))
    assert fitted.fits and fitted.cuts == () and fitted.messages == VIEW


def test_tool_outputs_are_shortened_first_keeping_head_and_tail() -> None:
    fitted = fit_view("a", VIEW, chars, chars(VIEW) - 1)
    assert fitted.cuts == (
        ContextCut(agent_id="a", index=2, action="shortened", chars_before=LONG, chars_after=SHORT),
    )
    tool = fitted.messages[2].content
    assert (
        tool == f"{'x' * HEAD_CHARS}\n{marker(LONG - HEAD_CHARS - TAIL_CHARS)}\n{'x' * TAIL_CHARS}"
    )
    assert "chars cut by poirotd" in tool
    assert [m.index for m in fitted.messages] == list(range(7))


def test_then_other_long_bodies_then_middle_turns_oldest_first() -> None:
    shortened_both = chars(VIEW) - 2 * (LONG - SHORT)
    assert fit(shortened_both) == ([(1, "shortened"), (2, "shortened")], list(range(7)))
    # Next the middle messages that are neither a's own nor addressed to it: #1, then #5.
    cuts, kept = fit(shortened_both - SHORT)
    assert cuts == [(1, "dropped"), (2, "shortened")] and kept == [0, 2, 3, 4, 5, 6]
    cuts, kept = fit(shortened_both - SHORT - 400)
    assert cuts == [(1, "dropped"), (2, "shortened"), (5, "dropped")]
    assert kept == [0, 2, 3, 4, 6]  # first and last kept, a's own (#3) and to-a (#4) kept


def test_a_dropped_message_is_recorded_once_with_its_original_length() -> None:
    fitted = fit_view("a", VIEW, chars, chars(VIEW) - 2 * (LONG - SHORT) - SHORT)
    dropped = next(c for c in fitted.cuts if c.index == 1)
    assert (dropped.action, dropped.chars_before, dropped.chars_after) == ("dropped", LONG, 0)


def test_the_baseline_viewer_may_lose_any_middle_turn() -> None:
    everything_but_ends = 100 + 500 + 1
    cuts, kept = fit(everything_but_ends, viewer="")
    assert kept == [0, 6]
    assert {i for i, action in cuts if action == "dropped"} == {1, 2, 3, 4, 5}


def test_last_the_viewers_own_and_addressed_turns_oldest_first() -> None:
    others_dropped = 100 + SHORT + 200 + 300 + 500  # #0, #2 shortened, #3, #4, #6
    cuts, kept = fit(others_dropped - 1)
    assert (2, "dropped") in cuts and kept == [0, 3, 4, 6]  # a's tool output, the oldest
    cuts, kept = fit(100 + 300 + 500)
    assert kept == [0, 4, 6] and (3, "dropped") in cuts
    cuts, kept = fit(100 + 500)
    assert kept == [0, 6], "first and last are kept"


def test_a_view_that_cannot_fit_is_left_whole_and_says_so() -> None:
    fitted = fit_view("a", VIEW, chars, 100)
    assert not fitted.fits
    assert fitted.messages == VIEW and fitted.cuts == ()
    assert fitted.tokens == chars(VIEW)
