"""The request bodies the OpenAI-compatible backend sends, against the parameters vLLM's server
takes in the version deploy/ runs (tests/data/vllm/openai-api-<version>.json, read from that
version's vllm/entrypoints/openai/protocol.py). vLLM ignores a field it does not know with only a
log line, so a misspelled or renamed parameter would silently do nothing: every field poirotd
sends must be one vLLM reads.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from poirotd.protocol.poirot.peer_tools import turn_tools
from poirotd.protocol.poirot.schemas import vote_format
from tests.support.answers import chat_body
from tests.support.openai_server import Reply, ScriptedServer, complete, make_spec
from tests.support.vllm_grammars import VLLM_VERSION

ROOT = Path(__file__).resolve().parents[2]
API: dict[str, Any] = json.loads(
    (ROOT / "tests" / "data" / "vllm" / f"openai-api-{VLLM_VERSION}.json").read_text()
)
FIELDS: dict[str, list[str]] = API["fields"]
VOTE = vote_format(4, {0, 1}).schema


@pytest.fixture
def server() -> Iterator[ScriptedServer]:
    s = ScriptedServer()
    yield s
    s.close()


def test_deploy_runs_the_vllm_version_these_checks_are_for() -> None:
    tags = {
        m
        for path in (ROOT / "deploy").rglob("*.yaml")
        for m in re.findall(r"vllm/vllm-openai:v([\w.]+)", path.read_text())
    }
    assert tags == {VLLM_VERSION}, "update tests/support/vllm_grammars.py and tests/data/vllm"


def unknown(model: str, body: dict[str, Any]) -> set[str]:
    return set(body) - set(FIELDS[model])


async def bodies(server: ScriptedServer, **spec: Any) -> list[dict[str, Any]]:
    """What the backend sends for a schema-constrained answer and for a tool turn."""
    server.script(Reply(body=chat_body()), Reply(body=chat_body()))
    backend_spec = make_spec(server.url, **spec)
    await complete(backend_spec, schema=VOTE)
    await complete(backend_spec, tools=list(turn_tools(["planner"], 4, {0, 1}).tools))
    return [seen.body for seen in server.seen]


@pytest.mark.parametrize("tool_choice", ["required", "auto"])
async def test_every_field_sent_is_one_vllm_reads(server: ScriptedServer, tool_choice: str) -> None:
    answer, turn = await bodies(server, tool_choice=tool_choice)

    for body in (answer, turn):
        assert unknown("ChatCompletionRequest", body) == set()
        for message in body["messages"]:
            assert set(message) <= {"role", "content", "tool_calls", "tool_call_id"}
    response_format = answer["response_format"]
    assert response_format["type"] in API["response_format_types"]
    assert unknown("ResponseFormat", response_format) == set()
    assert unknown("JsonSchemaResponseFormat", response_format["json_schema"]) == set()
    # vLLM decodes under json_schema.schema (the field OpenAI names `schema`).
    assert response_format["json_schema"]["schema"] == VOTE

    assert turn["tool_choice"] == tool_choice and tool_choice in API["tool_choice"]
    for tool in turn["tools"]:
        assert tool["type"] in API["tool_types"]
        assert unknown("ChatCompletionToolsParam", tool) == set()
        assert unknown("FunctionDefinition", tool["function"]) == set()
    assert "response_format" not in turn


def test_this_version_spells_structured_outputs_as_response_format_and_guided_fields() -> None:
    """vLLM 0.10.1.1 has `guided_json` and its siblings, and no `structured_outputs` (0.10.2 adds
    it, 0.12 drops guided_*); `response_format` works in all of them, so it is what poirotd
    sends. `chat_template_kwargs` is there too (poirotd sends none)."""
    request = FIELDS["ChatCompletionRequest"]
    assert {"response_format", "guided_json", "chat_template_kwargs", "tool_choice"} <= set(request)
    assert "structured_outputs" not in request


def test_a_misspelled_field_is_caught() -> None:
    body = {"model": "m", "messages": [], "structured_outputs": {"json": VOTE}}
    assert unknown("ChatCompletionRequest", body) == {"structured_outputs"}
