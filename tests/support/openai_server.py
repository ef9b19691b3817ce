"""A scripted OpenAI-compatible HTTP server on loopback, and how the backend tests call it."""

from __future__ import annotations

import json
import ssl
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from poirotd.config import OpenAILLMSpec
from poirotd.devtools.answers import fill
from poirotd.llm.base import ChatMessage
from poirotd.llm.openai_http import OpenAIBackend
from tests.support.answers import chat_body

MESSAGES = [
    ChatMessage(role="system", content="You are the controller agent."),
    ChatMessage(role="user", content="Vote now."),
]


_VLLM_ONLY = ("/tokenize", "/tokenizer_info")


@dataclass
class Reply:
    status: int = 200
    body: dict[str, Any] | bytes = field(default_factory=chat_body)
    delay: float = 0.0
    headers: dict[str, str] = field(default_factory=dict)


def schema_replies(delay: float) -> Callable[[Any], Reply]:
    """A ScriptedServer's `otherwise`: every request answered after `delay` seconds, with a
    valid answer to the JSON schema it asks for (or prose), as a slow model would."""

    def reply(body: Any) -> Reply:
        schema = body.get("response_format", {}).get("json_schema", {}).get("schema")
        text = json.dumps(fill(schema)) if schema else "I saw nothing unusual."
        return Reply(body=chat_body(text), delay=delay)

    return reply


class ScriptedServer:
    """Answers each request with the next scripted Reply; an empty script answers 599, or what
    `otherwise` makes of the request body (GET /v1/models: the model list). With `tls`, a
    server-side context, it speaks https; `port`: where it listens (0: a free one). vLLM's
    tokenizer endpoints are answered outside the script: by `vllm[path]` (the request body, None
    for a GET), else 404 as llama-cpp-python's server does."""

    def __init__(
        self,
        tls: ssl.SSLContext | None = None,
        otherwise: Callable[[Any], Reply] | None = None,
        vllm: Mapping[str, Callable[[Any], Reply]] | None = None,
        port: int = 0,
    ) -> None:
        self.replies: deque[Reply] = deque()
        self.seen: list[Seen] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as vLLM's uvicorn does

            def do_GET(self) -> None:
                self._answer(None)

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                self._answer(json.loads(self.rfile.read(length)))

            def _answer(self, body: Any) -> None:
                with server._lock:
                    server.seen.append(Seen(self.command, self.path, dict(self.headers), body))
                    if self.path in _VLLM_ONLY:
                        answer = (vllm or {}).get(self.path)
                        reply = answer(body) if answer else Reply(404, {"detail": "Not Found"})
                    elif server.replies:
                        reply = server.replies.popleft()
                    elif otherwise is not None and isinstance(body, dict):
                        reply = otherwise(body)
                    elif self.path == "/v1/models":  # as every server lists what it serves
                        reply = Reply(body={"object": "list", "data": [{"id": "qwen-test"}]})
                    else:
                        reply = Reply(599, b"empty")
                    server.in_flight += 1
                    server.max_in_flight = max(server.max_in_flight, server.in_flight)
                try:
                    time.sleep(reply.delay)
                    raw = reply.body if isinstance(reply.body, bytes) else json.dumps(reply.body)
                    payload = raw if isinstance(raw, bytes) else raw.encode()
                    self.send_response(reply.status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(payload)))
                    for name, value in reply.headers.items():
                        self.send_header(name, value)
                    self.end_headers()
                    self.wfile.write(payload)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (timeout test)
                finally:
                    with server._lock:
                        server.in_flight -= 1

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._httpd = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self._httpd.daemon_threads = True
        if tls is not None:
            self._httpd.socket = tls.wrap_socket(self._httpd.socket, server_side=True)
        scheme = "http" if tls is None else "https"
        self.url = f"{scheme}://127.0.0.1:{self._httpd.server_address[1]}"
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()

    def script(self, *replies: Reply) -> None:
        self.replies.extend(replies)

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()


def make_spec(*base_urls: str, **overrides: Any) -> OpenAILLMSpec:
    fields: dict[str, Any] = {
        "backend": "openai",
        "base_urls": base_urls,
        "model": "qwen-test",
        "max_retries": 3,
        "backoff_seconds": 0.01,
        "backoff_max_seconds": 0.02,
        "timeout_seconds": 5.0,
        "connect_timeout_seconds": 1.0,
    }
    fields.update(overrides)
    return OpenAILLMSpec.model_validate(fields)


async def complete(spec: OpenAILLMSpec, **kwargs: Any) -> Any:
    backend = await OpenAIBackend.open(spec)
    try:
        return await backend.complete(MESSAGES, max_tokens=64, **kwargs)
    finally:
        await backend.aclose()


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    body: Any
