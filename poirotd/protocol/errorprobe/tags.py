"""MAST-guided detection: where in the session a known failure mode shows a local symptom.

Two detectors, whose tags are merged (one per step and mode): a taxonomy-conditioned LLM call
over the session (the paper's detector), and a deterministic one for the mode a model misses
most, step repetition (MAST-3): an agent sending again what it sent before. Tags are priors, not
verdicts: they seed the backward trace and the Strategist's search.
"""

from __future__ import annotations

from collections.abc import Sequence

from poirotd.config.spec import SystemSpec
from poirotd.model import AgentMessage, MessageKind, Phase
from poirotd.protocol.errorprobe.prompts import detector_request
from poirotd.protocol.errorprobe.schemas import Tag, tags_format
from poirotd.protocol.errors import AnswerFailedError
from poirotd.protocol.prompts import Incident
from poirotd.protocol.run import CallSite, RunContext
from poirotd.protocol.spotlight import Spotlight

DETECTOR = "errorprobe.detector"
STEP_REPETITION = "MAST-3"
# Shorter messages ("OK", "Done.") repeat without meaning anything.
_REPEAT_MIN_CHARS = 20


def repetitions(messages: Sequence[AgentMessage]) -> list[Tag]:
    """A tag on every agent message whose text (whitespace and case aside) and tool calls
    repeat an earlier message of the same agent."""
    seen: dict[tuple[str, str, tuple[str, ...]], int] = {}
    tags = []
    for m in messages:
        text = " ".join(m.content.split()).casefold()
        if m.kind is not MessageKind.AGENT or len(text) < _REPEAT_MIN_CHARS:
            continue
        key = (m.sender, text, m.tool_calls)
        if key in seen:
            tags.append(Tag(step=m.index, mode=STEP_REPETITION, note=f"repeats #{seen[key]}"))
        else:
            seen[key] = m.index
    return tags


async def detect(
    spec: SystemSpec,
    messages: Sequence[AgentMessage],
    incident: Incident | None,
    spotlight: Spotlight,
    run: RunContext,
) -> tuple[list[Tag], str]:
    """The session's tags in step order, and why the LLM detector gave none ("" when it
    answered, or `max_tags` is 0 and it was not asked): the deterministic tags stand anyway."""
    settings = spec.protocol.errorprobe
    failed, found = "", []
    if settings.max_tags:
        view = await run.fit(
            DETECTOR,
            messages,
            lambda v: detector_request(spec, v, incident, spotlight),
            reserve=settings.role_max_tokens,
        )
        try:
            answer = await run.until_valid(
                CallSite(Phase.DETECTION, DETECTOR, "tags"),
                detector_request(spec, view, incident, spotlight),
                tags_format({m.index for m in view}, settings.max_tags),
                max_tokens=settings.role_max_tokens,
                retries=spec.protocol.invalid_json_retries,
            )
            found = list(answer.tags)
        except AnswerFailedError as exc:
            failed = f"the MAST detector gave no valid tags ({exc})"
    merged: dict[tuple[int, str], Tag] = {}
    for tag in [*found, *repetitions(messages)]:
        merged.setdefault((tag.step, tag.mode), tag)
    return sorted(merged.values(), key=lambda t: (t.step, t.mode)), failed
