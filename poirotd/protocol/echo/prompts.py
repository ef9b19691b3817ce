"""Every prompt of ECHO, in this project's own words.

An analyst's request: the panel's task (system turn), then one user turn with the system, the
regions it may blame, the incident, the session as a hierarchical context (layer by layer, each
message quoted with the investigation's spotlight under its [#N sender → recipient] header), the
analyst's own role and the answer format. The analysts of one panel share everything before their
role, so a backend's prefix cache evaluates the session once per panel, not once per analyst
(with the role in the system turn, SmolLM2 on one core re-read ~8k tokens of a Who&When
Hand-Crafted session for every analyst).
"""

from __future__ import annotations

from collections.abc import Sequence

from poirotd.config.spec import EchoRole, SystemSpec
from poirotd.llm.base import ChatMessage
from poirotd.model import AgentMessage, HazardSpace
from poirotd.protocol import prompts
from poirotd.protocol.analyst import (
    incident_sections,
    levels_text,
    regions_section,
    request,
    system_section,
)
from poirotd.protocol.echo.context import Layer, LayeredContext
from poirotd.protocol.echo.schemas import MAX_ALTERNATIVES
from poirotd.protocol.prompts import Incident
from poirotd.protocol.spotlight import Spotlight

ROLE_FOCUS: dict[EchoRole, str] = {
    "conservative": (
        "You are the CONSERVATIVE analyst. Blame a region only on strong, explicit evidence in "
        "the log. Prefer a single origin to several. Keep your confidence low unless the proof "
        "is unambiguous."
    ),
    "liberal": (
        "You are the LIBERAL analyst. Consider that several regions may share the fault and "
        "look for subtle slips others would overlook. Reasonable evidence is enough to name a "
        "region, with a moderate confidence."
    ),
    "detail_focused": (
        "You are the DETAIL-FOCUSED analyst. Read exact wording, numbers and tool outputs. Look "
        "for small inconsistencies, a value copied wrong, a condition skipped. Concrete evidence "
        "outweighs general impressions."
    ),
    "pattern_focused": (
        "You are the PATTERN-FOCUSED analyst. Follow the chain of reasoning across the session: "
        "where an early assumption was carried forward, where a plan drifted, how one mistake "
        "propagated through later messages."
    ),
    "skeptical": (
        "You are the SKEPTICAL analyst. Question every assumption, including what looks like the "
        "obvious culprit. Look for other explanations and check whether an apparent error was in "
        "fact sound reasoning."
    ),
    "general": (
        "You are the GENERAL analyst. Weigh every kind of evidence evenly and look for the most "
        "obvious, most consequential mistake."
    ),
}

_LAYER_TITLES: dict[Layer, str] = {
    "immediate": "Immediate context: the messages at the focus and their neighbours, in full",
    "local": "Local context (2-3 steps from the focus): each message's key decision",
    "distant": "Distant context (4-6 steps away): each message's outcome in brief",
    "global": "Global context (further away): the milestones reached",
}

_TASK = """\
You investigate a failure of a multi-agent AI system, one analyst on a panel. Each analyst \
works alone and the panel's conclusions are combined afterwards, weighted by each analyst's \
confidence: an honest, calibrated confidence is worth more than a bold one. Your own role on \
the panel is given at the end of the request, after the log.

Your task:
1. Evaluate EVERY region of the system listed in the request: how likely is it that the fault \
originated there (0.0 to 1.0), and what in the log supports that.
2. Conclude: which region (kind "single") or regions (kind "multiple") the fault ORIGINATED \
from, not merely where it showed; the step, the number N of the message [#N ...] where it \
first shows (null if you cannot point to one); your confidence (0.0 to 1.0); your reasoning.
3. Give up to {alternatives} alternative conclusions that remain plausible, in the same shape.

The session is shown in layers: messages at the focus of the incident in full, the others \
compressed the further they are from it. A compressed message may still be where the fault \
began. Rely only on what the log shows."""


def analyst_system() -> str:
    return _TASK.format(alternatives=MAX_ALTERNATIVES)


def analysis_request(
    spec: SystemSpec,
    space: HazardSpace,
    context: LayeredContext,
    view: Sequence[AgentMessage],
    incident: Incident | None,
    spotlight: Spotlight,
    role: EchoRole,
) -> list[ChatMessage]:
    """One analyst's request over `view` (the context's messages, maybe cut to fit)."""
    sections = [
        system_section(spec),
        regions_section(space),
        *incident_sections(incident, spotlight),
    ]
    anchors = ", ".join(f"#{i}" for i in context.anchors) or "none"
    sections.append(f"# The session, in layers around its focus (messages {anchors})")
    for layer, title in _LAYER_TITLES.items():
        shown = context.in_layer(layer, view)
        if shown:
            sections.append(f"## {title}\n\n{prompts.session_log(shown, spotlight)}")
    sections.append(f"# Your role on the panel\n\n{ROLE_FOCUS[role]}")
    return request(
        analyst_system(),
        sections,
        '{"summary": "<how you investigated, what you found>", '
        '"evaluations": [{"region": "<id>", "likelihood": <level>, "evidence": "<from the '
        'log>"}, ...one per region], '
        '"conclusion": {"kind": "single" | "multiple", "regions": ["<id>", ...], '
        '"step": <N> | null, "confidence": <level>, "reasoning": "<why>"}, '
        '"alternatives": [<conclusions in the same shape>]}\n' + levels_text(),
        spotlight,
    )
