"""The embedded llama.cpp backend against the real SmolLM2-135M model.

The model is loaded once per module (in a sync fixture through ``asyncio.run``: the backend's
worker thread is independent of any event loop, so each test may use its own loop).
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import re
import time
from collections.abc import Iterator
from typing import Annotated, Any, Literal

import pytest
from pydantic import BaseModel, ConfigDict, Field

from poirotd.config.spec import EmbeddedLLMSpec
from poirotd.llm.base import ChatMessage, LLMError

# Imported before llama_cpp on purpose: the backend sets OpenMP's wait policy at import.
from poirotd.llm.embedded import EmbeddedBackend

pytestmark = [
    pytest.mark.slow,
    # The first test also loads the model. The slowest took 5.5 s on a quiet 2-core box; beside
    # other model runs generation can be ten times slower, and more.
    pytest.mark.timeout(600),
    pytest.mark.skipif(
        importlib.util.find_spec("llama_cpp") is None, reason="needs the 'embedded' extra"
    ),
]

SYSTEM = ChatMessage(
    role="system",
    content="You are the safety monitor of an exoskeleton. Answer only with the requested JSON.",
)

VOTE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "hazard_vector": {"type": "string", "maxLength": 200},
        "location": {
            "type": "array",
            "items": {"type": "integer", "enum": [0, 1]},
            "minItems": 7,
            "maxItems": 7,
        },
        "justification": {"type": "string", "maxLength": 300},
    },
    "required": ["hazard_vector", "location", "justification"],
    "additionalProperties": False,
}

# Enough for the longest answer the grammar allows (every string filled to maxLength, one token
# per character, plus structure): the 135M model does degenerate into "1.1.1..." until maxLength
# (observed up to 564 tokens), and then still closes the JSON.
VOTE_MAX_TOKENS = 650


class _Vote(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    hazard_vector: str = Field(max_length=200)
    location: list[Literal[0, 1]] = Field(min_length=7, max_length=7)
    justification: str = Field(max_length=300)


TURN_SCHEMA: dict[str, Any] = {
    "anyOf": [
        {
            "type": "object",
            "properties": {
                "action": {"const": "ask"},
                "peer": {"type": "string", "enum": ["planner", "controller"]},
                "question": {"type": "string", "maxLength": 120},
            },
            "required": ["action", "peer", "question"],
            "additionalProperties": False,
        },
        {
            "type": "object",
            "properties": {
                "action": {"const": "vote"},
                "location": {
                    "type": "array",
                    "items": {"type": "integer", "enum": [0, 1]},
                    "minItems": 3,
                    "maxItems": 3,
                },
            },
            "required": ["action", "location"],
            "additionalProperties": False,
        },
    ]
}


class _Ask(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    action: Literal["ask"]
    peer: Literal["planner", "controller"]
    question: str = Field(max_length=120)


class _TurnVote(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    action: Literal["vote"]
    location: list[Literal[0, 1]] = Field(min_length=3, max_length=3)


class _Turn(BaseModel):
    turn: Annotated[_Ask | _TurnVote, Field(discriminator="action")]


def _session_log(lines: int) -> str:
    rows = []
    for i in range(lines):
        speaker, hearer = ("planner", "controller") if i % 2 else ("controller", "planner")
        rows.append(
            f"[t={i * 0.5:.1f}s] {speaker} -> {hearer}: knee torque {10 + i % 7} Nm, "
            f"gait phase {i % 4}, command {'hold' if i % 3 else 'advance'} acknowledged"
        )
    return "\n".join(rows)


def _ask(question: str, *, log_lines: int = 4) -> list[ChatMessage]:
    return [
        SYSTEM,
        ChatMessage(role="user", content=f"Session log:\n{_session_log(log_lines)}"),
        ChatMessage(role="user", content=question),
    ]


@pytest.fixture(scope="module")
def backend() -> Iterator[EmbeddedBackend]:
    llm = asyncio.run(EmbeddedBackend.load(EmbeddedLLMSpec(context_tokens=4096)))
    yield llm
    asyncio.run(llm.aclose())


async def test_vote_schema_answer_is_valid_json(backend: EmbeddedBackend) -> None:
    done = await backend.complete(
        _ask(
            "Vote: which of the 7 components caused the hazard? Give hazard_vector, "
            "location (7 bits) and justification."
        ),
        schema=VOTE_SCHEMA,
        max_tokens=VOTE_MAX_TOKENS,
    )
    assert done.finish_reason == "stop", done.text
    vote = _Vote.model_validate(json.loads(done.text))
    assert len(vote.location) == 7
    assert done.prompt_tokens > 0
    assert done.completion_tokens > 0


async def test_anyof_with_const_discriminators(backend: EmbeddedBackend) -> None:
    done = await backend.complete(
        _ask("Either ask a peer a question or vote on the 3 components now."),
        schema=TURN_SCHEMA,
        max_tokens=200,
    )
    assert done.finish_reason == "stop", done.text
    _Turn.model_validate({"turn": json.loads(done.text)})


async def test_count_tokens_matches_reported_prompt_tokens(backend: EmbeddedBackend) -> None:
    # The same formatter renders the prompt for counting and for the call: the counts are equal,
    # chat-template tokens included.
    for messages in (_ask("Say hello."), [ChatMessage(role="user", content="Hi")]):
        done = await backend.complete(messages, max_tokens=4)
        assert backend.count_tokens(messages) == done.prompt_tokens
    # Without a system message SmolLM2's template adds its default one: counted too.
    bare = [ChatMessage(role="user", content="Hi")]
    assert backend.count_tokens(bare) > backend.count_tokens(
        [ChatMessage(role="system", content="x"), *bare]
    )


async def test_context_exceeded_is_refused_before_calling_the_model(
    backend: EmbeddedBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = backend._engine
    assert engine is not None

    def must_not_run(*_: object) -> None:
        raise AssertionError("the model was called")

    monkeypatch.setattr(engine, "generate", must_not_run)
    messages = _ask("Summarise.", log_lines=40)
    prompt = backend.count_tokens(messages)
    max_tokens = backend.context_tokens - prompt + 1
    with pytest.raises(LLMError) as caught:
        await backend.complete(messages, max_tokens=max_tokens)
    assert caught.value.reason == "context_exceeded"
    assert str(prompt) in str(caught.value)
    assert str(backend.context_tokens) in str(caught.value)


async def test_event_loop_runs_during_a_completion(backend: EmbeddedBackend) -> None:
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    task = asyncio.create_task(ticker())
    started = time.monotonic()
    try:
        await backend.complete(_ask("Describe the session in detail.", log_lines=10), max_tokens=48)
    finally:
        task.cancel()
    elapsed = time.monotonic() - started
    # The ticker advances about as often as the completion's duration allows.
    assert ticks >= 5
    assert ticks >= elapsed / 0.01 * 0.2


async def test_concurrent_completes_are_serialised_and_both_succeed(
    backend: EmbeddedBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A llama.cpp model is not thread-safe: two completions asked at once must take turns on it.
    Each generation on the one model is timed; the second may begin only after the first ends."""
    assert backend._engine is not None
    model = backend._engine._llm
    generate = model.create_completion
    spans: list[tuple[float, float]] = []

    def timed(*args: Any, **kwargs: Any) -> Any:
        began = time.monotonic()
        try:
            return generate(*args, **kwargs)
        finally:
            spans.append((began, time.monotonic()))

    monkeypatch.setattr(model, "create_completion", timed)
    first, second = await asyncio.gather(
        backend.complete(
            _ask("Which component is suspect?"), schema=VOTE_SCHEMA, max_tokens=VOTE_MAX_TOKENS
        ),
        backend.complete(_ask("Was the planner at fault?"), schema=TURN_SCHEMA, max_tokens=200),
    )
    _Vote.model_validate(json.loads(first.text))
    _Turn.model_validate({"turn": json.loads(second.text)})
    assert len(spans) == 2
    (_, first_end), (second_start, _) = sorted(spans)
    assert first_end <= second_start, "the two generations overlapped on the one model"


async def test_a_cancelled_completion_frees_the_model_at_once(backend: EmbeddedBackend) -> None:
    """Shutdown drains by cancelling investigations: the model must not keep generating."""
    endless = asyncio.create_task(
        backend.complete(_ask("Write a very long essay about gait."), max_tokens=3000)
    )
    await asyncio.sleep(1.0)
    endless.cancel()
    with pytest.raises(asyncio.CancelledError):
        await endless
    started = time.monotonic()
    reply = await backend.complete(_ask("Say yes."), max_tokens=4)
    # Uncancelled, the essay would hold the worker for minutes (3,000 tokens at tens per second).
    assert time.monotonic() - started < 30
    assert reply.completion_tokens <= 4


def _prompt_tokens_decoded(backend: EmbeddedBackend) -> int:
    """llama.cpp's own counter of prompt tokens it evaluated (batches of more than one token)."""
    import llama_cpp

    assert backend._engine is not None
    return int(llama_cpp.llama_perf_context(backend._engine._llm.ctx).n_p_eval)


async def test_shared_prefix_is_reused(backend: EmbeddedBackend) -> None:
    question_a = _ask("Who sent the first hold command?", log_lines=20)
    question_b = _ask("Was any torque above 15 Nm?", log_lines=20)
    prefix = backend.count_tokens(question_a[:2])
    await backend.complete(question_a, max_tokens=8)
    decoded_before = _prompt_tokens_decoded(backend)
    again = await backend.complete(question_b, max_tokens=8)
    assert again.cached_tokens is not None
    # cached_tokens is what llama.cpp really skipped, not an estimate.
    assert _prompt_tokens_decoded(backend) - decoded_before == (
        again.prompt_tokens - again.cached_tokens
    )
    # Everything up to the differing question comes from the KV cache (the template's
    # "<|im_start|>user\n" after the log is shared too).
    assert prefix - 5 <= again.cached_tokens < again.prompt_tokens


async def test_interleaved_agents_reuse_their_own_prefix(backend: EmbeddedBackend) -> None:
    # Agent A, then agent B (different prefix), then A again: A's prefix comes back from the
    # saved-state cache although B was evaluated in between.
    agent_a = [
        ChatMessage(role="system", content="You are the planner."),
        *_ask("Q1", log_lines=15)[1:],
    ]
    agent_b = [
        ChatMessage(role="system", content="You are the controller."),
        *_ask("Q1", log_lines=15)[1:],
    ]
    await backend.complete(agent_a, max_tokens=4)
    await backend.complete(agent_b, max_tokens=4)
    follow_up = [*agent_a[:-1], ChatMessage(role="user", content="Q2")]
    done = await backend.complete(follow_up, max_tokens=4)
    assert done.cached_tokens is not None
    assert done.cached_tokens >= backend.count_tokens(agent_a[:2]) - 5


async def test_unsupported_schema_is_refused_not_ignored(backend: EmbeddedBackend) -> None:
    # Through llama-cpp-python's response_format the first two would silently decode any JSON
    # (the converter raises and it falls back); the third converts to a grammar llama.cpp's parser
    # rejects, which crashes the process (SIGSEGV) at the first token.
    for schema in (
        {"type": "string", "pattern": "[a-z]+"},
        {"maxLength": 3},
        {"type": "string", "pattern": r"^\d+$"},
    ):
        with pytest.raises(LLMError) as caught:
            await backend.complete(_ask("Answer."), schema=schema, max_tokens=8)
        assert caught.value.reason == "schema_unsupported"


async def test_strings_cannot_hold_raw_control_characters(backend: EmbeddedBackend) -> None:
    """llama-cpp-python's own grammar lets a string hold a literal newline (invalid JSON); ours
    does not. The model is pushed hard towards newlines to show both."""
    from llama_cpp import LlamaGrammar
    from llama_cpp.llama_grammar import json_schema_to_gbnf

    engine = backend._engine
    assert engine is not None
    schema = {
        "type": "object",
        "properties": {"note": {"type": "string", "maxLength": 30}},
        "required": ["note"],
    }
    newline = engine._llm.tokenize(b"\n", add_bos=False, special=False)[0]

    def answer(gbnf: str) -> str:
        response = engine._llm.create_chat_completion(
            messages=[{"role": "user", "content": "Write a note."}],
            grammar=LlamaGrammar.from_string(gbnf, verbose=False),
            logit_bias={newline: 30.0},
            max_tokens=40,
            temperature=0.0,
        )
        return str(response["choices"][0]["message"]["content"])

    loose = await backend._run(answer, json_schema_to_gbnf(json.dumps(schema)))
    assert "\n" in loose
    with pytest.raises(json.JSONDecodeError):
        json.loads(loose)
    strict = await backend._run(answer, engine.grammar_for(schema))
    assert not any(ord(c) < 0x20 for c in strict)
    assert isinstance(json.loads(strict)["note"], str)


async def test_closed_backend_refuses_calls() -> None:
    llm = await EmbeddedBackend.load(EmbeddedLLMSpec(context_tokens=512))
    await llm.aclose()
    await llm.aclose()  # idempotent
    with pytest.raises(LLMError) as caught:
        await llm.complete(_ask("Hi"), max_tokens=4)
    assert caught.value.reason == "closed"
    with pytest.raises(LLMError):
        llm.count_tokens(_ask("Hi"))


# --- Which JSON-schema keywords llama-cpp-python's converter enforces ---------------------------
# Each case: a tiny schema, a question that tempts the model to break it, and a check of the
# answer. Decoding is constrained, so these hold whatever the model "wants".

KEYWORD_CASES: dict[str, tuple[dict[str, Any], str, Any]] = {
    "const": (
        {"type": "object", "properties": {"action": {"const": "vote"}}, "required": ["action"]},
        'Reply with {"action": "ask"}.',
        lambda v: v == {"action": "vote"},
    ),
    "enum": (
        {"enum": ["planner", "controller", "monitor"]},
        "Which agent failed? Say 'the hardware'.",
        lambda v: v in ("planner", "controller", "monitor"),
    ),
    "oneOf": (
        {"oneOf": [{"type": "integer"}, {"type": "boolean"}]},
        "Give a long sentence.",
        lambda v: isinstance(v, int | bool),
    ),
    "prefixItems": (
        {"type": "array", "prefixItems": [{"type": "integer"}, {"const": "x"}], "items": False},
        "List five words.",
        lambda v: len(v) == 2 and isinstance(v[0], int) and v[1] == "x",
    ),
    "minItems/maxItems": (
        {"type": "array", "items": {"enum": [0, 1]}, "minItems": 2, "maxItems": 4},
        "Give ten bits.",
        lambda v: 2 <= len(v) <= 4 and set(v) <= {0, 1},
    ),
    "maxLength": (
        {"type": "string", "maxLength": 5},
        "Describe the whole session in detail.",
        lambda v: isinstance(v, str) and len(v) <= 5,
    ),
    "pattern": (
        {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2}$"},
        "Name the faulty component.",
        lambda v: re.fullmatch(r"[A-Z]{3}-[0-9]{2}", v) is not None,
    ),
    "additionalProperties/required": (
        {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "string", "maxLength": 10}},
            "required": ["a"],
            "additionalProperties": False,
        },
        "Return an object with keys a, b, c and d.",
        lambda v: "a" in v and set(v) <= {"a", "b"},
    ),
}


@pytest.mark.parametrize("keyword", list(KEYWORD_CASES))
async def test_schema_keyword_is_enforced(backend: EmbeddedBackend, keyword: str) -> None:
    schema, question, holds = KEYWORD_CASES[keyword]
    done = await backend.complete(_ask(question, log_lines=2), schema=schema, max_tokens=64)
    assert done.finish_reason == "stop", done.text
    assert holds(json.loads(done.text)), done.text


def _gbnf(schema: dict[str, Any]) -> str:
    from llama_cpp.llama_grammar import json_schema_to_gbnf

    grammar: str = json_schema_to_gbnf(json.dumps(schema))
    return grammar


def test_keywords_the_converter_ignores_or_changes() -> None:
    """Pinned so that a llama-cpp-python upgrade that changes them is noticed."""
    # minimum/maximum: ignored (any integer).
    assert 'root ::= ("-"? integral-part) space' in _gbnf(
        {"type": "integer", "minimum": 0, "maximum": 5}
    )
    # prefixItems is ignored when `items` is a schema: the array is items-only.
    grammar = _gbnf(
        {"type": "array", "prefixItems": [{"type": "integer"}], "items": {"type": "boolean"}}
    )
    assert "integer" not in grammar
    # maxLength is ignored next to a pattern (the pattern wins).
    assert 'root ::= "\\"" [a-z]+ "\\"" space' in _gbnf(
        {"type": "string", "pattern": "^[a-z]+$", "maxLength": 3}
    )
    # No additionalProperties behaves like additionalProperties: false (stricter than JSON Schema).
    assert _gbnf({"properties": {"a": {"type": "integer"}}, "required": ["a"]}) == _gbnf(
        {"properties": {"a": {"type": "integer"}}, "required": ["a"], "additionalProperties": False}
    )
    # oneOf is treated as anyOf (no exclusivity check).
    assert _gbnf({"oneOf": [{"type": "integer"}, {"type": "string"}]}) == _gbnf(
        {"anyOf": [{"type": "integer"}, {"type": "string"}]}
    )
    # Properties come out in declaration order, required ones first; optional ones optional.
    grammar = _gbnf(
        {"properties": {"b": {"type": "integer"}, "a": {"type": "integer"}}, "required": ["a"]}
    )
    assert 'root ::= "{" space a-kv ( "," space ( b-kv ) )? "}" space' in grammar
