"""The client SDK against a real in-process daemon: the blocking and the asyncio client record
messages (numbered by the daemon) and telemetry, trigger, watch and confirm an investigation;
the LangChain callback handler records a run driven by langchain-core's fake chat model; and
the documentation's examples (examples/) really run."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import StructuredTool

from examples import langchain_callback, record_and_investigate, record_async
from poirotd.api.poirot.v1 import poirot_pb2 as pb
from poirotd.client import AsyncClient, Client, Message, Sample
from poirotd.daemon import Daemon
from poirotd.devtools.answers import schema_answer
from poirotd.devtools.clinic import CLINIC
from poirotd.integrations.langchain import PoirotCallbackHandler
from poirotd.llm.scripted import ScriptedBackend
from poirotd.model import MessageKind
from tests.support.daemon import client_of, in_process_daemon

# The examples' runs also speak with a parent (a component of the demo's CORTEX spec).
PARENTED = CLINIC.model_copy(
    update={
        "components": (
            *CLINIC.components,
            CLINIC.components[0].model_copy(update={"id": "parent", "type": "human"}),
        )
    }
)


@pytest.fixture
async def daemon(tmp_path: Path) -> AsyncIterator[Daemon]:
    async with in_process_daemon(tmp_path, PARENTED, ScriptedBackend(schema_answer)) as d:
        yield d


def _target(daemon: Daemon) -> str:
    return f"127.0.0.1:{daemon.grpc_port}"


async def test_the_blocking_client_records_triggers_watches_and_confirms(daemon: Daemon) -> None:
    def operator() -> tuple[pb.Investigation, list[str | None], pb.ConfirmOutcomeResponse]:
        # Blocking calls, from a thread: the daemon runs in this test's event loop.
        with Client(_target(daemon), system="clinic") as poirot:
            poirot.start_session("run-1")
            poirot.record(
                "run-1",
                [
                    Message(
                        "user", "Assess patient 7.", recipient="doctor", kind=MessageKind.HUMAN
                    ),
                    Message("doctor", "The offset is noise; proceed."),
                    Sample("exo", "knee_left_deg", 12.5),
                ],
            )
            poirot.record("run-1", [Message("chief", "Continue at full assistance.")])
            queued = poirot.trigger("run-1", "the patient fell")
            kinds: list[str | None] = [
                e.WhichOneof("event") for e in poirot.watch(queued.investigation_id)
            ]
            done = poirot.get(queued.investigation_id)
            confirmed = poirot.confirm(done.investigation_id, ["doctor"], note="clinician")
            poirot.end_session("run-1")
        return done, kinds, confirmed

    done, kinds, confirmed = await asyncio.to_thread(operator)
    assert done.state == pb.INVESTIGATION_STATE_SUCCEEDED
    assert kinds[0] == "started" and kinds[-1] == "attribution_ready"
    assert list(confirmed.confirmed.region_ids) == ["doctor"]
    assert daemon._store is not None
    stored = await daemon._store.session_messages("run-1")
    assert [(m.index, m.sender) for m in stored] == [(0, "user"), (1, "doctor"), (2, "chief")]
    session = await daemon._store.get_session("run-1")
    assert session is not None and session.ended_at is not None


async def test_the_async_client_and_a_refusal_that_names_the_item(daemon: Daemon) -> None:
    import grpc

    async with AsyncClient(_target(daemon), system="clinic") as poirot:
        await poirot.start_session("run-2", labels={"team": "a"})
        await poirot.record("run-2", [Message("doctor", "first", index=10)])
        with pytest.raises(ValueError, match="kind"):  # checked here, before anything is sent
            await poirot.record("run-2", [Message("doctor", kind="robot")])  # type: ignore[arg-type]
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await poirot.record("run-2", [Message("toaster", "I am no agent")])
        assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert "sender 'toaster' is not an agent" in (refused.value.details() or "")
        queued = await poirot.trigger("run-2", "check")
        async for _ in poirot.watch(queued.investigation_id):
            pass
        assert (await poirot.get(queued.investigation_id)).state == (
            pb.INVESTIGATION_STATE_SUCCEEDED
        )
    assert daemon._store is not None
    assert [m.index for m in await daemon._store.session_messages("run-2")] == [10]


def _gait_test(side: str) -> str:
    """Runs a gait test on one side."""
    return f"ankle_{side}_deg offset 15 deg: SENSOR FAULT"


gait_test = StructuredTool.from_function(_gait_test, name="gait_test")


def _agent_run(handler: PoirotCallbackHandler) -> None:
    """A two-node graph's run by hand: the doctor calls a tool and answers, the chief decides."""
    call = {"name": "gait_test", "args": {"side": "left"}, "id": "call_1", "type": "tool_call"}
    doctor = FakeMessagesListChatModel(
        responses=[
            AIMessage("", tool_calls=[call]),
            AIMessage("The offset is noise."),
            AIMessage("Assessed already."),
        ]
    )
    chief = FakeMessagesListChatModel(responses=[AIMessage("Continue.")])

    def node(name: str) -> RunnableConfig:
        return {"callbacks": [handler], "metadata": {"langgraph_node": name}}

    history: list[BaseMessage] = [SystemMessage("You diagnose."), HumanMessage("Assess patient 7.")]
    asked = doctor.invoke(history, config=node("doctor"))
    result = gait_test.invoke(call, config=node("tools"))
    history += [asked, result]
    history.append(doctor.invoke(history, config=node("doctor")))
    chief.invoke([SystemMessage("You decide."), HumanMessage("Assess patient 7.")], node("chief"))
    # The same task handed again to the doctor is not recorded twice.
    doctor.invoke([HumanMessage("Assess patient 7.")], config=node("doctor"))


async def test_the_langchain_handler_records_the_run_as_its_agents_said_it(
    daemon: Daemon,
) -> None:
    def run() -> None:
        with Client(_target(daemon), system="clinic") as poirot:
            _agent_run(PoirotCallbackHandler(poirot, "lc-run", agent="doctor"))

    await asyncio.to_thread(run)
    assert daemon._store is not None
    stored = await daemon._store.session_messages("lc-run")
    assert [(m.kind, m.sender, m.recipient, m.content, m.tool_calls) for m in stored] == [
        (MessageKind.SYSTEM, "system", "doctor", "You diagnose.", ()),
        (MessageKind.HUMAN, "user", "doctor", "Assess patient 7.", ()),
        (MessageKind.AGENT, "doctor", "", "", ('gait_test({"side":"left"})',)),
        (MessageKind.TOOL, "tool:gait_test", "doctor", gait_test.invoke({"side": "left"}), ()),
        (MessageKind.AGENT, "doctor", "", "The offset is noise.", ()),
        (MessageKind.SYSTEM, "system", "chief", "You decide.", ()),
        (MessageKind.HUMAN, "user", "chief", "Assess patient 7.", ()),
        (MessageKind.AGENT, "chief", "", "Continue.", ()),
        (MessageKind.AGENT, "doctor", "", "Assessed already.", ()),
    ]
    assert [m.index for m in stored] == list(range(9))
    session = await daemon._store.get_session("lc-run")
    assert session is not None and session.labels == {"input": "langchain"}


async def test_a_refusal_is_logged_and_the_run_goes_on(daemon: Daemon) -> None:
    def run() -> None:
        with Client(_target(daemon), system="clinic") as poirot:
            handler = PoirotCallbackHandler(poirot, "lc-bad", agent="doctor", node_is_agent=True)
            model = FakeMessagesListChatModel(responses=[AIMessage("hello")])
            answer = model.invoke(
                "hi", config={"callbacks": [handler], "metadata": {"langgraph_node": "router"}}
            )
            assert answer.content == "hello"

    await asyncio.to_thread(run)
    assert daemon._store is not None
    # The human message went to "router", no agent: refused, and so the rest of its request.
    assert await daemon._store.session_messages("lc-bad") == []


async def test_example_record_and_investigate(daemon: Daemon) -> None:
    investigation_id = await asyncio.to_thread(
        record_and_investigate.main, _target(daemon), "clinic", "exo"
    )
    async with client_of(daemon) as client:
        done = await client.get(investigation_id)
    assert done.state == pb.INVESTIGATION_STATE_SUCCEEDED and done.HasField("confirmed")
    assert daemon._store is not None
    assert len(await daemon._store.session_messages("example-run")) == 3


async def test_example_record_async(daemon: Daemon) -> None:
    seen = await record_async.main(_target(daemon), "clinic")
    assert seen[0] == "started" and "attribution_ready" in seen
    assert daemon._store is not None
    assert [m.index for m in await daemon._store.session_messages("example-async")] == [0, 1]


async def test_example_langchain_callback(daemon: Daemon) -> None:
    await asyncio.to_thread(langchain_callback.main, _target(daemon), "clinic")
    assert daemon._store is not None
    stored = await daemon._store.session_messages("example-langchain")
    assert [m.sender for m in stored] == [
        "system",
        "user",
        "doctor",
        "tool:gait_test",
        "doctor",
        "user",
        "chief",
    ]
