"""The OpenAI-compatible backend over https against a real TLS server on loopback (the stdlib
server of test_openai_backend, its certificate from a CA made in the test, as an on-prem vLLM
behind an internal CA would have): it connects with the configured CA and a client certificate
when the server wants one, and refuses the server without them with a "tls" error that says why.
"""

from __future__ import annotations

import ssl
from collections.abc import Iterator
from pathlib import Path

import pytest
import trustme
from pydantic import ValidationError

from poirotd.llm.base import LLMError
from poirotd.llm.openai_http import OpenAIBackend
from tests.support.openai_server import MESSAGES, Reply, ScriptedServer, complete, make_spec

MODELS = Reply(body={"object": "list", "data": [{"id": "qwen-test", "object": "model"}]})


@pytest.fixture
def ca() -> trustme.CA:
    return trustme.CA()


def pem(tmp_path: Path, name: str, blob: trustme.Blob) -> str:
    path = tmp_path / name
    blob.write_to_path(str(path))
    return str(path)


def serve(ca: trustme.CA, *, client_certificates: bool) -> ScriptedServer:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(context)
    if client_certificates:
        context.verify_mode = ssl.CERT_REQUIRED
        ca.configure_trust(context)
        # Under TLS 1.3 Python's server checks the client's certificate after the handshake and
        # resets the connection, which a client cannot tell from any other reset (the backend
        # reports "unavailable"); under 1.2 the refusal is a TLS alert in the handshake.
        context.maximum_version = ssl.TLSVersion.TLSv1_2
    return ScriptedServer(tls=context)


@pytest.fixture
def vllm(ca: trustme.CA) -> Iterator[ScriptedServer]:
    server = serve(ca, client_certificates=False)
    yield server
    server.close()


@pytest.fixture
def vllm_wanting_a_client_certificate(ca: trustme.CA) -> Iterator[ScriptedServer]:
    server = serve(ca, client_certificates=True)
    yield server
    server.close()


async def test_the_backend_connects_with_the_configured_ca(
    vllm: ScriptedServer, ca: trustme.CA, tmp_path: Path
) -> None:
    spec = make_spec(vllm.url, tls={"ca_file": pem(tmp_path, "ca.crt", ca.cert_pem)})
    backend = await OpenAIBackend.open(spec)
    vllm.script(MODELS, Reply())
    try:
        assert await backend.probe() == ["qwen-test"]
        result = await backend.complete(MESSAGES, max_tokens=64)
    finally:
        await backend.aclose()
    assert result.text == '{"location": [0, 1]}'
    assert [s.path for s in vllm.seen] == ["/v1/models", "/v1/chat/completions"]


@pytest.mark.parametrize("trusted", ["system store", "another CA"])
async def test_a_server_the_ca_did_not_sign_is_refused(
    vllm: ScriptedServer, tmp_path: Path, trusted: str
) -> None:
    tls = None
    if trusted == "another CA":
        tls = {"ca_file": pem(tmp_path, "other-ca.crt", trustme.CA().cert_pem)}
    spec = make_spec(vllm.url, tls=tls, max_retries=1)
    vllm.script(Reply(), Reply())
    with pytest.raises(LLMError) as caught:
        await complete(spec)
    assert caught.value.reason == "tls"
    assert "the server's certificate was not accepted" in str(caught.value)
    assert vllm.seen == []  # no request was sent to an unverified server


async def test_a_client_certificate_is_presented_when_configured(
    vllm_wanting_a_client_certificate: ScriptedServer, ca: trustme.CA, tmp_path: Path
) -> None:
    server = vllm_wanting_a_client_certificate
    ca_file = pem(tmp_path, "ca.crt", ca.cert_pem)
    client = ca.issue_cert("poirotd.mas.svc")
    with_certificate = {
        "ca_file": ca_file,
        "cert_file": pem(tmp_path, "client.crt", client.cert_chain_pems[0]),
        "key_file": pem(tmp_path, "client.key", client.private_key_pem),
    }
    server.script(Reply(), Reply(), Reply())

    with pytest.raises(LLMError) as caught:
        await complete(make_spec(server.url, tls={"ca_file": ca_file}, max_retries=1))
    assert caught.value.reason == "tls" and "client certificate" in str(caught.value)
    assert server.seen == []

    result = await complete(make_spec(server.url, tls=with_certificate))
    assert result.text == '{"location": [0, 1]}' and len(server.seen) == 1


async def test_the_api_key_comes_from_its_file(
    vllm: ScriptedServer, ca: trustme.CA, tmp_path: Path
) -> None:
    key = tmp_path / "api-key"
    key.write_text("sk-from-a-file\n")
    tls = {"ca_file": pem(tmp_path, "ca.crt", ca.cert_pem)}
    vllm.script(Reply())
    await complete(make_spec(vllm.url, tls=tls, api_key_file=str(key)))
    assert vllm.seen[0].headers["Authorization"] == "Bearer sk-from-a-file"


@pytest.mark.parametrize(
    "settings, problem",
    [
        ({"api_key_file": "/nonexistent/api-key"}, "cannot read secret file /nonexistent/api-key"),
        ({"tls": {"ca_file": "/nonexistent/ca.crt"}}, "tls.ca_file /nonexistent/ca.crt"),
    ],
)
async def test_a_missing_key_or_ca_file_is_named_when_the_backend_opens(
    settings: dict[str, object], problem: str
) -> None:
    with pytest.raises(LLMError, match=problem) as caught:
        await OpenAIBackend.open(make_spec("https://vllm.mas.svc:8000", **settings))
    assert caught.value.reason == "config"


def test_tls_settings_need_https_urls_and_one_key_source() -> None:
    with pytest.raises(ValidationError, match="not https"):
        make_spec("http://vllm:8000", tls={"ca_file": "ca.crt"})
    with pytest.raises(ValidationError, match="api_key or api_key_file"):
        make_spec("http://vllm:8000", api_key="k", api_key_file="k.txt")
