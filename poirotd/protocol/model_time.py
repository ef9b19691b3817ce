"""The model-time floor: how much of an investigation's wall time the model's calls force.

Each call is recorded with the calls it waited for (`CallTiming.after`: the last calls of the code
path that made it, joined where concurrent branches meet, see run.py). The critical path is the
costliest chain through that graph; its cost is what the chain's tokens take at the speeds the run's
own calls showed. The floor is that cost, or, on a backend that serves at most n calls at once,
every call's cost over n when that is more: a backend serving one call at a time (the embedded one)
cannot finish the calls sooner than one after the other, however they depend. Speeds are measured on
each call's exclusive time (the part of its interval no earlier-ending call covers): on a backend
that serves one call at a time (the embedded one) that is its service time, not its wait in the
queue; on a server that batches, it understates a call's time, so the floor errs low, never
flattering the wall time against it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from poirotd.model import ModelTime


@dataclass(frozen=True)
class CallTiming:
    """One LLM call as the floor needs it; `start`/`end` on the monotonic clock."""

    seq: int
    # The calls this one waited for (their seq), none for the run's first.
    after: tuple[int, ...]
    uncached_prompt_tokens: int
    completion_tokens: int
    start: float
    end: float


def model_time(
    calls: Sequence[CallTiming], wall_seconds: float, serves_at_once: int | None = None
) -> ModelTime:
    """The summary the investigation record keeps (ModelTime). `serves_at_once`: how many calls
    the backend runs side by side (None: as many as come)."""
    at_once = serves_at_once or 0
    if not calls:
        return ModelTime(wall_seconds=wall_seconds, serves_at_once=at_once)
    exclusive = _exclusive_seconds(calls)
    prefill, decode, per_call = _speeds(calls, exclusive)
    cost = {c.seq: per_call + _cost(c, prefill, decode) for c in calls}
    path = _critical_path(calls, cost)
    critical = sum(cost[c.seq] for c in path)
    one_by_one = sum(cost.values()) / at_once if at_once else 0.0
    return ModelTime(
        wall_seconds=wall_seconds,
        busy_seconds=sum(exclusive.values()),
        critical_path_calls=len(path),
        critical_path_prompt_tokens=sum(c.uncached_prompt_tokens for c in path),
        critical_path_completion_tokens=sum(c.completion_tokens for c in path),
        prefill_tokens_per_second=prefill,
        decode_tokens_per_second=decode,
        per_call_seconds=per_call,
        critical_path_seconds=critical,
        serves_at_once=at_once,
        floor_seconds=max(critical, one_by_one),
    )


def _exclusive_seconds(calls: Sequence[CallTiming]) -> dict[int, float]:
    """Each call's part of the busy time: its interval less what calls ending before it
    covered. Their sum is the union of the intervals."""
    exclusive, covered = {}, float("-inf")
    for call in sorted(calls, key=lambda c: c.end):
        exclusive[call.seq] = max(0.0, call.end - max(call.start, covered))
        covered = max(covered, call.end)
    return exclusive


def _speeds(calls: Sequence[CallTiming], exclusive: dict[int, float]) -> tuple[float, float, float]:
    """Prefill and decode tokens per second and the seconds a call costs whatever its tokens
    (the embedded backend's grammar and prefix-state set-up, a server's round trip): the
    least-squares fit of seconds = per_call + prompt / prefill + completion / decode over the
    calls' exclusive times. A term the fit makes negative (too few or too alike calls) is left
    out and the others refitted."""
    columns = np.array(
        [[c.uncached_prompt_tokens, c.completion_tokens, 1.0] for c in calls], dtype=np.float64
    )
    seconds = np.array([exclusive[c.seq] for c in calls], dtype=np.float64)
    fitted = np.zeros(3)
    kept = [0, 1, 2]
    while kept:
        found, *_ = np.linalg.lstsq(columns[:, kept], seconds, rcond=None)
        if (found > 0).all():
            fitted[kept] = found
            break
        kept = [k for k, f in zip(kept, found, strict=True) if f > 0]
    rate = [1.0 / float(t) if t > 0 else 0.0 for t in fitted[:2]]
    return rate[0], rate[1], float(fitted[2])


def _cost(call: CallTiming, prefill: float, decode: float) -> float:
    prompt = call.uncached_prompt_tokens / prefill if prefill else 0.0
    return prompt + (call.completion_tokens / decode if decode else 0.0)


def _critical_path(calls: Sequence[CallTiming], cost: dict[int, float]) -> list[CallTiming]:
    """The costliest chain of dependent calls, the longer one where costs tie (calls too fast
    to measure). A call waits only for calls made before it, so seq order is a topological
    order of the graph."""
    by_seq = {c.seq: c for c in calls}
    # Per call: (cost of the best chain ending with it, its length), and the call before it.
    best: dict[int, tuple[tuple[float, int], int | None]] = {}
    for call in sorted(calls, key=lambda c: c.seq):
        before = [(best[s][0], s) for s in call.after if s in best]
        (total, length), parent = max(before, default=((0.0, 0), None))
        best[call.seq] = ((total + cost[call.seq], length + 1), parent)
    seq: int | None = max(best, key=lambda s: best[s][0])
    path = []
    while seq is not None:
        path.append(by_seq[seq])
        seq = best[seq][1]
    return path[::-1]
