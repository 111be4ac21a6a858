"""Every HTTP request has a total deadline and a response-size cap (issue 13 item 4).

Real misbehaving servers on 127.0.0.1 (tests/servers/misbehaving.py): one that drips a
byte a second (no single read ever stalls), a silent one, one that answers 503 with a long
Retry-After, one whose response never ends. Each call runs under a watchdog so a
regression fails instead of hanging, and must return within its deadline plus a margin.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from structgen.backends.vllm import VLLMBackend
from structgen.contract.backend import GenerateRequest, GenerateResult, SelectRequest
from structgen.contract.http import Deadline, HttpClient, HttpConfig, RetryPolicy
from structgen.errors import BackendError, DeadlineExceededError, ResponseTooLargeError
from tests.servers.misbehaving import JSON_BLOCK, Act, MisbehavingServer, completions_body

#: the deadlines here are 1.5-2.5 s; a call may overrun its deadline by scheduling only
MARGIN = 2.0
WATCHDOG = 30.0


def bounded(fn: Callable[[], Any], limit: float = WATCHDOG) -> tuple[Any, float]:
    """``fn()``'s result (or the exception it raised) and its duration; fails if it is still
    running after ``limit`` seconds instead of hanging the test run."""
    box: dict[str, Any] = {}

    def run() -> None:
        t0 = time.monotonic()
        try:
            box["out"] = fn()
        except BaseException as exc:
            box["out"] = exc
        box["took"] = time.monotonic() - t0

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(limit)
    assert not thread.is_alive(), f"the call was still running after {limit}s"
    return box["out"], box["took"]


def _client(url: str, **kw: Any) -> HttpClient:
    retry = kw.pop("retry", RetryPolicy(max_retries=0))
    return HttpClient(HttpConfig(url, retry=retry, **kw), backend="t")


@pytest.mark.parametrize("mode", ["drip", "drip_body"])
def test_a_slow_drip_server_is_cut_at_the_deadline(mode):
    # a byte every 0.5 s: the 2 s read timeout never trips, only the deadline can end it
    with MisbehavingServer(mode, interval=0.5) as srv:
        client = _client(srv.url, read_timeout=2.0, deadline=2.0)
        err, took = bounded(lambda: client.post("/v1/completions", {"prompt": "x"}))
        client.close()
    assert isinstance(err, DeadlineExceededError), err
    assert took < 2.0 + MARGIN and err.elapsed >= 2.0 * 0.9
    assert err.attempts == 1 and err.deadline == 2.0 and err.retryable
    assert err.url == srv.url + "/v1/completions"
    assert srv.url in str(err) and "2s deadline" in str(err) and "1 attempt" in str(err)


def test_a_silent_server_costs_one_deadline_not_retries_times_timeout():
    # 0.4 s read timeouts, retried up to 50 times: without a deadline, 20 s and more
    policy = RetryPolicy(max_retries=50, backoff_base=0.01, backoff_max=0.02)
    with MisbehavingServer("silent") as srv:
        client = _client(srv.url, read_timeout=0.4, deadline=2.5, retry=policy)
        err, took = bounded(lambda: client.get("/v1/models"))
        client.close()
        # the last attempt may have been sent just before the deadline, and the server's
        # thread not have read it yet (seen on a loaded machine): give it a moment
        wait_until = time.monotonic() + 2.0
        while srv.hits < getattr(err, "attempts", 0) and time.monotonic() < wait_until:
            time.sleep(0.05)
        hits = srv.hits
    assert isinstance(err, DeadlineExceededError), err
    assert took < 2.5 + MARGIN
    assert 2 <= err.attempts < 1 + policy.max_retries
    # every attempt but the last reached the server; the last one may have started with so
    # little time left that the deadline cut it before its request was written (seen in CI)
    assert err.attempts - 1 <= hits <= err.attempts
    msg = str(err)
    assert f"{err.attempts} attempts" in msg and "timed out waiting for" in msg and srv.url in msg


def test_a_retry_after_past_the_deadline_fails_at_once():
    policy = RetryPolicy(max_retries=5, retry_after_max=60.0)
    with MisbehavingServer("json", status=503, body={"error": {"message": "busy"}},
                           headers={"Retry-After": "30"}) as srv:
        client = _client(srv.url, deadline=2.0, retry=policy)
        err, took = bounded(lambda: client.post("/x", {}))
        client.close()
    assert isinstance(err, DeadlineExceededError), err
    assert err.attempts == 1 and srv.hits == 1
    assert took < 2.0  # it did not sleep into the deadline
    assert "would wait 30.0s" in str(err) and "HTTP 503" in str(err) and "busy" in str(err)


def test_a_per_call_deadline_overrides_the_config():
    with MisbehavingServer("silent") as srv:
        client = _client(srv.url, deadline=300.0)
        err, took = bounded(lambda: client.post("/x", {}, deadline=1.5))
        client.close()
    assert isinstance(err, DeadlineExceededError) and err.deadline == 1.5
    assert took < 1.5 + MARGIN


def test_the_async_path_has_the_same_deadline():
    async def main(url: str) -> Any:
        client = _client(url, read_timeout=5.0, deadline=1.5)
        try:
            return await client.apost("/x", {})
        except BaseException as exc:
            return exc

    with MisbehavingServer("drip", interval=0.3) as srv:
        err, took = bounded(lambda: asyncio.run(main(srv.url)))
    assert isinstance(err, DeadlineExceededError), err
    assert took < 1.5 + MARGIN and err.attempts == 1


def test_a_flow_of_several_calls_shares_one_deadline():
    # vLLM's select is 3 tokenize calls + 1 logprobs call; each answer takes 0.8 s
    tokens = {"tokens": [1, 2, 3], "count": 3, "max_model_len": 64}
    with MisbehavingServer("json", body=tokens, delay=0.8) as srv:
        b = VLLMBackend(srv.url, model="m", version="0.32.0", tokenizer="", deadline=2.0, max_retries=0)
        out, took = bounded(lambda: b.select([SelectRequest(prompt="p", choices=("a", "b"))]))
        b.close()
    [err] = out
    assert isinstance(err, DeadlineExceededError), err
    assert took < 2.0 + MARGIN and err.deadline == 2.0
    assert 2 <= srv.hits <= 3  # the third call was cut, the logprobs call never sent


def test_one_stuck_request_fails_alone_and_the_batch_returns_at_its_deadline():
    def body(payload: Any, headers: dict[str, str]) -> Any:
        if payload["prompt"] == "stuck":
            return Act("drip")
        return completions_body(payload["prompt"].upper())

    with MisbehavingServer("json", body=body, interval=0.3) as srv:
        b = VLLMBackend(srv.url, model="m", version="0.32.0", tokenizer="", max_retries=0)
        b.deadline = 2.0  # per backend, after construction
        reqs = [GenerateRequest(prompt=p, variable=p) for p in ("a", "stuck", "c", "d")]
        out, took = bounded(lambda: b.generate(reqs))
        b.close()
    assert [r.text for r in out if isinstance(r, GenerateResult)] == ["A", "C", "D"]
    assert isinstance(out[1], DeadlineExceededError) and out[1].variable == "stuck"
    assert took < 2.0 + MARGIN


def test_a_deadline_error_reaches_the_program_typed():
    import structgen as sg

    @sg.program
    def ask(s):
        s += "Q: " + sg.gen("answer", max_tokens=4)

    with MisbehavingServer("silent") as srv:
        b = VLLMBackend(srv.url, model="m", version="0.32.0", tokenizer="", deadline=1.5)
        err, took = bounded(lambda: ask.run(backend=b))
        b.close()
    assert isinstance(err, DeadlineExceededError) and err.variable == "answer", err
    assert took < 1.5 + MARGIN


# -- the response-size cap ------------------------------------------------------------------
@pytest.mark.parametrize("chunked", [False, True], ids=["declared", "chunked"])
def test_a_huge_response_is_refused_past_the_cap(chunked):
    cap = 1 << 20
    with MisbehavingServer("huge", size=256 << 20, chunked=chunked) as srv:
        client = _client(srv.url, max_response_bytes=cap, retry=RetryPolicy(max_retries=3))
        err, took = bounded(lambda: client.get("/v1/models"))
        client.close()
        hits = srv.hits
    assert isinstance(err, ResponseTooLargeError), err
    assert err.limit == cap and not err.retryable and hits == 1
    assert "max_response_bytes" in str(err) and srv.url in str(err)
    assert took < 2.0 + MARGIN


def test_a_response_under_the_cap_is_read_whole():
    with MisbehavingServer("huge", size=len(JSON_BLOCK), chunked=True) as srv:
        client = _client(srv.url, max_response_bytes=1 << 20)
        body = client.get("/v1/models")
        client.close()
    assert body == [0] * 32768


def test_a_huge_response_fails_one_request_of_a_backend():
    with MisbehavingServer("huge", size=64 << 20) as srv:
        b = VLLMBackend(srv.url, model="m", version="0.32.0", tokenizer="", max_response_bytes=1 << 20)
        [err] = b.generate([GenerateRequest(prompt="x", variable="v")])
        b.close()
    assert isinstance(err, ResponseTooLargeError) and err.variable == "v"


# -- configuration --------------------------------------------------------------------------
@pytest.mark.parametrize("bad", [0, -1.0, math.nan, math.inf, "10"])
def test_deadlines_are_validated(bad):
    with pytest.raises(ValueError, match="deadline"):
        HttpConfig("http://127.0.0.1:9", deadline=bad)
    with pytest.raises(ValueError, match="deadline"):
        Deadline(bad)
    b = VLLMBackend("http://127.0.0.1:9", model="m", version="0.32.0", tokenizer="")
    with pytest.raises(ValueError, match="deadline"):
        b.deadline = bad


def test_defaults_bound_every_request():
    cfg = HttpConfig("http://127.0.0.1:9")
    assert 0 < cfg.deadline < math.inf and cfg.max_response_bytes > 0
    b = VLLMBackend("http://127.0.0.1:9", model="m")
    assert b.deadline == cfg.deadline and b.http.config.max_response_bytes == cfg.max_response_bytes
    with pytest.raises(ValueError, match="max_response_bytes"):
        HttpConfig("http://127.0.0.1:9", max_response_bytes=0)


def test_a_spent_budget_fails_before_sending():
    with MisbehavingServer("json", body={"ok": 1}) as srv:
        client = _client(srv.url)
        spent = Deadline(0.01, start=time.monotonic() - 1.0)
        with pytest.raises(DeadlineExceededError) as info:
            client.post("/x", {}, deadline=spent)
        client.close()
        assert srv.hits == 0
    assert info.value.attempts == 0 and isinstance(info.value, BackendError)


def test_closing_the_client_fails_its_requests_in_flight_at_once():
    with MisbehavingServer("silent") as srv:
        client = _client(srv.url, deadline=60.0)
        box: dict[str, Any] = {}
        t = threading.Thread(target=lambda: box.setdefault("out", _catch(lambda: client.post("/x", {}))))
        t.start()
        while srv.hits == 0:
            time.sleep(0.01)
        client.close()
        t.join(WATCHDOG)
        assert not t.is_alive()
    assert isinstance(box["out"], BackendError) and "closed" in str(box["out"])


def _catch(fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except BaseException as exc:
        return exc
