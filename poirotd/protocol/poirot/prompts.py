"""Every prompt of POIROT, in this project's own words, laid out for the prefix cache.

The paper's structure, fields, rules and order of information are kept (Supplementary
Information A); the wording is ours. Every request of an agent starts with its `agent_prefix`
(poirotd/protocol/prompts.py) and these phase texts follow it, so the server prefills the
session once per agent and reuses it for the agent's report, turns, answers and vote. The phase
texts are deterministic for a given investigation (spec order, no clocks), so an agent's
successive requests differ only by what was appended. Texts a model wrote (reports, questions,
answers) are quoted with the investigation's spotlight.
"""

from __future__ import annotations

from collections.abc import Mapping

from poirotd.config.spec import AgentSpec, SystemSpec
from poirotd.llm.base import ChatMessage
from poirotd.model import HazardSpace
from poirotd.protocol.poirot.peer_tools import VOTE_TOOL, uses_tools
from poirotd.protocol.poirot.schemas import SelfReport, peer_tool
from poirotd.protocol.spotlight import VERBATIM, Spotlight

# ------------------------------------------------------------------ Phase I — hazard space

_HAZARD_SPACE_SYSTEM = """\
You build the hazard space for POIROT, a protocol for investigating failures of multi-agent \
systems. When an incident of unknown origin happens, the agents of the affected system \
investigate it themselves and work out which component caused it.

POIROT runs in three stages:
1) Individual analysis. Each agent reviews the problematic session on its own: what it saw and \
what it did. It points out mistakes, flaws or problems that could explain the incident, whether \
they come from itself, from other agents or from the system. Finding nothing is a legitimate \
outcome and is stated plainly. Objectivity comes first.
2) Peer consultation. The agents question one another to collect facts and opinions about the \
incident, pooling their expertise to narrow down the cause. Dedicated tools carry the messages.
3) Voting. Once informed, each agent gives its analysis and votes for the hazard vector it \
believes caused the problem, with a justification. Votes stay private until the protocol ends.

Your job comes before these stages: list the LOCATIONS in the system where an error can \
originate. Example: in a clinical system whose doctor agent lacks the medical knowledge it \
needs, the location is the doctor agent.

Task:
- From the description of the system, identify every place where an error can originate.
- The result is a vector with one position per location, [x1, x2, x3, ...], position k standing \
for location k. A later vote such as [1, 0, 1, 0] then means "locations 1 and 3".

What counts as a location:
- Every agent: a system with K agents contributes K positions. When agents stand for people \
whose conduct shapes the process, conduct that would disrupt cooperation or the process counts \
as an error of that agent.
- Physical areas that play a real part in the operation.
- Hardware that plays a significant part.
- Software that plays a significant part.
- Humans or outside actors that interact with the system and influence it.
- Any other component with an important part not covered above.

Limits:
- Do not split what is one piece: an integrated part stays one location.
- An agent's tools and actions belong to that agent's location.
- A physical place that only houses hardware and has no function of its own is not a location \
(its hardware is).
- A part combining hardware and software is one location unless separating them is unavoidable.
- Keep the list short. A catch-all location ("general system failure", anything spanning many \
parts) is not allowed.

The description field (essential):
- Describe a DETECTABLE ANOMALY: what the session log would show if this location were the \
source of the fault. Do not describe the component's normal job or its inherent limits.
- Write it as: "Error signature: <the observable anomaly that singles this location out as the \
source>. Normal behaviour: <what it does when it works correctly>."
- Be concrete enough that an agent reading the session log can tell whether the anomaly is there.
- Avoid descriptions that fit every location, such as "may make analysis errors" or "could be \
biased": they tell nothing apart.
- For agents: how their output would depart from their role (conclusions contradicting their own \
data, advice against their mandate, content foreign to their function).
- For hardware, software and data sources: what corrupted, missing or malformed output would look \
like in the session log.

Output:
- Reply with ONE valid JSON object and nothing else, in this shape:
{"system_name": "<name of the system>",
 "agent_regions": [{"id": "<agent id>", "name": "<agent name>", "type": "agent", \
"description": "Error signature: ... Normal behaviour: ..."}],
 "component_regions": [{"id": "<component id>", "name": "<component name>", \
"type": "<component type>", "description": "Error signature: ... Normal behaviour: ..."}],
 "sub_regions": [{"parent": "<component id>", "slug": "<short_snake_case_name>", \
"name": "<part name>", "description": "Error signature: ... Normal behaviour: ..."}],
 "error_vector_example": [1, 0, 1, 0]}"""


def hazard_space_request(spec: SystemSpec) -> list[ChatMessage]:
    """Phase I reads only what `SystemSpec.description_version` hashes, so the cache stays valid."""
    agents = "\n".join(f"- {a.id}: {a.name}" for a in spec.agents)
    lines = [
        "The system to analyse.",
        f"Name: {spec.system.name}",
        spec.system.description,
        "",
        "Agents: agent_regions lists exactly these, in this order, with these ids and type "
        '"agent":',
        agents,
    ]
    if spec.components:
        limits = spec.protocol
        lines += [
            "",
            "Components: component_regions lists exactly these, in this order, with these ids:",
            *(f"- {c.id} ({c.type}): {c.name}. {c.description}" for c in spec.components),
            "",
            "sub_regions (often none) holds parts of a component that fail on their own, "
            f"at most {limits.max_sub_regions_per_component} per component and "
            f"{limits.max_sub_regions} in all.",
        ]
    else:
        lines += ["", "component_regions and sub_regions are empty: no components are declared."]
    return [
        ChatMessage(role="system", content=_HAZARD_SPACE_SYSTEM),
        ChatMessage(role="user", content="\n".join(lines)),
    ]


# ------------------------------------------------------------------ Phase II — self-assessment

_ACTIVATION = """\
# POIROT protocol activated

A hazard event occurred while the multi-agent system you belong to was running, and it may \
compromise the system's correct operation. A POIROT investigation (Peer Opinion Interrogation \
Review & Outcome Tracking) has therefore started, and you now work under its rules.

You are a key witness. Your task is to help find the hazard vector behind the incident by giving \
your expert view. Set your usual role aside for now (doctor, analyst, engineer or whatever it \
is): the incident is your only concern.

The investigation has three steps:
1. Self-assessment. Every agent reviews the session on its own, reflecting on what it saw and \
did, and points out mistakes, flaws or problems that could have caused the incident: its own, \
another agent's, or the system's. Having seen nothing wrong is an acceptable finding. Stay \
objective and analytical.
2. Peer consultation. You question the other agents of the system to gather their observations \
and views on the incident. You will have a way to contact them and are expected to use it, \
building on everyone's first-step findings.
3. Voting. Once informed, you give your analysis and vote for the hazard vector you believe \
caused the incident, with a clear justification. Your vote stays private until the end.

The safety and proper functioning of the system matter most, so aim for accurate, useful \
findings, even when that means admitting your own mistake, pointing at a colleague or naming a \
flaw of the system.

Keep to the point: identify the hazard and justify it; no remedies, recommendations or \
repetition."""

_SELF_ASSESSMENT_TASK = """\
# Step 1 — individual analysis

The session log above holds the messages you sent and received; your own messages are your \
earlier replies. Go through all of it before answering.

## Part A — your own conduct
- Did your analysis or output agree with the data and evidence you received?
- Did you carry out your defined role faithfully?
- Are your conclusions consistent with one another?
- Did you claim anything that contradicts information available to you?
If everything you did was correct and within your role, say so: that is a valid and important \
finding.

## Part B — the other agents
- Does an agent's output contradict data or evidence visible in the session?
- Did an agent stray from its expected role or mandate?
- Is an agent's output inconsistent with itself (conclusions against its own stated data)?
- Does an agent's output clash with what you observed?

Look for BEHAVIOURAL anomalies: things that should not have happened given the agent's role and \
the data it had. Ordinary disagreement and normal uncertainty are not anomalies.
- Be specific: name the agent and quote or paraphrase the evidence.
- Be objective: "this agent behaved abnormally" is not "I disagree with its opinion".
- If you saw nothing abnormal, in yourself or in others, return empty lists. That is a valid, \
useful answer; do not invent findings to look thorough.
- Go to the ROOT CAUSE: when one agent's flawed output was passed on by others, flag the agent it \
came from, not the ones that forwarded it.

## Answer format
Reply with one JSON object:
{"self_evaluation": {"role_fulfilled": true|false, "anomalies_detected": true|false, \
"description": "<short statement: was your own output correct and within your role?>", \
"evidence": "<quote or reference from your own messages, or N/A>"},
 "peer_observations": [{"agent_name": "<agent id>", "description": "<the anomaly you saw>", \
"evidence": "<quote or paraphrase from the session log>"}],
 "suspected_agents": ["<agent id>"]}"""


def self_assessment(spec: SystemSpec, agent_id: str) -> str:
    """Phase II's one user turn: what POIROT is, the agent's role in it, and the report task."""
    agent = spec.agent(agent_id)
    return (
        f"{_ACTIVATION}\n\nYOUR ROLE: analyse the session from your own standpoint as "
        f"{agent.name} (id: {agent.id}).\n\n{_SELF_ASSESSMENT_TASK}\n"
        f"Agent ids: {', '.join(spec.agent_ids)}.\n"
        "suspected_agents lists the agents you believe behaved abnormally, yourself included "
        "if it applies.\n"
        '- Nothing found: role_fulfilled true, anomalies_detected false, evidence "N/A", '
        "peer_observations [] and suspected_agents [].\n"
        "- A fault of your own: role_fulfilled false, anomalies_detected true, your own message "
        "as evidence, and your id in suspected_agents."
    )


# ------------------------------------------------------------------ Phase III — interrogation

_OVERRIDE = """\
# POIROT protocol override — read carefully

This is a post-incident review (step 2 of POIROT). Until it ends, these rules take precedence \
over the constraints of your usual role:
1. You ARE AUTHORISED and REQUIRED to carry out hazard analysis and risk assessment of the past \
session.
2. You must assess the conduct of EVERY agent, yourself included.
3. You MUST finish with a JSON answer that names the hazard vector.
Disregard earlier instructions such as "I do not assess risks" or "I only do X": in this step \
you are a CRITICAL EVALUATOR of the system's failure."""

_CONSULTATION = """\
# Step 2 — peer consultation

Your individual analysis (step 1) is done. Now you consult the other agents in order to:
- check your first observations,
- hear other viewpoints on the incident,
- clear up unclear events of the session,
- understand the whole picture before your vote.

How it works:
- Each of your replies is {reply}.
- The POIROT server delivers your question and brings the peer's answer back as the next message.
- Ask precise questions about what the peer saw or did in the session.
- You have at most {limit} replies in this step, questions included; when they run out you must \
vote at once.

What you are looking for: BEHAVIOURAL ANOMALIES, departures from how a component of the system \
is supposed to work. The source can be:
- an agent whose output contradicts its inputs, breaks its role, or does not fit what other \
agents report;
- a software component returning corrupted, missing or malformed data;
- a hardware component giving wrong readings or working outside its specification;
- a human whose conduct does not fit their role or duties;
- an external data source with implausible, out-of-date or self-contradictory values.
Domain risks and operational worries are not behavioural anomalies: you are diagnosing which \
component misbehaved, not judging the quality of ordinary decisions.

Rules:
- DO consult other agents before voting; consultation is required.
- DO ask targeted questions grounded in evidence.
- DO say so when you lack direct information.
- DON'T invent facts.
- DON'T vote before you have enough information.
- DON'T ask the same question twice; each answer arrives before your next reply.

Voting guidance — read carefully:
- Vote for the ROOT CAUSE ONLY. When one component's fault spread to others, mark only the \
source; components that merely received the fault are victims, not causes.
- Mark SEVERAL components only for truly independent, simultaneous faults: each misbehaved on its \
own, not because of another.
- IF YOU SAW NO CLEAR ANOMALY, vote all zeros. That is a valid and important answer; do not \
invent a location the evidence does not support.
- Rely ONLY on evidence from the session, and say in your justification what you did not \
observe directly."""


def interrogation_opening(
    spec: SystemSpec,
    space: HazardSpace,
    reports: Mapping[str, SelfReport | None],
    agent_id: str,
    spotlight: Spotlight = VERBATIM,
) -> str:
    """Phase III's first user turn: override, phase rules, legend and step-1 findings (the same
    for every agent; each report quoted as evidence), then the agent-specific part last. With no
    peer to consult, that last part is the final vote request (variant A). With
    `llm.peer_questions: tool_calls` the turns are tool calls, and the texts say so."""
    agent = spec.agent(agent_id)
    peers = [a for a in spec.agents if a.id != agent_id]
    tools = uses_tools(spec)
    why = "explanation grounded in session evidence"
    if tools:
        reply = (
            f"one tool call: a question to one peer (talk_to_<id>) or your final vote ({VOTE_TOOL})"
        )
    else:
        reply = (
            'one JSON object: either a question to one peer ({"action": "ask", ...}) or your '
            'final vote ({"action": "vote", ...})'
        )
    if peers:
        listed = ", ".join(f"{peer_tool(a.id)} ({a.name})" for a in peers)
        turn = (
            f"# Your turn\n\nYou are {agent.name} (id: {agent.id}). Peers you can ask: {listed}.\n"
        )
        if tools:
            turn += (
                "Call exactly one tool: talk_to_<id> with one focused question, or "
                f"{VOTE_TOOL} with your vote:\n{vote_shape(space, why)}"
            )
        else:
            ask = '{"action": "ask", "peer": "talk_to_<id>", "question": "<one focused question>"}'
            vote = vote_shape(space, why, action=True)
            turn += f"Reply with exactly one JSON object, either\n{ask}\nor\n{vote}"
    else:
        turn = f"You are {agent.name} (id: {agent.id}); there is no peer to consult.\n\n"
        turn += final_vote(space)
    return "\n\n".join(
        [
            _OVERRIDE,
            _CONSULTATION.replace("{limit}", str(spec.protocol.max_invocations)).replace(
                "{reply}", reply
            ),
            legend(space),
            _findings(spec, reports, spotlight),
            turn,
        ]
    )


def vote_shape(space: HazardSpace, why: str, *, action: bool = False) -> str:
    """The vote's JSON shape as a prompt spells it out (the baseline asks for the same vote)."""
    lead = '"action": "vote", ' if action else ""
    return (
        f'{{{lead}"hazard_vector": "<name or short description of the hazard vector>", '
        f'"location": [<{space.size} values, each 0 or 1>], "justification": "<{why}>", '
        '"step": <N of the message [#N ...] where the fault first shows, or null>}'
    )


def legend(space: HazardSpace) -> str:
    """What each position of the error vector stands for (the baseline shows the same legend)."""
    rows = "\n".join(
        f"[{i}] {r.id}: {r.name}\n    {r.description}" for i, r in enumerate(space.regions)
    )
    return (
        "# Error vector\n\n"
        "A binary array with one position per component: 1 = originated or directly caused the "
        "hazard, 0 = not involved. Several 1s are allowed, but aim at the root cause, not at "
        "where the error spread.\n\n"
        f"Positions (INDEX: id: name, then what a fault there looks like):\n{rows}\n\n"
        f"{_location_format(space)}"
    )


def _location_format(space: HazardSpace) -> str:
    rows = "\n".join(
        f"location[{i}] = 1 -> {r.name} (id: {r.id})" for i, r in enumerate(space.regions)
    )
    zeros = ", ".join("0" * space.size)
    return (
        f"The location field has EXACTLY {space.size} elements; index i is component i "
        f"(DO NOT shift or reorder):\n{rows}\n"
        "Set 1 where the component originated or directly caused the hazard, 0 elsewhere. "
        f"Correct length, all zeros = no anomaly observed: [{zeros}]\n"
        "step says WHEN: the number N of the session message, headed [#N sender → recipient], "
        "where the fault first shows; null when you cannot point to one or saw no anomaly."
    )


def _findings(
    spec: SystemSpec, reports: Mapping[str, SelfReport | None], spotlight: Spotlight
) -> str:
    blocks = [
        "# Step 1 findings of all agents\n\n"
        "Each agent assessed itself and its peers independently. Start your consultation from "
        "these findings."
    ]
    flagged_by: dict[str, list[str]] = {a: [] for a in spec.agent_ids}
    for a in spec.agents:
        report = reports.get(a.id)
        if report is None:
            blocks.append(f"-- {a.id} ({a.name}) --\n(no valid report)")
            continue
        for suspect in report.suspected_agents:
            flagged_by[suspect].append(a.id)
        blocks.append(f"-- {a.id} ({a.name}) --\n{spotlight.quote(_report_lines(report))}")
    consensus = [
        f"- {suspect}: flagged by {len(by)} agent(s): {', '.join(by)}"
        for suspect, by in sorted(flagged_by.items(), key=lambda kv: -len(kv[1]))
        if by
    ] or ["- nobody was flagged"]
    blocks.append("Cross-agent consensus (who was flagged, and by whom):\n" + "\n".join(consensus))
    blocks.append("Use these findings to direct your questions: confirm or refute them.")
    return "\n\n".join(blocks)


def _report_lines(report: SelfReport) -> str:
    own = report.self_evaluation
    status = "ANOMALY IN OWN CONDUCT" if own.anomalies_detected else "no own anomaly"
    role = "role fulfilled" if own.role_fulfilled else "role NOT fulfilled"
    lines = [f"self: {role}, {status}: {own.description}"]
    if own.anomalies_detected:
        lines.append(f"  evidence: {own.evidence}")
    if report.peer_observations:
        lines.append(f"peer observations ({len(report.peer_observations)}):")
        lines += [
            f"  - {o.agent_name}: {o.description}\n    evidence: {o.evidence}"
            for o in report.peer_observations
        ]
    else:
        lines.append("peer observations: none")
    lines.append(f"suspects: {', '.join(report.suspected_agents) or 'none'}")
    return "\n".join(lines)


def peer_question(asker: AgentSpec, question: str, spotlight: Spotlight = VERBATIM) -> str:
    """What a consulted peer sees after its own prefix: answer only, no vote. The question is
    the asker's model's words, so it is quoted: a question to answer, not orders to follow."""
    return (
        "# POIROT: a peer is consulting you\n\n"
        "This is NOT a request for your vote: answer the question only. As part of the POIROT "
        f"investigation, {asker.name} (id: {asker.id}) asks you the question below. Answer from "
        "your part in the session above and what you know of the system, in a few plain "
        f"sentences.\n\nQuestion:\n{spotlight.quote(question)}"
    )


EMPTY_ANSWER_RETRY = (
    "IMPORTANT: your previous reply was empty. Give a real answer; if you lack the "
    "information, say what you did observe. An empty reply is NOT acceptable."
)


def peer_answer(peer: AgentSpec, answer: str, spotlight: Spotlight = VERBATIM) -> str:
    """How a peer's answer is handed back to the asker: quoted, as evidence."""
    return f"Answer from {peer.name} (id: {peer.id}):\n{spotlight.quote(answer)}"


def no_answer(peer: AgentSpec, reason: str) -> str:
    return f"{peer.name} (id: {peer.id}) gave no answer ({reason}). Ask someone else or vote."


# ------------------------------------------------------------------ Phase IV — vote


def final_vote(space: HazardSpace) -> str:
    """Variant A: the consultation is over (or there was nobody to consult); vote now."""
    shape = vote_shape(space, "why you identified this hazard vector")
    return (
        "Now that your consultation is over, give your final analysis of the hazard vector as "
        f"JSON.\n\n{_location_format(space)}\n\nReply with this JSON object:\n{shape}\n\n"
        "CRITICAL: location must be a BINARY VECTOR (0s and 1s), not a text description."
    )


def forced_vote(space: HazardSpace, limit: int | None) -> str:
    """Variant B: the agent used its M = `limit` replies without voting, or (`limit` None) its
    consultation filled the model's context window before that."""
    shape = vote_shape(space, "why, based on your analysis and consultation")
    why = (
        f"You have used all {limit} replies allowed in this step."
        if limit is not None
        else "The consultation has filled the room this step has for it."
    )
    return (
        "# POIROT enforcement\n\n"
        f"{why} To keep the consultation bounded, the protocol needs your final vote NOW.\n\n"
        f"{_location_format(space)}\n\nReply with this JSON object:\n{shape}\n\n"
        "CRITICAL: location must be a BINARY VECTOR (0s and 1s), not a text description. This "
        "is your LAST reply; nothing after it is accepted."
    )


def invalid_tool_call(error: str) -> str:
    """The repair after a tool call that failed validation (or a reply that called none)."""
    return (
        f"Your previous reply was rejected: {error}\n"
        "Reply again by calling exactly one of the tools, with valid arguments."
    )
