"""The context-budget policy: how a session view is cut, on the record, when a prompt built from
it would not fit the model's context window. Never a silent truncation. Pure: the caller counts.

The cuts, in order, each making the prompt smaller:
1. shorten long message bodies, keeping head and tail around a marker that says how much was
   cut: tool outputs first, then any other body, longest first;
2. drop middle messages that are neither the viewer's own nor addressed to it (broadcasts by
   others; for the baseline, whose viewer is "", any middle message), oldest first, since the
   turns near the incident tend to matter most;
3. as a last resort, drop the viewer's own middle messages and those addressed to it, oldest
   first: an agent that said a great deal (an orchestrator of a long Who&When Hand-Crafted run)
   still votes on its latest turns rather than not at all.
The first and the last message of the view are never dropped. The fewest cuts that fit are
found by bisection. When even every cut is not enough, the view is returned whole and `fits` is
False: its requests then fail with context_exceeded, like any request too long for the model.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from poirotd.model import AgentMessage, ContextCut, MessageKind

# A shortened body keeps this much of its start and of its end; shorter bodies stay whole.
HEAD_CHARS = 600
TAIL_CHARS = 300
SHORTEN_OVER = 1200


@dataclass(frozen=True)
class FittedView:
    messages: tuple[AgentMessage, ...]
    cuts: tuple[ContextCut, ...]
    fits: bool
    # What `tokens` measured for `messages`.
    tokens: int


@dataclass(frozen=True)
class _Cut:
    position: int  # in the view
    action: Literal["dropped", "shortened"]


def marker(chars: int) -> str:
    return f"[… {chars} chars cut by poirotd …]"


def shorten(text: str) -> str:
    """Head and tail of `text` around a marker naming how many characters were cut."""
    cut = len(text) - HEAD_CHARS - TAIL_CHARS
    return f"{text[:HEAD_CHARS]}\n{marker(cut)}\n{text[-TAIL_CHARS:]}"


def fit_view(
    viewer: str,
    view: Sequence[AgentMessage],
    tokens: Callable[[Sequence[AgentMessage]], int],
    limit: int,
) -> FittedView:
    """`view` (the messages `viewer` saw, in session order) with the fewest cuts that bring
    `tokens(view)` (the whole prompt and what the answer may take) within `limit`."""
    measured: dict[int, tuple[tuple[AgentMessage, ...], tuple[ContextCut, ...], int]] = {}
    plan = _plan(viewer, view)

    def with_cuts(k: int) -> tuple[tuple[AgentMessage, ...], tuple[ContextCut, ...], int]:
        if k not in measured:
            messages, cuts = _apply(viewer, view, plan[:k])
            measured[k] = (messages, cuts, tokens(messages))
        return measured[k]

    if with_cuts(0)[2] > limit and with_cuts(len(plan))[2] > limit:
        return FittedView(tuple(view), (), fits=False, tokens=with_cuts(0)[2])
    low, high = 0, len(plan)  # invariant: `high` cuts fit, `low` cuts do not (or low == high)
    while low < high:
        middle = (low + high) // 2
        if with_cuts(middle)[2] <= limit:
            high = middle
        else:
            low = middle + 1
    messages, cuts, count = with_cuts(high)
    return FittedView(messages, cuts, fits=True, tokens=count)


def _plan(viewer: str, view: Sequence[AgentMessage]) -> list[_Cut]:
    long = [i for i, m in enumerate(view) if len(m.content) > SHORTEN_OVER]
    long.sort(key=lambda i: (view[i].kind is not MessageKind.TOOL, -len(view[i].content), i))
    middle = range(1, len(view) - 1)
    others = [i for i in middle if not _concerns(viewer, view[i])]
    own = [i for i in middle if _concerns(viewer, view[i])]
    return [_Cut(i, "shortened") for i in long] + [_Cut(i, "dropped") for i in others + own]


def _concerns(viewer: str, m: AgentMessage) -> bool:
    """The viewer's own messages and those addressed to it: dropped only when nothing else is
    left to cut."""
    return bool(viewer) and viewer in (m.sender, m.recipient)


def _apply(
    viewer: str, view: Sequence[AgentMessage], plan: Sequence[_Cut]
) -> tuple[tuple[AgentMessage, ...], tuple[ContextCut, ...]]:
    """The view with the `plan` cuts made, and their records; a dropped message that was also
    shortened is recorded once, as dropped, with its original length."""
    dropped = {c.position for c in plan if c.action == "dropped"}
    shortened = {c.position for c in plan if c.action == "shortened"} - dropped
    kept: list[AgentMessage] = []
    cuts: list[ContextCut] = []
    for i, m in enumerate(view):
        before = len(m.content)
        if i in dropped:
            cuts.append(
                ContextCut(
                    agent_id=viewer,
                    index=m.index,
                    action="dropped",
                    chars_before=before,
                    chars_after=0,
                )
            )
        elif i in shortened:
            short = shorten(m.content)
            cuts.append(
                ContextCut(
                    agent_id=viewer,
                    index=m.index,
                    action="shortened",
                    chars_before=before,
                    chars_after=len(short),
                )
            )
            kept.append(m.model_copy(update={"content": short}))
        else:
            kept.append(m)
    return tuple(kept), tuple(cuts)
