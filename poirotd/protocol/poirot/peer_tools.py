"""Phase III turns as native tool calls: `talk_to_<peer>(question)` and `cast_vote(<the vote>)`.

Chosen per spec (`llm.peer_questions: tool_calls`, OpenAI backend only). A call is rewritten
into the action object it stands for and checked by that path's own parser (`turn_format`), so
both paths produce the same AskAction / VoteAction and share repair, retry and abstention. The
vote tool's parameters are the Phase IV vote schema itself.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any, Generic, NamedTuple, TypeVar

from poirotd.config.spec import OpenAILLMSpec, SystemSpec
from poirotd.llm.base import Completion, Tool, ToolCall
from poirotd.protocol.poirot.schemas import (
    QUESTION_MAX,
    AskAction,
    VoteAction,
    peer_tool,
    turn_format,
    vote_format,
)
from poirotd.protocol.schemas import InvalidAnswerError

T = TypeVar("T")

VOTE_TOOL = "cast_vote"
_QUESTION: dict[str, Any] = {
    "type": "object",
    "properties": {"question": {"type": "string", "minLength": 1, "maxLength": QUESTION_MAX}},
    "required": ["question"],
    "additionalProperties": False,
}


def uses_tools(spec: SystemSpec) -> bool:
    """Whether this spec's Phase III turns are tool calls rather than action objects."""
    return isinstance(spec.llm, OpenAILLMSpec) and spec.llm.peer_questions == "tool_calls"


@dataclass(frozen=True)
class ToolFormat(Generic[T]):
    """Tools to offer, one of which the answer must call, and the parser that checks the call."""

    tools: tuple[Tool, ...]
    parse: Callable[[ToolCall], T]

    def read(self, completion: Completion) -> T:
        """The answer's one call, parsed; text alone or several calls are invalid answers."""
        calls = completion.tool_calls
        if len(calls) != 1:
            names = ", ".join(t.name for t in self.tools)
            raise InvalidAnswerError(
                f"call exactly one tool ({names}); the reply called {len(calls)}"
            )
        return self.parse(calls[0])


def tools_text(spec: SystemSpec, agent_id: str, size: int, steps: Collection[int]) -> str:
    """The tool definitions `agent_id`'s turns offer, as the JSON a server renders into the
    prompt ("" when turns are action objects): what the context budget counts for them."""
    if not uses_tools(spec):
        return ""
    peers = [a for a in spec.agent_ids if a != agent_id]
    tools = turn_tools(peers, size, steps).tools
    return json.dumps([t.model_dump() for t in tools], separators=(",", ":"))


class PeerCall(NamedTuple):
    """A turn decoded from a tool call, with the call (an ask is answered by its id)."""

    call: ToolCall
    action: AskAction | VoteAction


def turn_tools(peer_ids: Sequence[str], size: int, steps: Collection[int]) -> ToolFormat[PeerCall]:
    """Phase III as tools: one `talk_to_<peer>` per peer, and `cast_vote`. `steps` are the
    session indices the voter saw, the only ones a vote's step may name."""
    parse_turn = turn_format(peer_ids, size, steps).parse
    asks = [peer_tool(p) for p in peer_ids]
    tools = (
        *(
            Tool(name=name, description=f"Ask {p} one focused question.", parameters=_QUESTION)
            for name, p in zip(asks, peer_ids, strict=True)
        ),
        Tool(
            name=VOTE_TOOL,
            description="Cast your final vote; this ends your consultation.",
            parameters=vote_format(size, steps).schema or {},
        ),
    )

    def parse(call: ToolCall) -> PeerCall:
        if call.name == VOTE_TOOL:
            fixed = {"action": "vote"}
        elif call.name in asks:
            fixed = {"action": "ask", "peer": call.name}
        else:
            raise InvalidAnswerError(
                f"unknown tool {call.name!r}; call one of {[*asks, VOTE_TOOL]}"
            )
        try:
            arguments = json.loads(call.arguments)
        except ValueError:
            raise InvalidAnswerError(f"the arguments of {call.name} are not valid JSON") from None
        if not isinstance(arguments, dict):
            raise InvalidAnswerError(f"the arguments of {call.name} must be a JSON object")
        return PeerCall(call, parse_turn(json.dumps(arguments | fixed)))

    return ToolFormat(tools, parse)
