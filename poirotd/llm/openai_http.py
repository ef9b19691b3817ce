"""OpenAI-compatible chat completions over HTTP: vLLM in production, llama.cpp's server in tests.

One pooled keep-alive client serves every request, so concurrent interrogations reuse connections
and the server can batch them. A model server that restarts (a vLLM rollout, an OOM kill) is an
outage to wait out, not a failure: a call whose servers cannot serve (connection refused or
reset, connect timeout, 429, 502, 503, 504) keeps trying, failing over across ``base_urls`` with
full-jitter exponential backoff between rounds and honouring ``Retry-After``, for up to
``outage_budget_seconds``; only then does it fail, as "model_unavailable". Each server has a
circuit breaker (`poirotd.llm.health`): once it is seen dead, calls skip it and a probe asks
whether it is back, so a dead server is not hammered. Failures of a server that does answer (a
read timeout, another 5xx, a malformed 200, a TLS failure, reported as "tls" with what the
certificate lacked) are retried at most ``max_retries`` times. Any other 4xx is the request's
fault and is raised at once, as "context_exceeded" when the server says the prompt is too long
and "bad_request" otherwise. The server that last answered stays first for later calls: vLLM's
prefix cache lives on one server, and staying there keeps the shared session prefix warm.

The served model's control tokens (control_tokens.py) are asked of the server once, before the
first investigation needs them: vLLM's ``GET /tokenizer_info`` (with
``--enable-tokenizer-info-endpoint``) lists every added token of its tokenizer; without it, vLLM's
``POST /tokenize`` of every built-in family's spellings with ``return_token_strs`` tells which of
those come back as one token of their own. A server with neither (llama-cpp-python's, OpenAI's)
leaves the configured ``template_family``.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import random
import re
import ssl
import time
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any, Literal, TypeVar

import httpx
import structlog
from pydantic import BaseModel, Field, ValidationError

from poirotd.client.secrets import SecretError
from poirotd.client.tls import ClientTLSError
from poirotd.config.spec import OpenAILLMSpec
from poirotd.llm.base import MODEL_UNAVAILABLE, ChatMessage, Completion, LLMError, Tool, ToolCall
from poirotd.llm.control_tokens import ControlTokens, family_spellings
from poirotd.llm.health import Server, ServerPool

log = structlog.get_logger(__name__)

T = TypeVar("T")

# count_tokens is a local estimate (see there): bytes per token, and what a chat template adds:
# role markers per message; the assistant header plus a default system prompt some templates
# (SmolLM2's, for one) insert when the request has none.
_BYTES_PER_TOKEN = 3
_TEMPLATE_TOKENS_PER_MESSAGE = 8
_TEMPLATE_TOKENS_REPLY = 32
# How much of a server's error text is kept in messages and logs.
_ERROR_EXCERPT_CHARS = 300
# Statuses of a server (or the proxy before it) that cannot serve at all: waited out.
_DEAD_STATUSES = frozenset({502, 503, 504})
_SCHEMA_NAME = re.compile(r"[^A-Za-z0-9_-]+")
# How OpenAI, vLLM and llama-cpp-python word a prompt too long for the model; the embedded backend
# calls that "context_exceeded", and so must this one for the metrics and the protocol to agree.
_CONTEXT_EXCEEDED = re.compile(
    r"context_length_exceeded|maximum context length|maximum model length|context window",
    re.IGNORECASE,
)


class _PromptTokensDetails(BaseModel):
    cached_tokens: int | None = None


class _Usage(BaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    prompt_tokens_details: _PromptTokensDetails | None = None


class _Function(BaseModel):
    name: str
    arguments: str


class _ToolCall(BaseModel):
    id: str
    function: _Function


class _Message(BaseModel):
    # None when the model answered with tool calls or a refusal only.
    content: str | None = None
    # Absent or null when it called none.
    tool_calls: list[_ToolCall] | None = None


class _Choice(BaseModel):
    message: _Message
    finish_reason: str | None = None


class _ChatResponse(BaseModel):
    choices: list[_Choice] = Field(min_length=1)
    # Absent or null from some proxies; the counts are then reported as 0 rather than failing.
    usage: _Usage | None = None


class _ModelCard(BaseModel):
    id: str


# An added token as vLLM's /tokenizer_info writes it: its content, or HF's AddedToken as a dict.
_AddedToken = str | dict[str, Any]


def _content(token: _AddedToken | None) -> str:
    if isinstance(token, dict):
        content = token.get("content")
        return content if isinstance(content, str) else ""
    return token or ""


class _TokenizerInfo(BaseModel):
    """The parts of vLLM's /tokenizer_info (the tokenizer's init kwargs) that name its tokens."""

    added_tokens_decoder: dict[str, _AddedToken] = Field(default_factory=dict)
    additional_special_tokens: list[_AddedToken] = Field(default_factory=list)
    bos_token: _AddedToken | None = None
    eos_token: _AddedToken | None = None
    unk_token: _AddedToken | None = None
    pad_token: _AddedToken | None = None

    def spellings(self) -> list[str]:
        named = [self.bos_token, self.eos_token, self.unk_token, self.pad_token]
        tokens = [*self.added_tokens_decoder.values(), *self.additional_special_tokens, *named]
        return [text for text in map(_content, tokens) if text]


class _Tokenized(BaseModel):
    """vLLM's /tokenize answer; token_strs only when asked for (vLLM >= 0.8)."""

    tokens: list[int]
    token_strs: list[str] | None = None


class _ModelList(BaseModel):
    data: list[_ModelCard]


# What a failed attempt says of its server: "dead" cannot serve (its circuit counts it; the call
# waits it out within the outage budget), "busy" is alive but refuses for now (429: waited out,
# circuit untouched), "faulty" answered wrongly (retried at most max_retries times).
_Failure = Literal["dead", "busy", "faulty"]


class _RetryableError(Exception):
    """One attempt failed in a way another attempt (or another server) may not."""

    def __init__(
        self,
        reason: str,
        detail: str,
        failure: _Failure = "faulty",
        retry_after: float | None = None,
    ) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail
        self.failure = failure
        self.retry_after = retry_after

    @property
    def outage(self) -> bool:
        """The server cannot serve now: waited out within the outage budget."""
        return self.failure != "faulty"


def _retry_after(response: httpx.Response) -> float | None:
    """Seconds the server asks to wait (Retry-After as seconds or an HTTP date), if it says."""
    value = response.headers.get("Retry-After", "").strip()
    if not value:
        return None
    if value.isdigit():
        return float(value)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        return None
    return max((when - datetime.now(UTC)).total_seconds(), 0.0)


def _api_root(url: str) -> str:
    """The URL endpoints hang off: operators write it with or without /v1, with or without /."""
    root = url.rstrip("/")
    return root.removesuffix("/v1")


def _display(root: str) -> str:
    """The root as it may be logged: userinfo (user:password@) dropped."""
    url = httpx.URL(root)
    return str(url.copy_with(username=None, password=None)) if url.userinfo else root


def _causes(exc: BaseException) -> list[BaseException]:
    """``exc`` and what it wraps: httpx's error, httpcore's, anyio's, the socket's or ssl's."""
    chain: list[BaseException] = []
    cause: BaseException | None = exc
    while cause is not None and cause not in chain:
        chain.append(cause)
        cause = cause.__cause__ or cause.__context__
    return chain


def _transport_detail(exc: httpx.TransportError) -> str:
    """httpx's message, or, when it has none (a ReadError from a reset), the deepest cause's."""
    return (
        f"{type(exc).__name__}: {exc}"
        if str(exc)
        else f"{type(exc).__name__}: {_causes(exc)[-1]!r}"
    )


def _tls_failure(exc: BaseException) -> str | None:
    """What went wrong in TLS, if that is why ``exc`` happened: another attempt meets the same
    certificate, so the message says which."""
    cause = next((c for c in _causes(exc) if isinstance(c, ssl.SSLError)), None)
    if isinstance(cause, ssl.SSLCertVerificationError):
        return (
            f"TLS: the server's certificate was not accepted ({cause.verify_message}); "
            "is llm.tls.ca_file the CA that signed it, and does it name the host?"
        )
    if isinstance(cause, ssl.SSLError):
        return f"TLS: {cause.reason or cause} (does the server want a client certificate?)"
    return None


def _excerpt(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _ERROR_EXCERPT_CHARS else text[:_ERROR_EXCERPT_CHARS] + "..."


def _first_error(exc: ValidationError) -> str:
    """Where and what, without echoing the body (it may hold model output)."""
    first = exc.errors(include_url=False, include_input=False, include_context=False)[0]
    where = ".".join(str(part) for part in first["loc"]) or "body"
    return f"{where}: {first['msg']}"


def _server_message(response: httpx.Response) -> str:
    """The human part of an error body, in the shapes OpenAI, vLLM and FastAPI servers use."""
    try:
        payload = response.json()
    except ValueError:
        return _excerpt(response.text)
    if isinstance(payload, dict):
        error = payload.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return _excerpt(error["message"])
        for value in (error, payload.get("message"), payload.get("detail")):
            if isinstance(value, str):
                return _excerpt(value)
            if value is not None:
                return _excerpt(str(value))
    return _excerpt(response.text)


class OpenAIBackend:
    """LLMBackend over an OpenAI-compatible server (``POST {base}/v1/chat/completions``).

    A JSON schema is sent as ``response_format``: ``{"type": "json_schema", "json_schema": {...,
    "strict": true}}`` (OpenAI, vLLM) or ``{"type": "json_object", "schema": ...}``
    (llama-cpp-python's server), per ``spec.structured_output``. Tools are sent as ``tools``
    with ``tool_choice`` = ``spec.tool_choice``; the calls come back in ``Completion.tool_calls``.
    ``finish_reason == "length"`` is returned as is; the caller decides what a cut answer is worth.
    """

    name = "openai"

    def __init__(self, spec: OpenAILLMSpec) -> None:
        self.context_tokens = spec.context_tokens
        self._spec = spec
        roots = [_api_root(str(url)) for url in spec.base_urls]
        self._servers = [Server(r, _display(r), spec.breaker_failures) for r in roots]
        self.availability = self.pool = ServerPool(
            self._servers, self._probe_server, probe_seconds=spec.probe_seconds
        )
        self._preferred = 0
        self._slots = asyncio.Semaphore(spec.concurrency)
        self.serves_at_once: int | None = spec.concurrency
        # Learned once; None until the server answered (or showed it cannot).
        self._control_tokens: ControlTokens | None = None
        headers = {"Accept": "application/json"}
        try:
            api_key = spec.resolved_api_key()
            verify: ssl.SSLContext | bool = True if spec.tls is None else spec.tls.context()
        except (SecretError, ClientTLSError) as exc:
            raise LLMError(f"llm: {exc}", reason="config") from None
        if api_key is not None:
            headers["Authorization"] = f"Bearer {api_key.get_secret_value()}"
        self._client = httpx.AsyncClient(
            headers=headers,
            verify=verify,
            timeout=httpx.Timeout(
                spec.timeout_seconds,
                connect=spec.connect_timeout_seconds,
                # None: no bound of its own, the whole exchange's applies (asyncio.timeout).
                read=spec.read_timeout_seconds,
            ),
            # The semaphore bounds inference requests; the pool itself is unbounded so that a
            # readiness probe never queues behind a full batch.
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=spec.concurrency),
        )

    @classmethod
    async def open(cls, spec: OpenAILLMSpec) -> OpenAIBackend:
        """Build the backend without contacting the server: vLLM may come up after the sidecar.

        Use ``probe`` for readiness.
        """
        return cls(spec)

    async def complete(
        self,
        messages: Sequence[ChatMessage],
        *,
        schema: dict[str, Any] | None = None,
        tools: Sequence[Tool] = (),
        max_tokens: int,
        temperature: float | None = None,
    ) -> Completion:
        body: dict[str, Any] = {
            "model": self._spec.model,
            "messages": [m.wire() for m in messages],
            "max_tokens": max_tokens,
            "temperature": self._spec.temperature if temperature is None else temperature,
            "stream": False,
        }
        if schema is not None:
            body["response_format"] = self._response_format(schema)
        if tools:
            body["tools"] = [
                {
                    "type": "function",
                    "function": {
                        "name": t.name,
                        "description": t.description,
                        "parameters": t.parameters,
                    },
                }
                for t in tools
            ]
            body["tool_choice"] = self._spec.tool_choice

        async def attempt(root: str) -> Completion:
            # httpx bounds each phase (connect, each read); this bounds the whole exchange.
            async with asyncio.timeout(self._spec.timeout_seconds):
                response = await self._send("POST", f"{root}/v1/chat/completions", json=body)
            return self._completion(response)

        return await self._with_retries(attempt)

    def count_tokens(self, messages: Sequence[ChatMessage]) -> int:
        """An estimate meant to err high, used only to budget the context window.

        Only the server knows the model's tokenizer, and asking it (vLLM's ``/tokenize``) would
        make this call async and add a round trip per budget check. So: UTF-8 bytes / 3 plus a
        chat-template allowance per message. BPE tokenizers average about 4 bytes per token on
        prose and JSON, so this overestimates, and an overestimate only trims a little more
        history than needed. Long runs of digits or symbols can tokenize denser than 3 bytes per
        token; keep a margin below ``context_tokens`` for such input.
        """
        content_bytes = sum(
            len(m.content.encode("utf-8"))
            + sum(len(f"{c.name}{c.arguments}".encode()) for c in m.tool_calls)
            for m in messages
        )
        return (
            math.ceil(content_bytes / _BYTES_PER_TOKEN)
            + _TEMPLATE_TOKENS_PER_MESSAGE * len(messages)
            + _TEMPLATE_TOKENS_REPLY
        )

    async def probe(self) -> list[str]:
        """Model ids served by the first server that answers ``GET /v1/models`` (readiness).

        One pass over the servers, no backoff, each bounded by the connect timeout: a health check
        must answer quickly. Raises LLMError when no server answers.
        """
        failure: _RetryableError | None = None
        for index in self._order():
            server = self._servers[index]
            try:
                models = await self._models(server)
            except _RetryableError as exc:
                failure = exc
            else:
                server.succeeded()
                self._preferred = index
                return [card.id for card in models.data]
            log.warning("llm_probe_failed", base_url=server.display, reason=failure.reason)
        assert failure is not None  # base_urls has at least one entry
        raise LLMError(f"no LLM server answered: {failure.detail}", reason=failure.reason)

    async def _models(self, server: Server) -> _ModelList:
        """The server's ``GET /v1/models``, bounded by the connect timeout; _RetryableError if
        none."""
        try:
            async with asyncio.timeout(self._spec.connect_timeout_seconds):
                response = await self._send("GET", f"{server.root}/v1/models")
            return _ModelList.model_validate_json(response.content)
        except TimeoutError:
            raise _RetryableError("timeout", "no model list within the connect timeout") from None
        except ValidationError as exc:
            detail = f"malformed model list ({_first_error(exc)})"
            raise _RetryableError("bad_response", detail) from None

    async def _probe_server(self, server: Server) -> bool:
        """The circuit breaker's probe of a server seen dead: does it list its models again?"""
        try:
            await self._models(server)
        except (_RetryableError, LLMError) as exc:
            log.debug("llm_server_probe_failed", base_url=server.display, detail=str(exc))
            return False
        return True

    async def control_tokens(self) -> ControlTokens:
        """The served model's control spellings, learned from the first server that answers
        (kept for the backend's life; a server without /tokenizer_info and /tokenize leaves the
        configured family for good); while none answers, the configured family, asked again
        next time. One pass over the servers, each bounded by the connect timeout, as for
        `probe`."""
        if self._control_tokens is not None:
            return self._control_tokens
        configured = self._spec.template_family
        for index in self._order():
            root = self._servers[index].root
            try:
                async with asyncio.timeout(self._spec.connect_timeout_seconds):
                    learned = await self._ask_control_tokens(root)
            except LLMError as exc:  # the server has no such endpoint: ask no more
                log.info("llm_control_tokens_not_served", base_url=_display(root), detail=str(exc))
                learned = ControlTokens.unlearned(configured)
            except (TimeoutError, _RetryableError) as exc:
                reason = exc.reason if isinstance(exc, _RetryableError) else "timeout"
                log.warning(
                    "llm_control_tokens_unavailable", base_url=_display(root), reason=reason
                )
                continue
            if configured and learned.family and learned.family != configured:
                log.warning(
                    "llm_template_family_mismatch", configured=configured, served=learned.family
                )
            log.info(
                "llm_control_tokens",
                template_family=learned.family,
                source=learned.source,
                control_tokens=len(learned.vocabulary),
            )
            self._control_tokens = learned
            return learned
        return ControlTokens.unlearned(configured)

    async def _ask_control_tokens(self, root: str) -> ControlTokens:
        """The server's tokenizer's added tokens when it lists them, else which built-in
        spellings it keeps whole. Raises LLMError when it can say neither."""
        try:
            return await self._ask_tokenizer_info(root)
        except LLMError as exc:
            log.debug("llm_tokenizer_info_not_served", base_url=_display(root), detail=str(exc))
        return await self._ask_tokenize(root)

    async def _ask_tokenizer_info(self, root: str) -> ControlTokens:
        """vLLM's GET /tokenizer_info (served with --enable-tokenizer-info-endpoint): its
        tokenizer config, whose added tokens are every spelling the tokenizer matches whole,
        model-specific ones included."""
        response = await self._send("GET", f"{root}/tokenizer_info")
        try:
            info = _TokenizerInfo.model_validate_json(response.content)
        except ValidationError as exc:
            raise LLMError(
                f"malformed /tokenizer_info answer ({_first_error(exc)})", reason="bad_response"
            ) from None
        spellings = info.spellings()
        if not spellings:
            raise LLMError("/tokenizer_info lists no added tokens", reason="bad_response")
        return ControlTokens.learned(spellings, "server", self._spec.template_family)

    async def _ask_tokenize(self, root: str) -> ControlTokens:
        """vLLM's POST /tokenize of every built-in spelling, one a line: those that come back as
        a token of their own are the served model's."""
        candidates = family_spellings()
        body = {
            "model": self._spec.model,
            "prompt": "\n".join(candidates),
            "add_special_tokens": False,
            "return_token_strs": True,
        }
        response = await self._send("POST", f"{root}/tokenize", json=body)
        try:
            pieces = _Tokenized.model_validate_json(response.content).token_strs
        except ValidationError as exc:
            raise LLMError(
                f"malformed /tokenize answer ({_first_error(exc)})", reason="bad_response"
            ) from None
        if pieces is None:
            raise LLMError("/tokenize returned no token strings", reason="bad_response")
        whole = set(pieces)
        return ControlTokens.learned(
            [c for c in candidates if c in whole], "server", self._spec.template_family
        )

    async def aclose(self) -> None:
        await self.pool.aclose()
        await self._client.aclose()

    def _response_format(self, schema: dict[str, Any]) -> dict[str, Any]:
        if self._spec.structured_output == "json_object":
            return {"type": "json_object", "schema": schema}
        # OpenAI requires a name matching ^[A-Za-z0-9_-]{1,64}$; the schema's title is the obvious
        # one, and vLLM ignores it anyway.
        title = schema.get("title")
        name = _SCHEMA_NAME.sub("_", title)[:64] if isinstance(title, str) and title else "answer"
        json_schema = {"name": name, "schema": schema, "strict": True}
        return {"type": "json_schema", "json_schema": json_schema}

    def _order(self) -> list[int]:
        """Server indices starting with the one that answered last."""
        n = len(self._servers)
        return [(self._preferred + k) % n for k in range(n)]

    def _backoff(self, round_: int) -> float:
        spec = self._spec
        return random.uniform(
            0.0, min(spec.backoff_max_seconds, spec.backoff_seconds * 2 ** (round_ - 1))
        )

    async def _with_retries(self, attempt: Callable[[str], Awaitable[T]]) -> T:
        """Run ``attempt`` against the servers, the one that answered last first.

        Each round tries every server its circuit and Retry-After let through, without waiting
        (a dead server is skipped at once); between rounds, a backoff sleep without holding a
        concurrency slot. Outage failures (`_RetryableError.outage`) are waited out: when no server
        can be called, the call waits for a circuit to close (a probe found its server back) or
        a Retry-After to pass, for up to the outage budget from its first such failure, then
        fails as MODEL_UNAVAILABLE. Other failures end the call after 1 + max_retries.
        """
        spec = self._spec
        outage_since: float | None = None
        faults, round_ = 0, 0
        failure: _RetryableError | None = None
        tried: set[int] = set()
        while True:
            index = self._next_server(tried)
            if index is None:
                if tried and any(self._servers[i].closed for i in tried):  # a round is over
                    round_ += 1
                    await asyncio.sleep(self._backoff(round_))
                else:  # no server can be called now: an outage, waited out
                    outage_since = outage_since or time.monotonic()
                    left = spec.outage_budget_seconds - (time.monotonic() - outage_since)
                    if left <= 0:
                        raise self._outage_error(failure)
                    await self._wait_for_a_server(left)
                tried.clear()
                continue
            tried.add(index)
            server = self._servers[index]
            try:
                async with self._slots:
                    result = await attempt(server.root)
            except TimeoutError:
                failure = _RetryableError("timeout", f"no answer within {spec.timeout_seconds}s")
            except _RetryableError as exc:
                failure = exc
            else:
                server.succeeded()
                self._preferred = index
                return result
            if failure.retry_after is not None:
                server.hold_back(min(failure.retry_after, spec.outage_budget_seconds))
            if failure.outage:
                outage_since = outage_since or time.monotonic()
                if failure.failure == "dead":
                    server.unreachable(failure.reason, failure.detail)
                log.debug("llm_server_cannot_serve", base_url=server.display, detail=failure.detail)
                if time.monotonic() - outage_since >= spec.outage_budget_seconds:
                    raise self._outage_error(failure)
                continue
            faults += 1
            log.warning(
                "llm_request_failed",
                base_url=server.display,
                attempt=faults,
                attempts=spec.max_retries + 1,
                reason=failure.reason,
                detail=failure.detail,
            )
            if faults > spec.max_retries:
                raise LLMError(
                    f"LLM request failed after {faults} attempt(s): {failure.detail}",
                    reason=failure.reason,
                )

    def _next_server(self, tried: set[int]) -> int | None:
        """The first server in order not tried this round that its circuit and Retry-After let
        through now."""
        for index in self._order():
            server = self._servers[index]
            if index not in tried and server.closed and not server.wait_seconds():
                return index
        return None

    async def _wait_for_a_server(self, left: float) -> None:
        """Until a circuit closes or opens, or the nearest Retry-After passes; `left` at most."""
        held = [s.wait_seconds() for s in self._servers if s.closed and s.wait_seconds()]
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(min([left, *held])):
                await self.pool.wait_for_change()

    def _outage_error(self, failure: _RetryableError | None) -> LLMError:
        last = f"; last: {failure.detail}" if failure is not None else ""
        return LLMError(
            f"no LLM server could serve for {self._spec.outage_budget_seconds:g}s "
            f"(llm.outage_budget_seconds){last}",
            reason=MODEL_UNAVAILABLE,
        )

    async def _send(
        self, method: str, url: str, *, json: dict[str, Any] | None = None
    ) -> httpx.Response:
        """One exchange. Worth retrying: _RetryableError. The request's own fault: LLMError."""
        try:
            response = await self._client.request(method, url, json=json)
        except httpx.ConnectTimeout as exc:
            detail = f"connect timeout ({type(exc).__name__})"
            raise _RetryableError("connect_timeout", detail, "dead") from exc
        except httpx.ReadTimeout as exc:
            raise _RetryableError("read_timeout", f"read timeout ({type(exc).__name__})") from exc
        except httpx.TimeoutException as exc:
            raise _RetryableError("timeout", f"timed out ({type(exc).__name__})") from exc
        except httpx.TransportError as exc:
            tls = _tls_failure(exc)
            if tls is not None:
                raise _RetryableError("tls", tls) from exc
            raise _RetryableError("unavailable", _transport_detail(exc), "dead") from exc
        status = response.status_code
        if status == 429 or status >= 500:
            detail = f"HTTP {status}: {_server_message(response)}"
            failure: _Failure = (
                "busy" if status == 429 else "dead" if status in _DEAD_STATUSES else "faulty"
            )
            raise _RetryableError("unavailable", detail, failure, _retry_after(response))
        if status >= 300:
            message = _server_message(response)
            context = _CONTEXT_EXCEEDED.search(message) or _CONTEXT_EXCEEDED.search(response.text)
            reason = "context_exceeded" if context else "bad_request"
            raise LLMError(f"HTTP {status}: {message}", reason=reason)
        return response

    @staticmethod
    def _completion(response: httpx.Response) -> Completion:
        try:
            parsed = _ChatResponse.model_validate_json(response.content)
        except ValidationError as exc:
            detail = f"malformed completion ({_first_error(exc)})"
            raise _RetryableError("bad_response", detail) from None
        choice = parsed.choices[0]
        calls = choice.message.tool_calls or ()
        usage = parsed.usage or _Usage()
        details = usage.prompt_tokens_details
        return Completion(
            text=choice.message.content or "",
            prompt_tokens=usage.prompt_tokens,
            completion_tokens=usage.completion_tokens,
            # vLLM sends prompt_tokens_details only with --enable-prompt-tokens-details.
            cached_tokens=None if details is None else details.cached_tokens,
            finish_reason=choice.finish_reason or "stop",
            tool_calls=tuple(
                ToolCall(id=c.id, name=c.function.name, arguments=c.function.arguments)
                for c in calls
            ),
        )
