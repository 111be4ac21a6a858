"""Shared HTTP plumbing: retries, backoff, error mapping, timeouts, per-item failures.

No engine needed: httpx.MockTransport and sockets on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time

import httpx
import pytest

from structgen.backends.openai import OpenAIBackend
from structgen.backends.vllm import VLLMBackend
from structgen.contract.backend import Capabilities, GenerateRequest, SamplingParams
from structgen.contract.http import HttpClient, HttpConfig, RetryPolicy
from structgen.errors import BackendError
from tests.servers.misbehaving import MisbehavingServer

FAST = RetryPolicy(max_retries=3, backoff_base=0.001, backoff_max=0.01)


def _client(handler, **kw) -> HttpClient:
    cfg = HttpConfig("http://127.0.0.1:9", retry=kw.pop("retry", FAST), **kw)
    return HttpClient(cfg, backend="t", transport=httpx.MockTransport(handler),
                      async_transport=httpx.MockTransport(handler))


def _sequence(*responses):
    calls = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        item = responses[min(len(calls) - 1, len(responses) - 1)]
        if isinstance(item, Exception):
            raise item
        status, body, headers = item if len(item) == 3 else (*item, {})
        return httpx.Response(status, json=body, headers=headers)

    return handler, calls


@pytest.mark.parametrize("status", [429, 502, 503, 504])
def test_retryable_status_is_retried_then_succeeds(status):
    handler, calls = _sequence((status, {"error": {"message": "busy"}}), (200, {"ok": 1}))
    assert _client(handler).post("/x", {}) == {"ok": 1}
    assert len(calls) == 2


def test_get_optional_is_none_on_404_only():
    handler, calls = _sequence((404, {"detail": "Not Found"}))
    assert _client(handler).get_optional("/props") is None and len(calls) == 1
    handler, _ = _sequence((200, {"build_info": "b1"}))
    assert _client(handler).get_optional("/props") == {"build_info": "b1"}
    handler, _ = _sequence((500, {"error": {"message": "boom"}}))
    with pytest.raises(BackendError, match="boom"):
        _client(handler).get_optional("/props")


def test_retries_are_bounded_and_error_is_typed():
    handler, calls = _sequence((503, {"error": {"message": "overloaded"}}))
    with pytest.raises(BackendError) as info:
        _client(handler).post("/x", {})
    assert len(calls) == 1 + FAST.max_retries
    err = info.value
    assert err.retryable and err.status == 503 and "overloaded" in str(err) and "3 retries" in str(err)
    assert isinstance(err.__cause__, httpx.HTTPStatusError)


@pytest.mark.parametrize("status", [400, 401, 404, 422, 500])
def test_non_retryable_status_is_not_retried(status):
    handler, calls = _sequence((status, {"message": "bad request: schema"}))
    with pytest.raises(BackendError) as info:
        _client(handler).post("/x", {})
    assert len(calls) == 1
    assert not info.value.retryable and info.value.status == status
    assert "bad request: schema" in str(info.value)


def test_retry_after_is_honoured_but_capped():
    policy = RetryPolicy(max_retries=1, retry_after_max=0.05)
    handler, _ = _sequence((429, {}, {"Retry-After": "30"}), (200, {"ok": 1}))
    t0 = time.monotonic()
    assert _client(handler, retry=policy).post("/x", {}) == {"ok": 1}
    assert 0.04 < time.monotonic() - t0 < 2


def test_connection_errors_are_retryable():
    handler, calls = _sequence(httpx.ConnectError("refused"), httpx.ReadError("reset"), (200, {"ok": 1}))
    assert _client(handler).post("/x", {}) == {"ok": 1}
    assert len(calls) == 3


def test_connection_refused_on_a_real_closed_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed when the block ends: nothing listens there
    client = HttpClient(HttpConfig(f"http://127.0.0.1:{port}", retry=FAST), backend="t")
    with pytest.raises(BackendError) as info:
        client.post("/x", {})
    assert info.value.retryable and "cannot connect" in str(info.value)
    assert f"http://127.0.0.1:{port}/x" in str(info.value) and "4 attempts" in str(info.value)
    assert isinstance(info.value.__cause__, httpx.ConnectError)


def test_stalled_response_times_out():
    with MisbehavingServer("silent") as srv:  # accepts, reads, never answers
        cfg = HttpConfig(srv.url, read_timeout=0.3, retry=RetryPolicy(max_retries=1, backoff_base=0.01))
        with pytest.raises(BackendError) as info:
            HttpClient(cfg, backend="t").post("/x", {})
        assert srv.hits == 2
    assert info.value.retryable and "stalled" in str(info.value) and "2 attempts" in str(info.value)


def test_api_key_never_appears_in_repr_or_errors():
    secret = "sk-very-secret-123"
    handler, calls = _sequence((401, {"error": {"message": "invalid key"}}))
    client = _client(handler, api_key=secret)
    with pytest.raises(BackendError) as info:
        client.post("/x", {})
    assert calls[0].headers["authorization"] == f"Bearer {secret}"
    assert secret not in str(info.value) and secret not in repr(client) and secret not in repr(client.config)


def test_non_json_body_is_a_backend_error():
    client = _client(lambda r: httpx.Response(200, text="<html>oops</html>"))
    with pytest.raises(BackendError, match="non-JSON"):
        client.post("/x", {})


def test_async_path_retries_the_same_way():
    handler, calls = _sequence((503, {}), (200, {"ok": 2}))

    async def main():
        return await _client(handler).apost("/x", {})

    assert asyncio.run(main()) == {"ok": 2}
    assert len(calls) == 2


def _openai(handler) -> OpenAIBackend:
    return OpenAIBackend("http://127.0.0.1:9", model="m", version="v1", max_retries=1, backoff=0.001,
                         capabilities=None, transport=httpx.MockTransport(handler),
                         async_transport=httpx.MockTransport(handler))


def _chat_ok(text: str) -> dict:
    return {"choices": [{"message": {"content": text}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 1}}


def test_one_failing_item_does_not_fail_the_batch():
    def handler(request: httpx.Request) -> httpx.Response:
        import json

        prompt = json.loads(request.content)["messages"][-1]["content"]
        if prompt == "bad":
            return httpx.Response(400, json={"error": {"message": "context too long"}})
        return httpx.Response(200, json=_chat_ok(prompt.upper()))

    backend = _openai(handler)
    reqs = [GenerateRequest(prompt=p, variable=f"v{i}") for i, p in enumerate(["a", "bad", "c"])]
    seen = []
    out = backend.generate(reqs, on_text=lambda i, t: seen.append((i, t)))
    assert out[0].text == "A" and out[2].text == "C"
    assert isinstance(out[1], BackendError) and "context too long" in str(out[1])
    assert out[1].variable == "v1"
    assert sorted(seen) == [(0, "A"), (2, "C")]
    out = asyncio.run(backend.agenerate(reqs))
    assert out[0].text == "A" and isinstance(out[1], BackendError) and out[2].text == "C"
    assert backend.stats()["prompt_tokens"] > 0


def test_malformed_engine_response_is_a_backend_error():
    backend = _openai(lambda r: httpx.Response(200, json={"unexpected": True}))
    [out] = backend.generate([GenerateRequest(prompt="x")])
    assert isinstance(out, BackendError) and "choices" in str(out)


def test_config_validation():
    with pytest.raises(ValueError):
        HttpConfig("127.0.0.1:8000")
    with pytest.raises(ValueError):
        HttpConfig("http://x", read_timeout=0)
    with pytest.raises(ValueError):
        RetryPolicy(max_retries=-1)


def test_server_backend_declares_capabilities_per_instance():
    b = OpenAIBackend("http://127.0.0.1:9", model="m", version="v1")
    assert isinstance(b.capabilities, Capabilities) and b.capabilities.chat_messages
    assert b.version == "v1"
    assert SamplingParams().set_fields() <= b.capabilities.sampling


def test_engine_backends_are_registered_entry_points():
    from importlib.metadata import entry_points

    names = {ep.name: ep.value for ep in entry_points(group="structgen.backends")}
    for name, cls in [("openai", "OpenAIBackend"), ("vllm", "VLLMBackend"), ("sglang", "SGLangBackend"),
                      ("trtllm", "TRTLLMBackend"), ("triton", "TritonBackend"), ("llamacpp", "LlamaCppBackend")]:
        assert names.get(name) == f"structgen.backends.{name}:{cls}", names
        module, _, attr = names[name].partition(":")
        assert getattr(__import__(module, fromlist=[attr]), attr).name == name


def test_final_error_names_the_first_failure_too():
    handler, _ = _sequence(httpx.RemoteProtocolError("peer closed"), httpx.ConnectError("refused"))
    with pytest.raises(BackendError) as info:
        _client(handler).post("/x", {})
    msg = str(info.value)
    assert "cannot connect" in msg and "first failure" in msg and "lost mid-request" in msg


# -- issue 12: errors name the URL and how many attempts were made -----------------------------
def test_a_refused_connection_names_the_url_and_the_attempts():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens there once the block ends
    b = VLLMBackend(f"http://127.0.0.1:{port}", model="m", version="0.32.0", tokenizer="",
                    max_retries=2, backoff=0.001)
    [err] = b.generate([GenerateRequest(prompt="x", variable="v")])
    msg = str(err)
    assert isinstance(err, BackendError) and err.retryable and err.variable == "v"
    assert f"http://127.0.0.1:{port}/v1/completions" in msg and "cannot connect" in msg
    assert "3 attempts" in msg and "2 retries" in msg


def test_the_retry_count_survives_the_backend_and_the_program():
    import structgen as sg

    @sg.program
    def ask(s):
        s += "Q: " + sg.gen("answer", max_tokens=4)

    with MisbehavingServer("json", status=503, body={"error": {"message": "overloaded"}}) as srv:
        b = VLLMBackend(srv.url, model="m", version="0.32.0", tokenizer="", max_retries=3, backoff=0.001)
        with pytest.raises(BackendError) as info:
            ask.run(backend=b)
        hits = srv.hits
    msg = str(info.value)
    assert hits == 4 and "4 attempts" in msg and "3 retries" in msg and "overloaded" in msg
    assert info.value.variable == "answer" and info.value.status == 503


# -- issue 13 item 10: no API key in any message or log ------------------------------------------
SECRET = "sk-proj-Zx81Kq0wPp3LmN5rT7vY9"


def _echo(payload, headers):
    """A server that quotes the credentials it was sent back in its error message."""
    return {"error": {"message": f"invalid credentials: Authorization: {headers.get('authorization')}; "
                                 f"api_key={SECRET}; key {SECRET}; raw {SECRET.upper()}"}}


@pytest.mark.parametrize("status", [401, 503])
def test_an_echoed_api_key_is_redacted_from_errors_and_logs(status, caplog):
    caplog.set_level(logging.DEBUG, logger="structgen")
    with MisbehavingServer("json", status=status, body=_echo) as srv:
        b = VLLMBackend(srv.url, model="m", version="0.32.0", tokenizer="", api_key=SECRET,
                        max_retries=1, backoff=0.001)
        [err] = b.generate([GenerateRequest(prompt="x")])
        seen = srv.requests[0][2]["authorization"]
    assert seen == f"Bearer {SECRET}"  # the key was sent, where it belongs
    shown = [str(err), repr(err), err.message, *map(str, err.args),
             *(r.getMessage() for r in caplog.records)]
    assert isinstance(err, BackendError) and "invalid credentials" in str(err)
    for text in shown:
        assert SECRET not in text and "Zx81Kq0wPp3LmN5rT7vY9" not in text, text
    assert "[REDACTED]" in str(err)
    if status == 503:
        assert any("retry 1" in r.getMessage() for r in caplog.records)  # the retry was logged, redacted
        assert "2 attempts" in str(err)


@pytest.mark.parametrize("text", [
    "Authorization: Bearer abc.def-ghi_123",
    '{"authorization": "Basic dXNlcjpwYXNzd29yZA=="}',
    "got api_key=abcd1234efgh from the query",
    '{"x-api-key": "k-93kd93kdkd"}',
    "headers: {'Authorization': 'Token 93kd93kdkd'}",
    "your key sk-ant-api03-9x8y7z6w5v4u3t is invalid",
    "GET https://user:hunter22@example.com/v1/models",
    "bearer 0123456789abcdef",
    "access_token=ya29.a0AfH6SMBx",
])
def test_redact_masks_credential_shapes(text):
    from structgen.redact import MASK, redact

    out = redact(text)
    assert MASK in out
    for secret in ("abc.def-ghi_123", "dXNlcjpwYXNzd29yZA==", "abcd1234efgh", "k-93kd93kdkd", "93kd93kdkd",
                   "9x8y7z6w5v4u3t", "hunter22", "0123456789abcdef", "ya29.a0AfH6SMBx"):
        assert secret not in out, out


@pytest.mark.parametrize("text", [
    "prompt_logprobs lacks token 1234 at position 5",
    'schema {"properties": {"password": {"type": "string"}}}',
    "vllm generate failed with HTTP 503 from http://127.0.0.1:8000/v1/completions: busy",
    "the Basic plan",
])
def test_redact_leaves_ordinary_text_alone(text):
    from structgen.redact import redact

    assert redact(text) == text


def test_a_registered_key_is_masked_whatever_its_shape():
    from structgen.redact import redact

    key = "plainkey-7f3a"
    HttpConfig("http://127.0.0.1:9", api_key=key)
    assert redact(f"echo {key} and {key}") == "echo [REDACTED] and [REDACTED]"
    err = BackendError(f"server said {key}", backend="t")
    assert key not in str(err) and key not in err.message
