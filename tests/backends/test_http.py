"""Shared HTTP plumbing: retries, backoff, error mapping, timeouts, per-item failures.

No engine needed: httpx.MockTransport and sockets on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import httpx
import pytest

from structgen.backends.openai import OpenAIBackend
from structgen.contract.backend import Capabilities, GenerateRequest, SamplingParams
from structgen.contract.http import HttpClient, HttpConfig, RetryPolicy
from structgen.errors import BackendError

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
    assert isinstance(info.value.__cause__, httpx.ConnectError)


def test_stalled_response_times_out(tmp_path):
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    held = []
    stop = threading.Event()

    def accept():
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(srv.accept()[0])  # accept, read nothing, answer nothing
            except OSError:
                pass

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    try:
        cfg = HttpConfig(f"http://127.0.0.1:{srv.getsockname()[1]}", read_timeout=0.3,
                         retry=RetryPolicy(max_retries=1, backoff_base=0.01))
        t0 = time.monotonic()
        with pytest.raises(BackendError) as info:
            HttpClient(cfg, backend="t").post("/x", {})
        assert time.monotonic() - t0 < 5
        assert info.value.retryable and "stalled" in str(info.value)
    finally:
        stop.set()
        t.join()
        for c in held:
            c.close()
        srv.close()


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
    assert "cannot connect" in msg and "first failure" in msg and "connection lost mid-request" in msg
