"""OpenAIBackend against real HTTP servers on loopback, scripted reply by reply.

The servers are stdlib ``http.server`` threads: real sockets, real keep-alive, real timeouts, and
no dependency beyond the standard library.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest
import structlog

from poirotd.config import OpenAILLMSpec, SystemSpec
from poirotd.llm.base import ChatMessage, LLMError, Tool, ToolCall
from poirotd.llm.factory import open_backend
from poirotd.llm.openai_http import OpenAIBackend
from tests.support.answers import chat_body
from tests.support.openai_server import MESSAGES, Reply, ScriptedServer, complete, make_spec

SECRET = "sk-test-0123456789abcdef"
SCHEMA: dict[str, Any] = {
    "title": "Vote",
    "type": "object",
    "properties": {"location": {"type": "array", "items": {"type": "integer"}}},
    "required": ["location"],
}


@pytest.fixture(autouse=True)
def _no_key_in_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("POIROTD_LLM_API_KEY", raising=False)


@pytest.fixture
def server() -> Iterator[ScriptedServer]:
    s = ScriptedServer()
    yield s
    s.close()


@pytest.fixture
def other_server() -> Iterator[ScriptedServer]:
    s = ScriptedServer()
    yield s
    s.close()


@pytest.fixture
def dead_url() -> str:
    """A loopback port nobody listens on: connections are refused at once."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


async def test_completion_parsed_and_request_shaped_for_vllm(server: ScriptedServer) -> None:
    server.script(Reply(body=chat_body(cached_tokens=96)))
    spec = make_spec(server.url + "/v1/", api_key=SECRET, temperature=0.2)

    result = await complete(spec, schema=SCHEMA)

    assert result.text == '{"location": [0, 1]}'
    assert (result.prompt_tokens, result.completion_tokens, result.cached_tokens) == (120, 9, 96)
    assert result.finish_reason == "stop"
    [seen] = server.seen
    assert (seen.method, seen.path) == ("POST", "/v1/chat/completions")
    assert seen.headers["Authorization"] == f"Bearer {SECRET}"
    assert seen.body == {
        "model": "qwen-test",
        "messages": [
            {"role": "system", "content": "You are the controller agent."},
            {"role": "user", "content": "Vote now."},
        ],
        "max_tokens": 64,
        "temperature": 0.2,
        "stream": False,
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "Vote", "schema": SCHEMA, "strict": True},
        },
    }


async def test_json_object_mode_sends_llama_cpp_shape(server: ScriptedServer) -> None:
    server.script(Reply(), Reply())
    spec = make_spec(server.url, structured_output="json_object")

    await complete(spec, schema=SCHEMA)
    await complete(spec)

    assert server.seen[0].path == "/v1/chat/completions"
    assert server.seen[0].body["response_format"] == {"type": "json_object", "schema": SCHEMA}
    assert "response_format" not in server.seen[1].body
    assert "Authorization" not in server.seen[0].headers


ASK = Tool(
    name="talk_to_planner",
    description="Ask planner one focused question.",
    parameters={"type": "object", "properties": {"question": {"type": "string"}}},
)


def tool_call_body(name: str, arguments: str) -> dict[str, Any]:
    """What vLLM (and llama-cpp-python's server) answer when the model called a tool."""
    body = chat_body(finish_reason="tool_calls")
    body["choices"][0]["message"] = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "call_7", "type": "function", "function": {"name": name, "arguments": arguments}}
        ],
    }
    return body


async def test_tools_are_offered_and_tool_calls_decoded(server: ScriptedServer) -> None:
    server.script(Reply(body=tool_call_body("talk_to_planner", '{"question": "Why?"}')), Reply())
    called = ToolCall(id="call_7", name="talk_to_planner", arguments='{"question": "Why?"}')
    history = [
        *MESSAGES,
        ChatMessage(role="assistant", content="", tool_calls=(called,)),
        ChatMessage(role="tool", content="Because.", tool_call_id="call_7"),
    ]
    backend = await OpenAIBackend.open(make_spec(server.url))
    try:
        result = await backend.complete(MESSAGES, tools=[ASK], max_tokens=64)
        again = await backend.complete(history, tools=[ASK], max_tokens=64)
    finally:
        await backend.aclose()

    assert (result.text, result.tool_calls, result.finish_reason) == ("", (called,), "tool_calls")
    assert again.tool_calls == ()
    first, second = server.seen
    assert first.body["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "talk_to_planner",
                "description": "Ask planner one focused question.",
                "parameters": ASK.parameters,
            },
        }
    ]
    assert first.body["tool_choice"] == "required"
    assert "response_format" not in first.body
    # The call goes back as OpenAI wants it: the assistant's tool_calls, then the tool's answer.
    assert second.body["messages"][2:] == [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "call_7",
                    "type": "function",
                    "function": {"name": "talk_to_planner", "arguments": '{"question": "Why?"}'},
                }
            ],
        },
        {"role": "tool", "content": "Because.", "tool_call_id": "call_7"},
    ]


async def test_tool_choice_auto_for_servers_without_required(server: ScriptedServer) -> None:
    server.script(Reply(), Reply())
    spec = make_spec(server.url, tool_choice="auto", peer_questions="tool_calls")
    backend = await OpenAIBackend.open(spec)
    try:
        result = await backend.complete(MESSAGES, tools=[ASK], max_tokens=64)
        await backend.complete(MESSAGES, max_tokens=64)
    finally:
        await backend.aclose()
    # A text answer is returned as text: the protocol rejects and repairs it.
    assert (result.text, result.tool_calls) == ('{"location": [0, 1]}', ())
    assert server.seen[0].body["tool_choice"] == "auto"
    assert "tools" not in server.seen[1].body and "tool_choice" not in server.seen[1].body


async def test_untitled_schema_gets_a_valid_name(server: ScriptedServer) -> None:
    server.script(Reply(), Reply())
    await complete(make_spec(server.url), schema={"type": "object"})
    await complete(make_spec(server.url), schema={"title": "Peer answer!", "type": "object"})
    names = [s.body["response_format"]["json_schema"]["name"] for s in server.seen]
    assert names == ["answer", "Peer_answer_"]


async def test_absent_cached_tokens_is_none_and_length_passes_through(
    server: ScriptedServer,
) -> None:
    server.script(Reply(body=chat_body('{"loc', finish_reason="length")))
    result = await complete(make_spec(server.url))
    assert result.cached_tokens is None
    assert (result.text, result.finish_reason) == ('{"loc', "length")

    # vLLM without --enable-prompt-tokens-details sends the field as null.
    body = chat_body()
    body["usage"]["prompt_tokens_details"] = None
    server.script(Reply(body=body))
    result = await complete(make_spec(server.url))
    assert (result.prompt_tokens, result.cached_tokens) == (120, None)


async def test_5xx_is_retried_on_the_same_server(server: ScriptedServer) -> None:
    server.script(Reply(500, {"error": {"message": "engine dead"}}), Reply())
    result = await complete(make_spec(server.url))
    assert result.prompt_tokens == 120
    assert len(server.seen) == 2


async def test_failover_on_5xx_then_sticks_to_the_server_that_answered(
    server: ScriptedServer, other_server: ScriptedServer
) -> None:
    server.script(Reply(503, b"overloaded"))
    other_server.script(Reply(), Reply())
    backend = await OpenAIBackend.open(make_spec(server.url, other_server.url))
    try:
        await backend.complete(MESSAGES, max_tokens=8)
        await backend.complete(MESSAGES, max_tokens=8)
    finally:
        await backend.aclose()
    assert len(server.seen) == 1
    assert len(other_server.seen) == 2


async def test_failover_past_a_refused_connection(dead_url: str, server: ScriptedServer) -> None:
    server.script(Reply())
    started = time.monotonic()
    result = await complete(make_spec(dead_url, server.url, backoff_seconds=5.0))
    # The second server of the first round is tried without a backoff sleep.
    assert time.monotonic() - started < 1.0
    assert result.completion_tokens == 9
    assert len(server.seen) == 1


async def test_429_is_waited_out_for_as_long_as_retry_after_asks(server: ScriptedServer) -> None:
    server.script(Reply(429, {"error": {"message": "slow down"}}, headers={"Retry-After": "1"}))
    server.script(Reply())
    started = time.monotonic()
    result = await complete(make_spec(server.url, max_retries=0))
    assert time.monotonic() - started >= 1.0
    assert result.completion_tokens == 9
    assert len(server.seen) == 2


async def test_a_server_refusing_past_the_outage_budget_is_model_unavailable(
    server: ScriptedServer,
) -> None:
    server.script(*[Reply(429, {"error": {"message": "slow down"}})] * 1000)
    started = time.monotonic()
    with pytest.raises(LLMError) as caught:
        await complete(make_spec(server.url, max_retries=0, outage_budget_seconds=0.5))
    assert time.monotonic() - started >= 0.5
    assert caught.value.reason == "model_unavailable"
    assert "no LLM server could serve for 0.5s (llm.outage_budget_seconds)" in str(caught.value)
    assert "slow down" in str(caught.value)


async def test_all_servers_refusing_past_the_budget_is_model_unavailable(dead_url: str) -> None:
    with pytest.raises(LLMError) as caught:
        await complete(make_spec(dead_url, max_retries=0, outage_budget_seconds=0.3))
    assert caught.value.reason == "model_unavailable"
    assert "ConnectError" in str(caught.value)


async def test_a_dead_servers_circuit_opens_and_only_probes_reach_it(
    server: ScriptedServer,
) -> None:
    dead = ScriptedServer()
    dead.script(*[Reply(503, {"error": {"message": "loading model"}})] * 100)
    try:
        spec = make_spec(dead.url, breaker_failures=2, probe_seconds=0.2, outage_budget_seconds=1.0)
        with pytest.raises(LLMError) as caught:
            await complete(spec)
    finally:
        dead.close()
    assert caught.value.reason == "model_unavailable"
    calls = [s for s in dead.seen if s.method == "POST"]
    probes = [s for s in dead.seen if (s.method, s.path) == ("GET", "/v1/models")]
    assert len(calls) == 2  # the circuit opened: no call hammers it
    assert 2 <= len(probes) <= 6


async def test_a_server_back_within_the_budget_answers_the_waiting_call(dead_url: str) -> None:
    spec = make_spec(dead_url, breaker_failures=1, probe_seconds=0.1)
    with structlog.testing.capture_logs() as events:
        call = asyncio.ensure_future(complete(spec))
        await asyncio.sleep(1.0)  # about ten probes meet the dead server
        assert not call.done()
        port = int(dead_url.rsplit(":", 1)[1])
        back = ScriptedServer(port=port, otherwise=lambda body: Reply())
        try:
            result = await asyncio.wait_for(call, 5.0)
        finally:
            back.close()
    assert result.completion_tokens == 9
    assert [(s.method, s.path) for s in back.seen][-1] == ("POST", "/v1/chat/completions")
    # Told once when it began and once when it ended, not once per attempt or probe.
    told = [e for e in events if e["log_level"] in ("warning", "error")]
    assert [e["event"] for e in told] == ["outage began", "outage ended"]
    assert told[0]["base_url"] == dead_url and told[0]["kind"] == "unavailable"
    assert told[1]["down_seconds"] > 0.5


async def test_with_one_server_dead_every_call_goes_to_the_live_one(
    dead_url: str, server: ScriptedServer
) -> None:
    server.script(*[Reply() for _ in range(6)])
    backend = await OpenAIBackend.open(make_spec(dead_url, server.url, breaker_failures=1))
    try:
        results = await asyncio.gather(
            *(backend.complete(MESSAGES, max_tokens=8) for _ in range(6))
        )
        dead = backend.pool.servers[0]
        assert not dead.closed  # its circuit opened at the first refusal
        assert backend.pool.up
    finally:
        await backend.aclose()
    assert [r.completion_tokens for r in results] == [9] * 6
    assert len(server.seen) == 6


async def test_a_read_timeout_is_told_apart_from_the_whole_exchanges(
    server: ScriptedServer,
) -> None:
    server.script(Reply(delay=1.0))
    spec = make_spec(server.url, read_timeout_seconds=0.2, timeout_seconds=5.0, max_retries=0)
    with pytest.raises(LLMError) as caught:
        await complete(spec)
    assert caught.value.reason == "read_timeout"


async def test_slow_server_times_out_and_is_retried(server: ScriptedServer) -> None:
    server.script(Reply(delay=1.0), Reply(delay=1.0))
    started = time.monotonic()
    with pytest.raises(LLMError) as caught:
        await complete(make_spec(server.url, timeout_seconds=0.2, max_retries=1))
    elapsed = time.monotonic() - started
    assert caught.value.reason == "timeout"
    assert len(server.seen) == 2
    assert elapsed < 1.5  # two 0.2 s attempts and a <= 0.02 s backoff, not two 1 s answers


async def test_garbage_200_is_retried_then_reported_as_bad_response(
    server: ScriptedServer,
) -> None:
    server.script(Reply(body=b"<html>proxy error</html>"), Reply())
    assert (await complete(make_spec(server.url))).completion_tokens == 9

    server.script(Reply(body=b"{not json"), Reply(body={"choices": []}))
    with pytest.raises(LLMError) as caught:
        await complete(make_spec(server.url, max_retries=1))
    assert caught.value.reason == "bad_response"
    assert len(server.seen) == 4


async def test_400_is_not_retried_and_carries_the_server_message(server: ScriptedServer) -> None:
    message = "Invalid JSON schema: unsupported keyword 'patternProperties'"
    server.script(Reply(400, {"object": "error", "message": message, "code": 400}))
    with pytest.raises(LLMError) as caught:
        await complete(make_spec(server.url))
    assert caught.value.reason == "bad_request"
    assert message in str(caught.value)
    assert len(server.seen) == 1


@pytest.mark.parametrize(
    "body",
    [
        {  # vLLM
            "object": "error",
            "message": "This model's maximum context length is 8192 tokens. However, you "
            "requested 9000 tokens (8900 in the messages, 100 in the completion).",
            "type": "BadRequestError",
            "code": 400,
        },
        {  # OpenAI and llama-cpp-python
            "error": {"message": "Too long.", "code": "context_length_exceeded"},
        },
    ],
)
async def test_prompt_too_long_is_context_exceeded(
    server: ScriptedServer, body: dict[str, Any]
) -> None:
    server.script(Reply(400, body))
    with pytest.raises(LLMError) as caught:
        await complete(make_spec(server.url))
    assert caught.value.reason == "context_exceeded"
    assert len(server.seen) == 1


async def test_backoff_is_capped(server: ScriptedServer) -> None:
    server.script(*[Reply(500, b"down")] * 4)
    started = time.monotonic()
    with pytest.raises(LLMError):
        # Uncapped, the sleeps would be drawn from up to 10, 20 and 40 seconds.
        await complete(make_spec(server.url, backoff_seconds=10.0, backoff_max_seconds=0.05))
    assert time.monotonic() - started < 1.0
    assert len(server.seen) == 4


async def test_concurrency_bounds_requests_in_flight(server: ScriptedServer) -> None:
    server.script(*[Reply(delay=0.1)] * 6)
    backend = await OpenAIBackend.open(make_spec(server.url, concurrency=2))
    try:
        results = await asyncio.gather(
            *(backend.complete(MESSAGES, max_tokens=8) for _ in range(6))
        )
    finally:
        await backend.aclose()
    assert len(results) == 6
    assert server.max_in_flight == 2


async def test_probe_lists_models_and_fails_over(dead_url: str, server: ScriptedServer) -> None:
    server.script(Reply(body={"object": "list", "data": [{"id": "qwen-test"}, {"id": "lora"}]}))
    backend = await OpenAIBackend.open(make_spec(dead_url, server.url))
    try:
        assert await backend.probe() == ["qwen-test", "lora"]
    finally:
        await backend.aclose()
    assert [(s.method, s.path) for s in server.seen] == [("GET", "/v1/models")]


async def test_probe_with_no_server_raises(dead_url: str) -> None:
    backend = await OpenAIBackend.open(make_spec(dead_url))
    try:
        with pytest.raises(LLMError) as caught:
            await backend.probe()
    finally:
        await backend.aclose()
    assert caught.value.reason == "unavailable"


async def test_api_key_never_in_repr_dump_logs_or_errors(
    server: ScriptedServer, caplog: pytest.LogCaptureFixture
) -> None:
    spec = make_spec(server.url, api_key=SECRET, max_retries=1)
    assert SECRET not in repr(spec)
    assert SECRET not in str(spec)
    assert SECRET not in spec.model_dump_json()

    server.script(Reply(500, b"down"), Reply(401, {"error": {"message": "bad key"}}))
    caplog.set_level(logging.DEBUG)
    with structlog.testing.capture_logs() as events, pytest.raises(LLMError) as caught:
        await complete(spec)

    assert caught.value.reason == "bad_request"
    assert any(e["event"] == "llm_request_failed" for e in events)  # something was logged
    assert SECRET not in repr(events)
    assert SECRET not in caplog.text
    assert SECRET not in str(caught.value)
    assert server.seen[0].headers["Authorization"] == f"Bearer {SECRET}"


async def test_api_key_from_environment(
    server: ScriptedServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("POIROTD_LLM_API_KEY", "from-env")
    server.script(Reply(), Reply())
    await complete(make_spec(server.url))
    await complete(make_spec(server.url, api_key="from-spec"))
    assert [s.headers["Authorization"] for s in server.seen] == [
        "Bearer from-env",
        "Bearer from-spec",
    ]


async def test_count_tokens_is_a_high_estimate(dead_url: str) -> None:
    backend = await OpenAIBackend.open(make_spec(dead_url))
    short = backend.count_tokens([ChatMessage(role="user", content="hi")])
    text = "The exoskeleton knee actuator reported a torque spike. " * 20
    long = backend.count_tokens([ChatMessage(role="user", content=text)])
    await backend.aclose()
    assert short >= 1
    assert long >= len(text) // 3  # prose averages ~4 bytes per token; 3 errs high


def test_spec_selects_backend_by_discriminator() -> None:
    base = {
        "system": {"name": "cortex", "description": "exoskeleton"},
        "agents": [{"id": "planner", "name": "Planner", "system_prompt": "Plan."}],
    }
    spec = SystemSpec.model_validate(
        base | {"llm": {"backend": "openai", "base_urls": ["http://vllm:8000/v1"], "model": "m"}}
    )
    assert isinstance(spec.llm, OpenAILLMSpec)
    assert spec.llm.structured_output == "json_schema"
    with pytest.raises(ValueError, match="base_urls"):
        SystemSpec.model_validate(
            base | {"llm": {"backend": "openai", "base_urls": [], "model": "m"}}
        )


async def test_factory_opens_the_http_backend_without_contacting_it(dead_url: str) -> None:
    backend = await open_backend(make_spec(dead_url))
    try:
        assert isinstance(backend, OpenAIBackend)
        assert backend.name == "openai"
        assert backend.context_tokens == 32768
    finally:
        await backend.aclose()
