"""Every schema poirotd sends, through the two engines vLLM enforces it with (xgrammar and
llguidance, as vLLM v0.10.1.1 drives them; tests/support/vllm_grammars.py).

For each schema (tests/support/request_formats.py): both engines compile it, and vLLM's "auto"
would keep it on xgrammar; answers drawn from the schema are taken by poirotd's parser and by
both engines; each near miss (one step outside the schema) is judged by both engines exactly as
the JSON Schema validator judges it, and whatever poirotd's parser refuses, both engines refuse:
constrained decoding can never produce an answer the daemon then throws away. Answers recorded
from real models (tests/data/eval) go through the same checks.
"""

from __future__ import annotations

import json
import re
from typing import Any

import jsonschema
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from poirotd.protocol.poirot.schemas import vote_format
from poirotd.protocol.schemas import InvalidAnswerError
from tests.support.data import DATA, RUNS
from tests.support.json_answers import answers, near_misses, plain, texts
from tests.support.request_formats import RequestFormat, all_formats, rejects
from tests.support.vllm_grammars import (
    Engine,
    Grammar,
    SchemaRefusedError,
    engines,
    ignored_by_xgrammar,
)

FORMATS = all_formats()
_GRAMMARS: dict[tuple[str, str], Grammar] = {}
# The same examples on every run (derandomize), and no shrinking: each example compiles and
# matches grammars, so hypothesis' shrinking of a failure outlasts any test timeout; the
# failing example is reported as drawn.
EXAMPLES = settings(
    max_examples=4,
    deadline=None,
    database=None,
    derandomize=True,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def grammar(engine: Engine, fmt: RequestFormat) -> Grammar:
    """The engine's grammar for the format's schema, compiled once per test session."""
    key = (engine.name, json.dumps(fmt.schema, sort_keys=True))
    if key not in _GRAMMARS:
        _GRAMMARS[key] = engine.compile(fmt.schema)
    return _GRAMMARS[key]


def valid(schema: dict[str, Any], value: Any) -> bool:
    return bool(jsonschema.Draft202012Validator(schema).is_valid(value))


def test_the_catalogue_covers_every_method_and_phase() -> None:
    kinds = {f.name.rsplit("/", 1)[0] for f in FORMATS}
    assert kinds == {
        "poirot/phase1-hazard-space", "poirot/phase2-report", "poirot/phase3-action-object",
        "poirot/phase3-tool-calls", "poirot/phase4-vote", "baseline/vote", "echo/analysis",
        "errorprobe/detector-tags", "errorprobe/strategist-hypotheses",
        "errorprobe/investigator-evidence", "errorprobe/arbiter-verdict",
    }  # fmt: skip


# Compiling the largest schemas (TradingAgents' twelve agents) took 40 s on a loaded 2-core box.
@pytest.mark.timeout(300)
@pytest.mark.parametrize("fmt", FORMATS, ids=str)
def test_both_engines_compile_the_schema_and_auto_keeps_xgrammar(fmt: RequestFormat) -> None:
    jsonschema.Draft202012Validator.check_schema(fmt.schema)
    assert list(ignored_by_xgrammar(fmt.schema)) == []
    for engine in engines():
        grammar(engine, fmt)


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("fmt", FORMATS, ids=str)
@EXAMPLES
@given(data=st.data())
def test_answers_the_schema_allows_are_taken_by_poirotd_and_both_engines(
    fmt: RequestFormat, data: st.DataObject
) -> None:
    value = data.draw(answers(fmt.answered), label="answer")
    for engine in engines():
        for text in texts(value, engine.floats):
            assert not rejects(fmt, text), text
        # Escapes aside (xgrammar 0.1.21 takes none in a bounded string; see the test below).
        for text in texts(plain(value), engine.floats):
            assert grammar(engine, fmt).accepts(text), f"{engine.name} refused {text}"


# Near misses an engine takes although the schema refuses them, pinned (strict xfail) so that
# an engine upgrade that closes the gap shows. xgrammar 0.1.21 ignores maxLength beside a
# pattern: a sub-region's slug past SLUG_MAX (40) passes its grammar (the pattern allows 67);
# poirotd's parser refuses it and asks again (docs/vllm-grammars.md).
ENGINE_GAPS = {
    "poirot/phase1-hazard-space/3a1c2s": "xgrammar ignores maxLength beside a pattern (slug)",
}
NEAR_MISS_FORMATS = [
    pytest.param(f, marks=pytest.mark.xfail(strict=True, reason=ENGINE_GAPS[f.name]))
    if f.name in ENGINE_GAPS
    else f
    for f in FORMATS
]


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("fmt", NEAR_MISS_FORMATS, ids=str)
@EXAMPLES
@given(data=st.data())
def test_near_misses_are_judged_as_the_schema_says_and_what_poirotd_refuses_is_refused(
    fmt: RequestFormat, data: st.DataObject
) -> None:
    value = plain(data.draw(answers(fmt.answered), label="answer"))
    refused = 0
    for what, broken in near_misses(fmt.answered, value):
        allowed = valid(fmt.schema, broken)
        refused += not allowed
        for engine in engines():
            [text, *_] = texts(broken, engine.floats)
            verdict = grammar(engine, fmt).accepts(text)
            assert verdict == allowed, f"{engine.name} {'took' if verdict else 'refused'} {what}"
            if rejects(fmt, text):
                assert not valid(fmt.answered, broken), f"poirotd refuses what it asks: {what}"
    assert refused > 0


def test_several_tool_calls_pass_vllms_grammar_and_poirotd_asks_again() -> None:
    """vLLM's schema for tool_choice "required" is an array of at least one call, with no upper
    bound, and v0.10.1.1 ignores parallel_tool_calls: a model may call two tools in one turn.
    poirotd takes one call per turn; two are an invalid answer, repaired like any other."""
    [fmt] = [f for f in FORMATS if f.name == "poirot/phase3-tool-calls/3a1c2s-5steps"]
    ask = {"name": "talk_to_agent_1", "parameters": {"question": "Why?"}}
    two = json.dumps([ask, ask | {"name": "talk_to_agent_2"}])
    assert valid(fmt.schema, json.loads(two)) and rejects(fmt, two)
    with pytest.raises(InvalidAnswerError, match="call exactly one tool"):
        fmt.parse(two)
    for engine in engines():
        assert grammar(engine, fmt).accepts(two)


def test_cut_and_wrapped_answers_are_refused_by_both_engines() -> None:
    [fmt] = [f for f in FORMATS if f.name == "poirot/phase4-vote/3a1c2s-5steps"]
    answer = json.dumps(
        {"hazard_vector": "x", "location": [0, 0, 0, 1, 0, 0], "justification": "y", "step": 5}
    )
    for engine in engines():
        compiled = grammar(engine, fmt)
        assert compiled.accepts(answer)
        assert not compiled.accepts(answer[:-1])
        assert not compiled.accepts(f"```json\n{answer}\n```")
        assert not compiled.accepts(answer + " and that is my vote")


def test_xgrammar_takes_no_escape_in_a_bounded_string() -> None:
    """xgrammar 0.1.21 lets no escape sequence (a quote, a newline, \\u) into a string with a
    maxLength, and every free string poirotd asks for has one: under xgrammar a model cannot
    quote with double quotes or break lines inside a justification. llguidance can. When this
    fails, an xgrammar upgrade lifted the limit: update docs/vllm-grammars.md and `plain`."""
    [fmt] = [f for f in FORMATS if f.name == "poirot/phase4-vote/3a1c2s-5steps"]
    by_engine = {e.name: grammar(e, fmt) for e in engines()}

    def vote(justification: str) -> str:
        # Keys in the schema's order: both engines hold the model to it.
        return json.dumps(
            {"hazard_vector": "x", "location": [0, 0, 0, 1, 0, 0],
             "justification": justification, "step": None}
        )  # fmt: skip

    assert all(g.accepts(vote("plain")) for g in by_engine.values())
    for justification in ('he said "stop"', "line one\nline two", "tab\there"):
        assert not rejects(fmt, vote(justification))
        assert by_engine["llguidance"].accepts(vote(justification))
        assert not by_engine["xgrammar"].accepts(vote(justification))


# ------------------------------------------------------------------ the check reports what breaks


@pytest.mark.parametrize(
    ("schema", "refused_by"),
    [
        # vLLM would send these to llguidance under "auto", and refuse them on xgrammar alone.
        (
            {"type": "array", "items": {"type": "string"}, "uniqueItems": True},
            {"xgrammar", "llguidance"},
        ),
        ({"type": "string", "format": "email"}, {"xgrammar"}),
        ({"type": "integer", "multipleOf": 3}, {"xgrammar"}),
        # Neither engine has regex lookaround.
        ({"type": "string", "pattern": "^(?=a)ab$"}, {"xgrammar", "llguidance"}),
        # A reference to nowhere.
        (
            {"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}},
            {"xgrammar", "llguidance"},
        ),
    ],
)
def test_a_schema_feature_an_engine_cannot_serve_is_reported(
    schema: dict[str, Any], refused_by: set[str]
) -> None:
    refused = set()
    for engine in engines():
        try:
            engine.compile(schema)
        except SchemaRefusedError as exc:
            assert str(exc)
            refused.add(engine.name)
    assert refused == refused_by


def test_an_engine_that_does_not_enforce_a_bound_is_caught() -> None:
    """The near-miss check fails on a grammar that takes what the schema forbids: here the
    maxItems llguidance enforces, compared against a schema that says one fewer."""
    schema = {"type": "array", "items": {"type": "integer"}, "maxItems": 3}
    looser = {"type": "array", "items": {"type": "integer"}, "maxItems": 4}
    for engine in engines():
        compiled = engine.compile(looser)
        misses = dict(near_misses(schema, [1, 2, 3]))
        text = json.dumps(misses["$: 4 items"])
        assert compiled.accepts(text) and not valid(schema, json.loads(text))


# ------------------------------------------------------------------ answers real models wrote


def recorded_votes() -> list[tuple[str, str]]:
    """(where, answer text) of every Phase IV vote recorded in the runs and BLAME cases kept in
    tests/data/eval: real models' answers (Gemini 2.5 Pro for CORTEX run 182), as written."""
    found = []
    for path in sorted(RUNS.glob("*.json")):
        logs = json.loads(path.read_text()).get("chat_logs")
        for i, entry in enumerate(logs if isinstance(logs, list) else []):
            if entry["type"] == "AGENT" and '"hazard_vector"' in entry["content"]:
                found.append((f"{path.name}#{i}", entry["content"]))
    for path in sorted((DATA / "blame").glob("*/cases/*.json")):
        messages = json.loads(path.read_text()).get("messages", [])
        for m in messages:
            if '"hazard_vector"' in str(m.get("content", "")):
                found.append((f"{path.name}#{m['index']}", m["content"]))
    return found


def test_recorded_votes_are_judged_alike_by_poirotd_and_both_engines() -> None:
    votes = recorded_votes()
    assert len(votes) >= 4  # the four votes of CORTEX run 182
    taken = 0
    for where, text in votes:
        answer = json.loads(re.search(r"\{.*\}", text, re.DOTALL).group(0))  # type: ignore[union-attr]
        fmt = vote_format(len(answer["location"]), {0, 1, 2})
        assert fmt.schema is not None
        # As written (code fence, no step): poirotd reads it; no engine would have produced it.
        fmt.parse(text)
        for engine in engines():
            assert not engine.compile(fmt.schema).accepts(text), where
        # The JSON alone, with the step poirotd's schema asks for; then with the justification
        # cut to the schema's bound (Gemini's run past it), which both engines must let through.
        stepped = plain(answer | {"step": None})
        bound = fmt.schema["properties"]["justification"]["maxLength"]
        cut = stepped | {"justification": stepped["justification"][:bound]}
        for value in (stepped, cut):
            allowed = valid(fmt.schema, value)
            taken += allowed
            for candidate in texts(value):
                fmt.parse(candidate)
                for engine in engines():
                    assert engine.compile(fmt.schema).accepts(candidate) == allowed, (
                        where,
                        engine.name,
                    )
    assert taken >= len(votes)


def test_what_the_engines_make_a_model_write() -> None:
    """Pinned so that an engine upgrade that changes one is noticed (docs/vllm-grammars.md):
    keys in the schema's order; an enum's numbers in one spelling (xgrammar: 17 digits); no
    unescaped DEL under llguidance."""
    schema = {
        "type": "object",
        "properties": {"level": {"enum": [1.0, 0.9, 0.0]}, "note": {"type": "string"}},
        "required": ["level", "note"],
        "additionalProperties": False,
    }
    compiled = {e.name: e.compile(schema) for e in engines()}
    for g in compiled.values():
        assert g.accepts('{"level": 1, "note": ""}') and g.accepts('{"level": 0, "note": ""}')
        assert not g.accepts('{"note": "", "level": 1}')
        assert not g.accepts('{"level": 1.0, "note": ""}')
    assert compiled["xgrammar"].accepts('{"level": 0.90000000000000002, "note": ""}')
    assert not compiled["xgrammar"].accepts('{"level": 0.9, "note": ""}')
    assert compiled["llguidance"].accepts('{"level": 0.9, "note": ""}')
    assert compiled["xgrammar"].accepts('{"level": 1, "note": "\x7f"}')
    assert not compiled["llguidance"].accepts('{"level": 1, "note": "\x7f"}')
