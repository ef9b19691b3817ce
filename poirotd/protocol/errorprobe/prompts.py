"""Every prompt of ErrorProbe, in this project's own words: the MAST detector, then the three
roles of the diagnosis (Strategist, Investigator, Arbiter).

Each request is the team's system turn (the same for every role) and one user turn: what the
system is (with the regions and the incident where the role needs them), then the material of
the role (the session or its
causal chain, tags, memory, hypotheses, checked evidence), then the role and its rules, then
the answer format. The role comes after the material so that the Strategist's and the
Investigators' requests share their prompt up to the end of the causal chain: a prefix cache
(vLLM's, llama.cpp's) evaluates the chain once for the whole diagnosis. Every text the session
or a model wrote (messages, the incident, tag notes, remembered guards, claims, assessments) is
quoted with the investigation's spotlight under a header built outside the quote.
"""

from __future__ import annotations

from collections.abc import Sequence

from poirotd.config.spec import SystemSpec
from poirotd.llm.base import ChatMessage
from poirotd.model import AgentMessage, DiagnosisMemoryEntry, HazardSpace
from poirotd.protocol import prompts
from poirotd.protocol.analyst import (
    incident_sections,
    levels_text,
    regions_section,
    request,
    system_section,
)
from poirotd.protocol.errorprobe.mast import mode_named, taxonomy_text
from poirotd.protocol.errorprobe.schemas import Hypothesis, Tag
from poirotd.protocol.errorprobe.tools import MIN_QUOTE_CHARS, CheckedClaim
from poirotd.protocol.prompts import Incident
from poirotd.protocol.spotlight import Spotlight

_TEAM = """\
You are a member of a diagnosis team that finds out which part of a multi-agent AI system \
caused a failure. The team has four roles: a DETECTOR tags symptoms of known failure modes in \
the log, a STRATEGIST proposes hypotheses about the fault's origin, an INVESTIGATOR tests one \
hypothesis with evidence the monitoring system checks, and an ARBITER upholds the best-supported \
hypothesis. The material of your task comes first; your role and its rules follow it, just \
before the answer format."""

_DETECTOR = """\
You are the DETECTOR. You screen the log of a multi-agent AI system for local symptoms of known \
failure modes. You do not decide who caused the failure: you point at steps where something \
looks off, so that the diagnosis that follows knows where to look. Tag only what the log \
shows; no tags is a valid answer."""

_STRATEGIST = """\
You are the STRATEGIST of a diagnosis team investigating a failure of a multi-agent AI system. \
From the causal chain of the failure (the messages that could have influenced it), the failure \
mode tags a detector put on it, and failure patterns verified in earlier investigations, you \
propose hypotheses: WHERE the fault originated (a region of the system), at WHICH step it was \
introduced (not where its symptom showed), and which failure mode it is. An Investigator will \
have to prove each hypothesis from the log, so make claims that can be checked."""

_INVESTIGATOR = """\
You are the INVESTIGATOR of a diagnosis team. You test ONE hypothesis about a failure of a \
multi-agent AI system, and you may not merely assert it: every piece of evidence is a claim \
that the monitoring system checks itself against the stored log and telemetry. A claim that \
does not check out counts against the hypothesis, so claim only what the log really says."""

_ARBITER = """\
You are the ARBITER of a diagnosis team. You receive the hypotheses about a failure of a \
multi-agent AI system and, for each, the evidence an Investigator claimed with the result of \
the system's own check of every claim. Uphold the hypothesis the CHECKED evidence supports best; \
a claim that failed its check is no evidence. Then state a guard: what a future diagnosis of \
this kind of failure should check first."""


def detector_request(
    spec: SystemSpec,
    view: Sequence[AgentMessage],
    incident: Incident | None,
    spotlight: Spotlight,
) -> list[ChatMessage]:
    sections = [
        system_section(spec),
        *incident_sections(incident, spotlight),
        f"# The session\n\n{prompts.session_log(view, spotlight)}",
        f"# Failure modes (MAST)\n\n{taxonomy_text()}",
        _role(_DETECTOR),
    ]
    return request(
        _TEAM,
        sections,
        '{"tags": [{"step": <N of the message [#N ...]>, "mode": "<MAST id>", '
        '"note": "<what looks off there>"}, ...]}',
        spotlight,
    )


def strategist_request(
    spec: SystemSpec,
    space: HazardSpace,
    chain: Sequence[AgentMessage],
    masked: int,
    incident: Incident | None,
    spotlight: Spotlight,
    tags: Sequence[Tag],
    recipes: Sequence[DiagnosisMemoryEntry],
) -> list[ChatMessage]:
    tagged = "\n".join(f"- #{t.step}: {t.mode} {mode_named(t.mode).name}: {t.note}" for t in tags)
    remembered = "\n".join(
        f"- {e.signature.mode} {mode_named(e.signature.mode).name}, blamed on "
        f"{e.signature.agent}{f' with tool {e.signature.tool}' if e.signature.tool else ''}: "
        f"{e.recipe}"
        for e in recipes
    )
    sections = [
        system_section(spec),
        regions_section(space),
        *incident_sections(incident, spotlight),
        _chain(chain, masked, spotlight),
        "# Failure mode tags\n\n"
        f"{spotlight.quote(tagged) if tagged else '(the detector tagged nothing)'}",
        "# Verified patterns from earlier investigations\n\n"
        + (
            spotlight.quote(remembered)
            if remembered
            else "(none similar enough: reason from first principles)"
        ),
        f"# Failure modes (MAST)\n\n{taxonomy_text()}",
        _role(_STRATEGIST),
    ]
    return request(
        _TEAM,
        sections,
        '{"hypotheses": [{"region": "<region id>", "step": <N>, "mode": "<MAST id>", '
        '"claim": "<what went wrong there, checkably>"}, ...]}',
        spotlight,
    )


def investigator_request(
    spec: SystemSpec,
    space: HazardSpace,
    chain: Sequence[AgentMessage],
    masked: int,
    incident: Incident | None,
    hypothesis: Hypothesis,
    tools: Sequence[str],
    spotlight: Spotlight,
) -> list[ChatMessage]:
    mode = mode_named(hypothesis.mode)
    offered = {
        "quote": (
            '{"tool": "quote", "step": <N>, "text": "<words copied exactly from message #N, at '
            f'least {MIN_QUOTE_CHARS} characters>"}}: passes when message #N contains them'
        ),
        "tool_result": (
            '{"tool": "tool_result", "step": <N of a message that called a tool>, "expect": '
            '"missing" | "error" | "contains", "text": "<for contains>"}: passes when the '
            "call's result is missing, reports an error, or contains the text"
        ),
        "telemetry": (
            '{"tool": "telemetry", "component": "<id>", "signal": "<name>", "comparison": '
            '">" | ">=" | "<" | "<=", "threshold": <number>}: passes when some reading of '
            "the signal in the session meets the condition"
        ),
    }
    sections = [
        system_section(spec),
        regions_section(space),
        *incident_sections(incident, spotlight),
        _chain(chain, masked, spotlight),
        "# The hypothesis to test\n\n"
        f"Region {hypothesis.region}, step #{hypothesis.step}, failure mode {mode.id} "
        f"{mode.name} ({mode.description})\nClaim:\n{spotlight.quote(hypothesis.claim)}",
        "# Your tools (each claim is checked by the system)\n\n"
        + "\n".join(f"- {offered[tool]}" for tool in tools),
        _role(_INVESTIGATOR),
    ]
    return request(
        _TEAM,
        sections,
        '{"claims": [<claims, as above>], "assessment": "<does the evidence support the '
        'hypothesis, and why>"}',
        spotlight,
    )


def arbiter_request(
    spec: SystemSpec,
    space: HazardSpace,
    hypotheses: Sequence[Hypothesis],
    checked: Sequence[Sequence[CheckedClaim]],
    assessments: Sequence[str],
    choices: Sequence[int],
    spotlight: Spotlight,
) -> list[ChatMessage]:
    blocks = []
    for number, (h, claims, assessment) in enumerate(
        zip(hypotheses, checked, assessments, strict=True), start=1
    ):
        mode = mode_named(h.mode)
        # The claims and the assessment are the Investigator's words and a check's detail may
        # cite the session: all of it is quoted, under the daemon's own PASSED / FAILED.
        results = "\n".join(
            f"- [{'PASSED' if c.passed else 'FAILED'}]\n"
            + spotlight.quote(f"{c.claim.model_dump_json()}: {c.detail}")
            for c in claims
        )
        blocks.append(
            f"## Hypothesis {number}: region {h.region}, step #{h.step}, {mode.id} {mode.name}"
            f"\nClaim:\n{spotlight.quote(h.claim)}\nEvidence checked:\n"
            f"{results or '(no evidence)'}\nInvestigator's assessment:\n"
            f"{spotlight.quote(assessment) if assessment else '(none)'}"
        )
    sections = [
        system_section(spec),
        regions_section(space),
        "# Hypotheses and their checked evidence\n\n" + "\n\n".join(blocks),
        _role(_ARBITER),
    ]
    return request(
        _TEAM,
        sections,
        f'{{"hypothesis": <one of {list(choices)}>, "confidence": <level>, "reasoning": '
        '"<why this one>", "guard": "<what a future diagnosis should check for this kind of '
        f'failure>"}}\n{levels_text()}',
        spotlight,
    )


def _role(text: str) -> str:
    return f"# Your role\n\n{text}"


def _chain(chain: Sequence[AgentMessage], masked: int, spotlight: Spotlight) -> str:
    note = f" ({masked} messages that could not have influenced it are masked)" if masked else ""
    log = prompts.session_log(chain, spotlight)
    return f"# The causal chain of the failure{note}\n\n{log}"
