"""Who&When-shaped logs as cases: a speaker history plus the agent and step where it went wrong.

Who&When and TracerTraj share this shape and differ only in how a record is read, so both
loaders end here and their cases are built the same way.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from poirot_eval.cases import Dataset, EvalCase, GroundTruth
from poirot_eval.parts import message, pinned_space, region_ids
from poirotd.config.spec import AgentSpec, ComponentSpec, SystemInfo, SystemSpec
from poirotd.model import MessageKind

# Speakers that are people rather than programs; every other non-agent speaker (Who&When's
# "Computer_terminal") is a tool that runs what the agents write.
_HUMAN_SPEAKERS = frozenset({"user", "human", "admin", "user_proxy"})


class TruthError(ValueError):
    """The dataset's answer does not fit its own log (an agent that is not one, a step past the
    end)."""


@dataclass(frozen=True)
class Turn:
    name: str
    content: str
    # Whom the turn was for (a speaker's name); empty: everyone in the chat.
    recipient: str = ""


def _stand_in_prompt(name: str) -> str:
    """For agents the dataset gives no system prompt (the spec requires one)."""
    return f"You are {name}, one of the agents of this team. The log records no other role text."


def trajectory_case(
    dataset: Dataset,
    case_id: str,
    *,
    system: str,
    description: str,
    prompts: Mapping[str, str],
    turns: Sequence[Turn],
    mistake_agent: str,
    mistake_step: int,
) -> EvalCase:
    """The case: agents = the keys of `prompts`, every other speaker (or recipient) a component,
    space pinned.

    An empty prompt gets a stand-in naming the agent.
    `mistake_step` indexes `turns`, which become the session messages one for one.
    """
    named = (n for t in turns for n in (t.name, t.recipient) if n)
    others = list(dict.fromkeys(n for n in named if n not in prompts))
    ids = region_ids([*prompts, *others])
    if mistake_agent not in prompts:
        raise TruthError(
            f"mistake_agent {mistake_agent!r} is not one of the agents {sorted(prompts)}"
        )
    if not 0 <= mistake_step < len(turns):
        raise TruthError(
            f"mistake_step {mistake_step} is outside the history (0..{len(turns) - 1})"
        )

    agents = [
        AgentSpec(id=ids[name], name=name, system_prompt=prompt or _stand_in_prompt(name))
        for name, prompt in prompts.items()
    ]
    components = [_component(ids[name], name) for name in others]
    spec = SystemSpec(
        system=SystemInfo(name=system, description=description),
        agents=tuple(agents),
        components=tuple(components),
        hazard_space=pinned_space(agents, [_agent_description(a.name) for a in agents], components),
    )
    messages = tuple(
        message(
            case_id,
            i,
            kind := _kind(turn.name, prompts),
            ids[turn.name],
            turn.content,
            recipient=ids[turn.recipient] if turn.recipient else "",
            tool_name=turn.name if kind is MessageKind.TOOL else "",
        )
        for i, turn in enumerate(turns)
    )
    truth = GroundTruth(regions=(ids[mistake_agent],), step=mistake_step)
    return EvalCase(dataset=dataset, case_id=case_id, spec=spec, messages=messages, truth=truth)


def _kind(name: str, prompts: Mapping[str, str]) -> MessageKind:
    if name in prompts:
        return MessageKind.AGENT
    return MessageKind.HUMAN if name.lower() in _HUMAN_SPEAKERS else MessageKind.TOOL


def _agent_description(name: str) -> str:
    return (
        f"Error signature: {name} gives a wrong answer, plan, code or fact that later steps build "
        f"on. Normal behaviour: {name}'s contributions are correct and do what its role asks."
    )


def _component(component_id: str, name: str) -> ComponentSpec:
    if name.lower() in _HUMAN_SPEAKERS:
        return ComponentSpec(
            id=component_id,
            name=name,
            type="human",
            description=(
                f"Error signature: {name} gives wrong or misleading instructions or information. "
                "Normal behaviour: states the task and answers questions accurately."
            ),
        )
    return ComponentSpec(
        id=component_id,
        name=name,
        type="software",
        description=(
            f"Error signature: {name} returns output that does not follow from what it was given "
            "to run (wrong, truncated or missing results). Normal behaviour: it runs the agents' "
            "code or commands and reports their real output."
        ),
    )
