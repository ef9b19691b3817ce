"""Phase III over native tool calls (`llm.peer_questions: tool_calls`), scripted backend."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from poirotd.config.spec import OpenAILLMSpec, SystemSpec
from poirotd.devtools.answers import fill
from poirotd.llm.base import ChatMessage, Completion, Tool, ToolCall
from poirotd.llm.scripted import ScriptedBackend, ToolReply
from poirotd.protocol.events import ExchangeDone
from poirotd.protocol.poirot.interrogation import closing_request, one_more_round
from poirotd.protocol.poirot.peer_tools import (
    VOTE_TOOL,
    PeerCall,
    tools_text,
    turn_tools,
    uses_tools,
)
from poirotd.protocol.poirot.prompts import invalid_tool_call
from poirotd.protocol.poirot.schemas import AskAction, VoteAction, vote_format
from poirotd.protocol.schemas import InvalidAnswerError
from tests.support.protocol import (
    AGENTS,
    EXO,
    World,
    investigate,
    make_spec,
    spotlight_of,
    who,
)

IDS = [a.id for a in AGENTS]
VOTE = {"hazard_vector": "sensor", "location": [0, 0, 0, 1], "justification": "angles"}
ToolHandler = Callable[[str, Sequence[ChatMessage], Sequence[Tool]], ToolReply]


def tools_spec(**protocol: Any) -> SystemSpec:
    llm = OpenAILLMSpec(
        backend="openai", base_urls=("http://vllm:8000/v1",), model="m", peer_questions="tool_calls"
    )
    return make_spec(**protocol).model_copy(update={"llm": llm})


def call(name: str, arguments: dict[str, Any] | str, n: int = 0) -> ToolCall:
    text = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return ToolCall(id=f"call_{name}_{n}", name=name, arguments=text)


def next_peer(agent: str) -> str:
    return IDS[(IDS.index(agent) + 1) % len(IDS)]  # doctor → chief → physio → doctor


def ask_once_then_vote(agent: str, messages: Sequence[ChatMessage], tools: Sequence[Tool]) -> Any:
    if messages[-1].role == "tool":
        return [call(VOTE_TOOL, VOTE | {"step": None})]
    return [call(f"talk_to_{next_peer(agent)}", {"question": "What did you see?"})]


def tool_world(handler: ToolHandler = ask_once_then_vote, **handlers: Any) -> World:
    world = World(**handlers)
    world.backend = ScriptedBackend(
        world, tool_script=lambda messages, tools: handler(who(messages), messages, tools)
    )
    return world


def tool_calls(world: World, agent: str) -> list[tuple[ChatMessage, ...]]:
    return [c.messages for c in world.backend.calls if c.tools and who(c.messages) == agent]


# ------------------------------------------------------------------ the tool format


def test_only_openai_specs_that_ask_for_it_use_tools() -> None:
    assert uses_tools(tools_spec())
    assert not uses_tools(make_spec())  # embedded: always the action object
    assert not uses_tools(
        make_spec().model_copy(
            update={"llm": OpenAILLMSpec(backend="openai", base_urls=("http://x",), model="m")}
        )
    )


def test_tools_are_one_per_peer_plus_the_vote_schema() -> None:
    fmt = turn_tools(["chief", "physio"], 4, {1, 2})
    assert [t.name for t in fmt.tools] == ["talk_to_chief", "talk_to_physio", VOTE_TOOL]
    question = fmt.tools[0].parameters["properties"]["question"]
    assert question["maxLength"] == 300 and question["minLength"] == 1
    assert fmt.tools[2].parameters == vote_format(4, {1, 2}).schema


def read(fmt: Any, *calls: ToolCall, text: str = "") -> Any:
    return fmt.read(Completion(text=text, prompt_tokens=1, completion_tokens=1, tool_calls=calls))


def test_calls_decode_to_the_action_objects() -> None:
    fmt = turn_tools(["chief", "physio"], 4, {6})
    asked = call("talk_to_physio", {"question": "Knee angle?"})
    got = read(fmt, asked)
    assert got == PeerCall(
        asked, AskAction(action="ask", peer="talk_to_physio", question="Knee angle?")
    )
    assert got.action.peer_id == "physio"
    voted = read(fmt, call(VOTE_TOOL, VOTE | {"step": 9}))  # a step never seen is dropped
    assert voted.action == VoteAction(action="vote", **VOTE, step=None)


def test_a_voter_that_saw_no_message_can_only_answer_a_null_step() -> None:
    schema = vote_format(4, set()).schema
    assert schema is not None and schema["properties"]["step"] == {"type": "null"}
    assert fill(schema)["step"] is None
    step = turn_tools(["chief"], 4, {3}).tools[-1].parameters["properties"]["step"]
    assert step == {"anyOf": [{"type": "integer"}, {"type": "null"}]}


@pytest.mark.parametrize(
    ("calls", "text", "error"),
    [
        ((call("shout", {"question": "hi"}),), "", "unknown tool 'shout'"),
        ((call("talk_to_doctor", {"question": "hi"}),), "", "unknown tool 'talk_to_doctor'"),
        ((call("talk_to_chief", "{not json"),), "", "not valid JSON"),
        ((call("talk_to_chief", "[1]"),), "", "must be a JSON object"),
        ((call("talk_to_chief", {"question": ""}),), "", "question"),
        ((call("talk_to_chief", {"question": "x", "extra": 1}),), "", "extra"),
        ((call(VOTE_TOOL, VOTE | {"location": [1]}),), "", "exactly 4 entries"),
        ((), "I think the sensor failed.", "the reply called 0"),
        ((call("talk_to_chief", {"question": "a"}), call(VOTE_TOOL, VOTE)), "", "called 2"),
    ],
)
def test_invalid_calls_are_invalid_answers(
    calls: tuple[ToolCall, ...], text: str, error: str
) -> None:
    with pytest.raises(InvalidAnswerError, match=error):
        read(turn_tools(["chief", "physio"], 4, set()), *calls, text=text)


# ------------------------------------------------------------------ the protocol over tools


async def test_ask_answer_vote_over_tool_calls() -> None:
    world = tool_world()
    outcome = await investigate(world, tools_spec())

    assert outcome.attribution.top == (EXO,)
    assert all(not v.abstained and not v.forced for v in outcome.votes)
    first, second = tool_calls(world, "doctor")
    # Offered: the two peers and the vote, with the vote schema as parameters.
    offered = next(c.tools for c in world.backend.calls if c.tools and who(c.messages) == "doctor")
    assert [t.name for t in offered] == ["talk_to_chief", "talk_to_physio", VOTE_TOOL]
    assert "Call exactly one tool" in first[-1].content and '"action"' not in first[-1].content
    # The question goes back as the call itself, the answer as a tool turn with the call's id.
    asked, answered = second[-2:]
    assert asked == ChatMessage(
        role="assistant",
        content="",
        tool_calls=(call("talk_to_chief", {"question": "What did you see?"}),),
    )
    assert answered.role == "tool" and answered.tool_call_id == "call_talk_to_chief_0"
    assert answered.content.startswith("Answer from Chief of Rehabilitation (id: chief)")
    assert second[: len(first)] == first  # only appended: the prefix cache covers it
    # The peer answers in plain text on its own prefix, with no tools offered.
    answers = [c for c in world.backend.calls if not c.tools and c.schema is None]
    (answer,) = [c.messages for c in answers if who(c.messages) == "chief"]
    assert "Diagnosis Doctor (id: doctor) asks you" in answer[-1].content
    assert not world.calls("turn") and not world.calls("vote")


async def test_invalid_tool_arguments_are_repaired_as_the_calls_result() -> None:
    attempts: list[int] = []

    def vote_badly_once(agent: str, messages: Sequence[ChatMessage], tools: Sequence[Tool]) -> Any:
        if agent != "chief":
            return ask_once_then_vote(agent, messages, tools)
        attempts.append(1)
        location = [0, 1] if len(attempts) == 1 else [0, 0, 0, 1]
        return [call(VOTE_TOOL, VOTE | {"location": location}, n=len(attempts))]

    world = tool_world(vote_badly_once)
    outcome = await investigate(world, tools_spec())

    first, repair = tool_calls(world, "chief")
    rejected, result = repair[-2:]
    assert rejected.tool_calls == (call(VOTE_TOOL, VOTE | {"location": [0, 1]}, n=1),)
    assert result.role == "tool" and result.tool_call_id == "call_cast_vote_1"
    assert result.content == invalid_tool_call(
        "location must have exactly 4 entries (one per region), got 2"
    )
    assert repair[:-2] == first
    chief = next(v for v in outcome.votes if v.agent_id == "chief")
    assert chief.location == (0, 0, 0, 1) and not chief.abstained
    audited = [e.exchange for e in world.of(ExchangeDone) if e.exchange.purpose == "repair"]
    assert audited[0].messages[-1]["tool_call_id"] == "call_cast_vote_1"
    assert '"name": "cast_vote"' in audited[0].messages[-2]["content"]
    assert '"name": "cast_vote"' in audited[0].response


async def test_unknown_tool_and_plain_text_end_in_abstention_never_zeros() -> None:
    replies: list[Any] = [[call("shout", {})], [call("shout", {})], "The exoskeleton did it."]

    def confused(agent: str, messages: Sequence[ChatMessage], tools: Sequence[Tool]) -> Any:
        return replies.pop() if agent == "physio" else ask_once_then_vote(agent, messages, tools)

    world = tool_world(confused)
    outcome = await investigate(world, tools_spec(invalid_json_retries=2))

    first, *repairs = tool_calls(world, "physio")
    assert len(repairs) == 2
    # A reply with no call is answered by a user turn, a call by a tool turn with its id.
    called_none = (
        "call exactly one tool (talk_to_doctor, talk_to_chief, cast_vote); the reply called 0"
    )
    assert repairs[0][-2:] == (
        ChatMessage(role="assistant", content="The exoskeleton did it."),
        ChatMessage(role="user", content=invalid_tool_call(called_none)),
    )
    assert repairs[1][-2].tool_calls == (call("shout", {}),)
    assert repairs[1][-1].role == "tool" and repairs[1][-1].tool_call_id == "call_shout_0"
    assert "unknown tool 'shout'" in repairs[1][-1].content
    assert repairs[1][:-2] == repairs[0][:-2] == first  # repairs replace each other
    physio = next(v for v in outcome.votes if v.agent_id == "physio")
    assert physio.abstained and "unknown tool 'shout'" in physio.abstention_reason
    assert physio.location == () and physio.weight == 0.0


async def test_forced_vote_after_m_tool_turns_uses_the_vote_schema() -> None:
    def always_ask(agent: str, messages: Sequence[ChatMessage], tools: Sequence[Tool]) -> Any:
        turns = sum(m.role == "tool" for m in messages)
        return [call(f"talk_to_{next_peer(agent)}", {"question": "And then?"}, n=turns)]

    world = tool_world(always_ask)
    outcome = await investigate(world, tools_spec(max_invocations=2))

    assert all(v.forced and not v.abstained for v in outcome.votes)
    (vote,) = world.calls("vote", "doctor")
    assert [m.role for m in vote[-5:]] == ["assistant", "tool", "assistant", "tool", "user"]
    assert [m.tool_call_id for m in vote[-4:-1:2]] == [
        "call_talk_to_chief_0",
        "call_talk_to_chief_1",
    ]
    assert "used all 2 replies" in vote[-1].content


async def test_the_context_budget_counts_the_tool_definitions_turns_send() -> None:
    def always_ask(agent: str, messages: Sequence[ChatMessage], tools: Sequence[Tool]) -> Any:
        turns = sum(m.role == "tool" for m in messages)
        return [call(f"talk_to_{next_peer(agent)}", {"question": "And then?"}, n=turns)]

    spec = tools_spec(max_invocations=8)
    roomy = tool_world(always_ask)
    space = (await investigate(roomy, spec)).hazard_space
    spotlight = spotlight_of(roomy)
    offered = {a: tools_text(spec, a, space.size, range(8)) for a in IDS}
    assert all(offered.values()) and not tools_text(make_spec(), "doctor", space.size, range(8))

    def budget(agent: str, transcript: Sequence[ChatMessage]) -> int:
        ending = closing_request(space, transcript, offered[agent])
        return roomy.backend.count_tokens(ending) + one_more_round(spec.protocol, spotlight)

    start = max(budget(a, tool_calls(roomy, a)[0]) for a in IDS)
    world = tool_world(always_ask)
    world.backend.context_tokens = start + 100  # about two rounds beyond the first

    outcome = await investigate(world, spec)

    assert {v.forced_by for v in outcome.votes} == {"context_full"}
    for agent in IDS:
        turns = tool_calls(world, agent)
        assert 1 <= len(turns) < 8
        # Every turn was taken with room for it, the answer and the vote, tools counted.
        assert all(budget(agent, t) <= world.backend.context_tokens for t in turns)
