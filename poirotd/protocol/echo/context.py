"""ECHO's hierarchical context: the session in four layers of detail, by distance from its focus.

The focus (the anchors) is the session's last message, where the failure shows, and every message
that reports an error or a failure. A message's distance is the number of steps to the nearest
anchor, and its layer follows from it as in the paper:
- immediate (distance 0-1): the full text, every reasoning step and tool output;
- local (2-3): the key decision, what the message concluded or chose (about 50 words);
- distant (4-6): a short summary of its outcome, error or hand-off (about 20 words);
- global (beyond): the milestone it reached, if any (about 15 words).
Extraction is by regular expressions, as the paper's default (an LLM per message would cost more
than the analysis). Pure functions: the session in, the layered messages out.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from poirotd.model import AgentMessage

Layer = Literal["immediate", "local", "distant", "global"]
LAYERS: tuple[Layer, ...] = ("immediate", "local", "distant", "global")
# Nearest distance (in steps) of each layer but the first.
_LOCAL_FROM, _DISTANT_FROM, _GLOBAL_FROM = 2, 4, 7
# Words each compressed layer keeps.
_WORDS: dict[Layer, int] = {"local": 50, "distant": 20, "global": 15}
# Anchors that report errors, at most (the earliest are kept: a root cause comes first).
MAX_ERROR_ANCHORS = 6

_SENTENCE = r"([^.!?\n]*[.!?]?)"
_ERROR_SIGNAL = re.compile(
    r"\b(error|exception|traceback|failed|failure|cannot|can't|unable|incorrect|wrong|"
    r"invalid|not found|timed? ?out)\b",
    re.IGNORECASE,
)


def _compiled(*leads: str) -> tuple[re.Pattern[str], ...]:
    """Each lead followed by the rest of its sentence, case-insensitive."""
    return tuple(re.compile(lead + _SENTENCE, re.IGNORECASE) for lead in leads)


# What each compressed layer looks for first, in order; the first sentence when none matches.
_PATTERNS: dict[Layer, tuple[re.Pattern[str], ...]] = {
    # Key decisions: conclusions, choices and the reasons given for them.
    "local": _compiled(
        r"\bI (?:conclude|decide|determine|believe|think|will|chose|choose)\b",
        r"\b(?:therefore|thus|hence|so),?\s",
        r"\bthe (?:answer|result|solution|plan|diagnosis) (?:is|appears to be)",
        r"\b(?:based on|given|according to)\s",
    ),
    # Outcomes: errors, state changes and what was handed over.
    "distant": _compiled(
        r"\b(?:error|failed|failure|cannot|unable|incorrect|wrong)\b",
        r"\b(?:received|obtained|loaded|returned|sent|passing|providing)\b",
        r"\b(?:therefore|thus|hence|in conclusion),?\s",
    ),
    # Milestones: what was completed, produced or switched.
    "global": _compiled(
        r"\b(?:completed|finished|done|achieved|produced|created|generated)\b",
        r"\b(?:switched|changed|moved on|decided)\b",
        r"\b(?:error|failed|failure)\b",
        r"\b(?:successfully|finally)\b",
    ),
}


@dataclass(frozen=True)
class LayeredContext:
    """The session's messages, each with its layer's text as content, in session order."""

    messages: tuple[AgentMessage, ...]
    layers: dict[int, Layer]  # by session index
    anchors: tuple[int, ...]  # session indices

    def in_layer(self, layer: Layer, view: Sequence[AgentMessage]) -> list[AgentMessage]:
        """The messages of `view` (this context, maybe cut to fit) in `layer`."""
        return [m for m in view if self.layers[m.index] == layer]


def anchors_of(messages: Sequence[AgentMessage]) -> tuple[int, ...]:
    """Positions of the focus: the messages reporting an error (the earliest few) and the last."""
    if not messages:
        return ()
    errors = [i for i, m in enumerate(messages) if _ERROR_SIGNAL.search(m.content)]
    return tuple(sorted({*errors[:MAX_ERROR_ANCHORS], len(messages) - 1}))


def layer_at(distance: int) -> Layer:
    if distance < _LOCAL_FROM:
        return "immediate"
    if distance < _DISTANT_FROM:
        return "local"
    return "distant" if distance < _GLOBAL_FROM else "global"


def hierarchical_context(messages: Sequence[AgentMessage]) -> LayeredContext:
    """The session in layers around its anchors (see the module docstring)."""
    anchors = anchors_of(messages)
    layered, layers = [], {}
    for position, message in enumerate(messages):
        layer = layer_at(min(abs(position - a) for a in anchors))
        layers[message.index] = layer
        text = message.content if layer == "immediate" else extract(message.content, layer)
        layered.append(message.model_copy(update={"content": text}))
    return LayeredContext(tuple(layered), layers, tuple(messages[a].index for a in anchors))


def extract(content: str, layer: Layer) -> str:
    """What a compressed layer keeps of a message: the first sentence a pattern of the layer
    matches, else the first sentence, cut to the layer's words ("…" marks a cut)."""
    text = " ".join(content.split())
    if not text:
        return ""
    for pattern in _PATTERNS[layer]:
        found = pattern.search(text)
        if found and found.group(0).strip():
            return _words(found.group(0), _WORDS[layer])
    return _words(re.split(r"(?<=[.!?])\s", text, maxsplit=1)[0], _WORDS[layer])


def _words(text: str, limit: int) -> str:
    words = text.split()
    return " ".join(words[:limit]) + (" …" if len(words) > limit else "")
