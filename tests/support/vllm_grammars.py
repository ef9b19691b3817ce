"""vLLM's two structured-output engines, driven the way vLLM v0.10.1.1 (the image deploy/ names)
drives them, on CPU: xgrammar 0.1.21 (vLLM's pin, its default engine) and llguidance 0.7.x.

What vLLM does with a request's schema (vllm/v1/structured_output/backend_*.py and
vllm/v1/engine/processor.py at v0.10.1.1), and so what this module does:
- backend "auto" (the default) tries xgrammar: the schema must convert (`Grammar.from_json_schema`)
  and use none of the keywords vLLM knows xgrammar ignores (`XGRAMMAR_IGNORED`); otherwise the
  request goes to llguidance. `--guided-decoding-backend xgrammar` refuses such a request (400).
- xgrammar compiles with any whitespace allowed and strict mode (no properties or items beyond
  the schema's); llguidance with `whitespace_flexible`. Either may refuse a schema outright.
- `tool_choice: "required"` is decoded under a schema vLLM builds from the tools
  (`required_tool_schema`); "auto" is not constrained at all (the tool parser reads free text).

xgrammar's wheel declares torch, transformers and triton (gigabytes) and its Python package
imports torch and transformers at import time, but its compiler and matcher are one compiled
module that needs neither: `make test` installs the wheel with --no-deps and this module loads
that compiled module on its own (`_xgrammar_core`), calling it as xgrammar's thin Python wrappers
do. llguidance reads the embedded model's tokenizer (SmolLM2's 49152 tokens, from its GGUF file
with llama.cpp), a byte-level BPE vocabulary like the served models'. xgrammar gets a vocabulary
of the 256 bytes (`BYTES`): it computes every grammar state's token mask over the whole
vocabulary when it compiles, which for SmolLM2's took minutes per schema on this project's 2 shared
cores, while whether it accepts a text (`accept_string`, byte by byte) does not depend on the
vocabulary at all.
"""

from __future__ import annotations

import importlib.machinery
import importlib.metadata
import importlib.util
import json
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from types import ModuleType
from typing import Any, Protocol

import llama_cpp
import llguidance
import llguidance.llamacpp

from poirotd.llm.embedded import default_model_path

VLLM_VERSION = "0.10.1.1"
XGRAMMAR_VERSION = "0.1.21"
# Keywords xgrammar 0.1.21 compiles without enforcing, per the JSON type they sit on: vLLM
# v0.10.1.1 (has_xgrammar_unsupported_json_features) sends a schema with any of them to
# llguidance instead, or refuses it when xgrammar is the only backend allowed.
XGRAMMAR_IGNORED: dict[str, frozenset[str]] = {
    "integer": frozenset({"multipleOf"}),
    "number": frozenset({"multipleOf"}),
    "array": frozenset({"uniqueItems", "contains", "minContains", "maxContains"}),
    "string": frozenset({"format"}),
    "object": frozenset({"minProperties", "maxProperties", "propertyNames", "patternProperties"}),
}
# xgrammar's vocabulary kinds (xgrammar.VocabType): tokens given as their raw bytes.
_RAW_VOCAB = 0


class SchemaRefusedError(Exception):
    """The engine cannot serve this schema: vLLM would answer the request with an error (or,
    under "auto", move it to the other engine). The message says what the engine said."""


class Grammar(Protocol):
    def accepts(self, text: str) -> bool:
        """Whether constrained decoding can produce exactly `text` and then stop."""
        ...


class Engine(Protocol):
    name: str
    # How the engine spells an enum's fractions, the only way it lets a model write them
    # (a format for format(); "" for the shortest spelling).
    floats: str

    def compile(self, schema: dict[str, Any]) -> Grammar:
        """The grammar of `schema`, as vLLM would build it; raises SchemaRefusedError."""
        ...


@dataclass(frozen=True)
class Vocabulary:
    """A tokenizer's tokens as bytes; its control tokens (chat markers, end) are not text."""

    pieces: tuple[bytes, ...]
    control: frozenset[int]
    eos: int


# Every byte a token of its own, and an end-of-text token.
BYTES = Vocabulary((*tuple(bytes([b]) for b in range(256)), b""), frozenset({256}), 256)


@cache
def _embedded_model() -> llama_cpp.Llama:
    """The embedded model's GGUF file with its vocabulary only (no weights in memory)."""
    return llama_cpp.Llama(model_path=str(default_model_path()), vocab_only=True, verbose=False)


# ------------------------------------------------------------------ xgrammar


def _xgrammar_core() -> ModuleType:
    """xgrammar's compiled module, loaded without the package around it (which imports torch)."""
    version = importlib.metadata.version("xgrammar")
    if version != XGRAMMAR_VERSION:
        raise RuntimeError(
            f"xgrammar {version} installed; vLLM {VLLM_VERSION} pins {XGRAMMAR_VERSION}"
        )
    files = importlib.metadata.files("xgrammar") or []
    [binary] = [f for f in files if f.name.startswith("xgrammar_bindings.")]
    path = str(binary.locate())
    loader = importlib.machinery.ExtensionFileLoader("xgrammar_bindings", path)
    spec = importlib.util.spec_from_file_location("xgrammar_bindings", path, loader=loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def ignored_by_xgrammar(schema: Any, where: str = "") -> Iterator[str]:
    """Where `schema` uses a keyword xgrammar would not enforce ("$.properties.x: uniqueItems")."""
    if isinstance(schema, dict):
        kind = schema.get("type")
        for keyword in sorted(
            XGRAMMAR_IGNORED.get(kind, frozenset()) if isinstance(kind, str) else ()
        ):
            if keyword in schema:
                yield f"${where}: {keyword}"
        for key, value in schema.items():
            yield from ignored_by_xgrammar(value, f"{where}.{key}")
    elif isinstance(schema, list):
        for i, value in enumerate(schema):
            yield from ignored_by_xgrammar(value, f"{where}[{i}]")


class XGrammar:
    """vLLM's XgrammarBackend: one compiler over the tokenizer, a fresh matcher per answer."""

    name = "xgrammar"
    # 0.1.21 writes an enum's numbers with 17 significant digits: 0.9 as 0.90000000000000002.
    floats = ".17g"

    def __init__(self, vocabulary: Vocabulary) -> None:
        self._core = _xgrammar_core()
        # Control tokens as empty pieces: xgrammar then counts them as special, never as text.
        encoded = [b"" if i in vocabulary.control else p for i, p in enumerate(vocabulary.pieces)]
        info = self._core.TokenizerInfo(encoded, _RAW_VOCAB, len(encoded), [vocabulary.eos], False)
        # As vLLM: 8 threads, the cache on, no limit of its own (VLLM_XGRAMMAR_CACHE_MB aside).
        self._compiler = self._core.GrammarCompiler(info, 8, True, -1)
        self._eos = vocabulary.eos

    def compile(self, schema: dict[str, Any]) -> Grammar:
        text = json.dumps(schema)
        ignored = list(ignored_by_xgrammar(schema))
        if ignored:
            raise SchemaRefusedError(f"keywords xgrammar does not enforce: {', '.join(ignored)}")
        try:
            # vLLM's request check, then its compile: any whitespace, strict mode.
            self._core.Grammar.from_json_schema(text, True, None, None, True, False)
            compiled = self._compiler.compile_json_schema(text, True, None, None, True)
        except RuntimeError as exc:
            raise SchemaRefusedError(str(exc).strip()) from None
        return _XGrammarGrammar(self._core, compiled, self._eos)


@dataclass(frozen=True)
class _XGrammarGrammar:
    core: ModuleType
    compiled: Any
    eos: int

    def accepts(self, text: str) -> bool:
        # override_stop_tokens None, terminate_without_stop_token False, max_rollback_tokens 0.
        matcher = self.core.GrammarMatcher(self.compiled, None, False, 0)
        return bool(
            matcher.accept_string(text, False)
            and matcher.accept_token(self.eos, False)
            and matcher.is_terminated()
        )


# ------------------------------------------------------------------ llguidance


class LLGuidance:
    """vLLM's GuidanceBackend: the schema as llguidance's JSON grammar, flexible whitespace."""

    name = "llguidance"
    floats = ""

    def __init__(self) -> None:
        self._tokenizer = llguidance.llamacpp.lltokenizer_from_vocab(_embedded_model()._model.vocab)

    def compile(self, schema: dict[str, Any]) -> Grammar:
        grammar = llguidance.LLMatcher.grammar_from_json_schema(
            schema, defaults={"whitespace_flexible": True}
        )
        error = llguidance.LLMatcher.validate_grammar(grammar, None)
        if error:
            raise SchemaRefusedError(error)
        matcher = llguidance.LLMatcher(self._tokenizer, grammar, log_level=0)
        if matcher.is_error():
            raise SchemaRefusedError(matcher.get_error())
        return _LLGuidanceGrammar(self._tokenizer, matcher)


@dataclass(frozen=True)
class _LLGuidanceGrammar:
    tokenizer: llguidance.LLTokenizer
    pristine: llguidance.LLMatcher

    def accepts(self, text: str) -> bool:
        matcher = self.pristine.deep_copy()
        return (
            matcher.consume_tokens(self.tokenizer.tokenize_str(text))
            and matcher.is_accepting()
            and not matcher.is_error()
        )


@cache
def engines() -> tuple[Engine, ...]:
    """Both engines, built once (llguidance's tokenizer takes about 15 s on 2 cores)."""
    return (XGrammar(BYTES), LLGuidance())


# ------------------------------------------------------------------ vLLM's tool_choice


def required_tool_schema(tools: list[dict[str, Any]]) -> dict[str, Any]:
    """The schema vLLM v0.10.1.1 decodes `tool_choice: "required"` under (protocol.py,
    _get_guided_json_from_tool), given the request's `tools`: a non-empty array of
    {"name": one tool's name, "parameters": that tool's parameters}. Each call's arguments are
    then its `parameters` re-serialized (json.dumps(..., ensure_ascii=False))."""
    return {
        "type": "array",
        "minItems": 1,
        "items": {
            "type": "object",
            "anyOf": [
                {
                    "properties": {
                        "name": {"type": "string", "enum": [t["function"]["name"]]},
                        "parameters": t["function"].get("parameters")
                        or {"type": "object", "properties": {}},
                    },
                    "required": ["name", "parameters"],
                }
                for t in tools
            ],
        },
    }
