"""The model-time floor: busy time, the critical path of dependent calls and its cost at the
speeds the calls showed; and that a run records which calls waited for which."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

import pytest

from poirotd.llm.base import ChatMessage
from poirotd.protocol.model_time import CallTiming, model_time
from tests.support.protocol import Handler, World, ask_once_then_vote, default_report, investigate

# Synthetic speeds: 1,000 prompt tokens/s and 10 generated tokens/s.
PREFILL, DECODE = 1000.0, 10.0


def _served(
    seq: int, after: tuple[int, ...], prompt: int, generated: int, start: float
) -> CallTiming:
    """A call served alone from `start`, taking exactly what the synthetic speeds say."""
    end = start + prompt / PREFILL + generated / DECODE
    return CallTiming(seq, after, prompt, generated, start, end)


def test_a_serial_backend_is_busy_for_every_call_but_the_floor_is_the_longest_chain() -> None:
    # One call, then two agents' chains of two calls each, served one at a time (as the
    # embedded backend does), then a closing call after both chains.
    first = _served(0, (), 1000, 10, 0.0)  # 2 s
    a1 = _served(1, (0,), 2000, 20, 2.0)  # 4 s
    b1 = _served(2, (0,), 1000, 10, 6.0)  # 2 s, queued behind a1 (started at 2.0 for real)
    b1 = CallTiming(2, (0,), 1000, 10, 2.0, b1.end)
    a2 = _served(3, (1,), 3000, 30, 8.0)  # 6 s
    b2 = _served(4, (2,), 1000, 10, 14.0)  # 2 s
    last = _served(5, (3, 4), 1000, 20, 16.0)  # 3 s
    timed = model_time([first, a1, b1, a2, b2, last], wall_seconds=20.0)

    assert timed.busy_seconds == pytest.approx(19.0)
    # Measured on each call's exclusive time, not its wait in the queue.
    assert timed.prefill_tokens_per_second == pytest.approx(PREFILL)
    assert timed.decode_tokens_per_second == pytest.approx(DECODE)
    # first → a1 → a2 → last: 2 + 4 + 6 + 3 s.
    assert timed.critical_path_calls == 4
    assert timed.critical_path_prompt_tokens == 7000
    assert timed.critical_path_completion_tokens == 80
    assert timed.floor_seconds == pytest.approx(15.0)
    assert timed.wall_seconds == 20.0


def test_a_backend_serving_one_call_at_a_time_cannot_beat_its_calls_end_to_end() -> None:
    """The same calls as above: on a backend that serves one at a time, the floor is all of
    them end to end (19 s), the critical path (15 s) still reported beside it; on one serving
    two at once, the critical path is the larger."""
    first = _served(0, (), 1000, 10, 0.0)
    a1 = _served(1, (0,), 2000, 20, 2.0)
    b1 = CallTiming(2, (0,), 1000, 10, 2.0, 8.0)
    a2 = _served(3, (1,), 3000, 30, 8.0)
    b2 = _served(4, (2,), 1000, 10, 14.0)
    last = _served(5, (3, 4), 1000, 20, 16.0)
    calls = [first, a1, b1, a2, b2, last]

    serial = model_time(calls, wall_seconds=20.0, serves_at_once=1)
    assert serial.floor_seconds == pytest.approx(19.0)
    assert serial.critical_path_seconds == pytest.approx(15.0)
    assert serial.serves_at_once == 1
    two = model_time(calls, wall_seconds=20.0, serves_at_once=2)
    assert two.floor_seconds == pytest.approx(15.0)
    unbounded = model_time(calls, wall_seconds=20.0)
    assert unbounded.floor_seconds == pytest.approx(15.0) and unbounded.serves_at_once == 0


def test_no_calls_no_floor() -> None:
    timed = model_time([], wall_seconds=1.5)
    assert (timed.wall_seconds, timed.floor_seconds, timed.critical_path_calls) == (1.5, 0.0, 0)


def _slow(handler: Callable[[str, Sequence[ChatMessage]], str], seconds: float) -> Handler:
    async def slow(agent: str, messages: Sequence[ChatMessage]) -> str:
        await asyncio.sleep(seconds)
        return handler(agent, messages)

    return slow


async def test_a_run_records_which_calls_waited_for_which() -> None:
    """3 agents report at once, then each asks a peer once and votes: 12 calls, but the longest
    chain is one report, the agent's question, the peer's answer and the vote turn (4): the
    answer a peer gives is on its asker's chain, not its own."""
    world = World(
        report=_slow(default_report, 0.02),
        turn=_slow(ask_once_then_vote, 0.02),
        answer=_slow(lambda agent, messages: "The exoskeleton reported 270 degrees.", 0.02),
    )
    outcome = await investigate(world)

    timed = outcome.model_time
    assert outcome.usage.calls == 12
    assert timed.critical_path_calls == 4
    assert timed.floor_seconds > 0 and timed.busy_seconds <= timed.wall_seconds


def test_what_a_call_costs_whatever_its_tokens_is_fitted_and_counted_in_the_floor() -> None:
    """Calls each 0.5 s dearer than their tokens (a grammar set up per call): the fit finds the
    speeds and the 0.5 s, and the serial floor is the calls' whole time."""
    calls, start = [], 0.0
    for seq, (prompt, generated) in enumerate([(1000, 10), (2000, 40), (500, 30), (3000, 5)]):
        end = start + 0.5 + prompt / PREFILL + generated / DECODE
        calls.append(CallTiming(seq, (seq - 1,) if seq else (), prompt, generated, start, end))
        start = end
    timed = model_time(calls, wall_seconds=start, serves_at_once=1)
    assert timed.per_call_seconds == pytest.approx(0.5)
    assert timed.prefill_tokens_per_second == pytest.approx(PREFILL)
    assert timed.decode_tokens_per_second == pytest.approx(DECODE)
    assert timed.floor_seconds == pytest.approx(start) == timed.critical_path_seconds
