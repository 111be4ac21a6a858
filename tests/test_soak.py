"""Soak: good and adversarial requests at once, in one process (issue 13, "Done when").

The real embedded engine (SmolLM2-135M on CPU) and a misbehaving local HTTP server
(tests/servers/misbehaving.py, spoken to by the vLLM adapter) serve concurrent batches
and single runs that mix good requests with the adversarial reproductions of issue 13.
Every good request must complete with valid output, every bad one must fail alone with
its typed error, and the whole soak must finish under a watchdog: nothing hangs.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable
from typing import Any

import jsonschema
import pytest

import structgen as sg
from structgen.backends.vllm import VLLMBackend
from tests.servers.misbehaving import Act, MisbehavingServer, completions_body

pytestmark = [pytest.mark.model, pytest.mark.soak]

#: the whole soak must end well within this (the issue's bound is 3 minutes in CI)
WATCHDOG = 170.0
ROUNDS = 2
KEY = "sk-soak-7Qw2Lr9Xv4Tn8Jm3"
NUM = r"[0-9]{1,3}"
PERSON = {"type": "object", "additionalProperties": False, "required": ["name", "age"],
          "properties": {"name": {"type": "string", "maxLength": 12},
                         "age": {"type": "integer", "minimum": 0, "maximum": 120}}}


# -- the programs -----------------------------------------------------------------------------
@sg.program
def number(s, topic):
    s += f"How many {topic}? Answer with a number: " + sg.gen("n", regex=NUM, max_tokens=4)


@sg.program
def person(s, text, max_tokens=48):
    s += f"Text: {text}\nThe person as JSON: " + sg.gen("p", json_schema=PERSON, max_tokens=max_tokens)


@sg.program
def constrained(s, regex=None, schema=None, max_tokens=8):
    s += "Answer: " + sg.gen("out", regex=regex, json_schema=schema, max_tokens=max_tokens)


@sg.program
def ask(s, q):
    s += f"Q: {q}\nA: " + sg.gen("a", max_tokens=8)


# -- the misbehaving server -----------------------------------------------------------------------
def _server_reply(payload: Any, headers: dict[str, str]) -> Any:
    """Good prompts get an answer; each bad prompt names the misbehaviour it gets."""
    prompt = str(payload.get("prompt", ""))
    kind = prompt.split("Q: ", 1)[-1].split("\n", 1)[0]
    if kind == "drip":
        return Act("drip")
    if kind == "silent":
        return Act("silent")
    if kind == "huge":
        return Act("huge")
    if kind == "int":
        return completions_body(123)
    if kind == "null":
        return completions_body(None)
    if kind == "echo":
        return Act("json", status=401, body={"error": {"message": f"bad key: {headers.get('authorization')}"}})
    if kind == "busy":
        return Act("json", status=503, body={"error": {"message": "overloaded"}}, headers={"Retry-After": "0"})
    return completions_body(f"answer to {kind}")


HTTP_BAD = {
    "drip": sg.DeadlineExceededError,
    "silent": sg.DeadlineExceededError,
    "huge": sg.ResponseTooLargeError,
    "int": sg.BackendError,
    "null": sg.BackendError,
    "echo": sg.BackendError,
    "busy": sg.BackendError,
}


# -- helpers ------------------------------------------------------------------------------------
class Jobs:
    """Runs jobs on threads at once; each records its outcome or the exception it raised."""

    def __init__(self) -> None:
        self.threads: dict[str, threading.Thread] = {}
        self.out: dict[str, Any] = {}

    def start(self, name: str, fn: Callable[[], Any]) -> None:
        def run() -> None:
            try:
                self.out[name] = fn()
            except BaseException as exc:
                self.out[name] = exc

        t = threading.Thread(target=run, name=f"soak-{name}", daemon=True)
        self.threads[name] = t
        t.start()

    def join(self, until: float) -> None:
        for name, t in self.threads.items():
            t.join(max(0.0, until - time.monotonic()))
            assert not t.is_alive(), f"soak job {name!r} still running at the watchdog: something hangs"


def _check_good_person(state: Any) -> None:
    assert state.error() is None, state.error()
    jsonschema.validate(json.loads(state["p"]), PERSON)


def _fails_with(state: Any, kind: type[BaseException]) -> BaseException:
    err = state.error()
    assert isinstance(err, kind), (kind, err)
    return err


# -- the soak -------------------------------------------------------------------------------------
def test_soak_good_and_adversarial_requests_together(embedded_backend):
    until = time.monotonic() + WATCHDOG
    with MisbehavingServer("json", body=_server_reply, interval=0.5) as srv, \
            MisbehavingServer("json", body={"type": "string"}) as schema_host:
        http = VLLMBackend(srv.url, model="m", version="0.32.0", tokenizer="", api_key=KEY, deadline=6.0,
                           max_retries=2, backoff=0.01, max_response_bytes=1 << 20)
        remote_ref = {"type": "object", "properties": {"x": {"$ref": f"{schema_host.url}/x.json"}}}
        for _ in range(ROUNDS):
            jobs = Jobs()
            # embedded: a batch of good extractions with bad items among them
            texts = ["Ada Lovelace, 36, mathematician.", "Alan Turing was 41.", "Grace Hopper, aged 85."]
            batch = [{"text": t} for t in texts] + [{"text": "cut short", "max_tokens": 3}] + [{"txt": "typo"}]
            jobs.start("embedded-batch", lambda b=batch: person.run_batch(b, backend=embedded_backend,
                                                                          num_threads=4))
            # embedded: single runs beside it, good and bad
            jobs.start("embedded-number", lambda: number.run(topic="legs has a spider", backend=embedded_backend))
            jobs.start("embedded-bad-regex", lambda: constrained.run(regex="(", backend=embedded_backend))
            jobs.start("embedded-remote-ref", lambda: constrained.run(schema=remote_ref, backend=embedded_backend))
            jobs.start("embedded-bad-option", lambda: constrained.run(regex=NUM, max_tokens=-1,
                                                                      backend=embedded_backend))
            # HTTP: a batch of good and misbehaving requests on one backend
            qs = ["one", *HTTP_BAD, "two", "three"]
            jobs.start("http-batch", lambda q=qs: ask.run_batch([{"q": x} for x in q], backend=http,
                                                                num_threads=len(q)))
            jobs.start("http-single", lambda: ask.run(q="four", backend=http))
            jobs.join(until)
            out = jobs.out

            # every good request completed with valid output
            states = out["embedded-batch"]
            assert isinstance(states, list) and len(states) == len(batch), states
            for st in states[:3]:
                _check_good_person(st)
            assert re.fullmatch(NUM, out["embedded-number"]["n"]), out["embedded-number"]
            http_states = out["http-batch"]
            good = [http_states[0], *http_states[-2:]]
            assert [st.error() for st in good] == [None] * 3, [st.error() for st in good]
            assert [st["a"] for st in good] == ["answer to one", "answer to two", "answer to three"]
            assert out["http-single"]["a"] == "answer to four"

            # every bad one failed alone, with its typed error
            cut = _fails_with(states[3], sg.OutputValidationError)
            assert cut.truncated and cut.raw  # the raw text is kept
            _fails_with(states[4], sg.ProgramError)  # a wrong argument name
            assert isinstance(out["embedded-bad-regex"], sg.ConstraintError), out["embedded-bad-regex"]
            assert isinstance(out["embedded-remote-ref"], sg.ConstraintError), out["embedded-remote-ref"]
            assert isinstance(out["embedded-bad-option"], sg.ProgramError), out["embedded-bad-option"]
            for st, q in zip(http_states[1:1 + len(HTTP_BAD)], HTTP_BAD, strict=True):
                err = _fails_with(st, HTTP_BAD[q])
                assert err.variable == "a" and KEY not in str(err), (q, err)
                if q == "busy":
                    assert "3 attempts" in str(err)
                if q in ("drip", "silent"):
                    assert err.url == srv.url + "/v1/completions"
        http.close()
        assert schema_host.hits == 0  # a remote $ref is never fetched
    assert time.monotonic() < until
