"""Issue 13, engine side: no single sequence can stall, fail or outlive the others.

* item 2: a catastrophic stop regex stalls nothing (linear-time, incremental stops);
* item 3: an error in one sequence's step (a bad option, its mask) fails it alone;
* item 12: cancellation (a request's Cancellation, Ctrl-C in the waiting thread or in
  run_batch) stops a sequence at the next step;
* item 13: KV admission by need (a generous max_new_tokens is not refused) and the
  model's context checked before admission.

Tests that hang on a regression run under a deadline (a subprocess or a thread).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

import structgen as sg
from structgen.backends.embedded.engine import Engine, EngineConfig
from structgen.backends.embedded.generation import GenSequence
from structgen.constraints.spec import regex_spec
from structgen.contract.backend import Cancellation, GenerateRequest, GenerateResult, SamplingParams
from structgen.runtime import ContextLengthError

pytestmark = pytest.mark.model

ROOT = Path(__file__).resolve().parents[2]
DEADLINE = 300  # seconds: only a hang (or a CPU far busier than ever seen) reaches it


def _assert_no_leak(engine: Engine) -> None:
    """Every used KV slot belongs to the radix tree once all sequences have finished."""
    def check() -> None:
        assert engine.pool.num_used == len(engine.cache.blocks())
        assert engine.cache.protected_tokens == 0
    engine._call(check)


# -- item 2 ------------------------------------------------------------------------------
_STALL_SCRIPT = """
import json, sys, time
from concurrent.futures import ThreadPoolExecutor
from structgen.backends.embedded import EmbeddedBackend
from structgen.constraints.spec import regex_spec
from structgen.contract.backend import GenerateRequest, SamplingParams

be = EmbeddedBackend()
bad = GenerateRequest("a" * 64, SamplingParams(max_new_tokens=120, stop_regex=("(a|aa)+b",)),
                      regex_spec("a{1,120}"))
good = GenerateRequest("The sea is", SamplingParams(max_new_tokens=8))
with ThreadPoolExecutor(2) as pool:
    futs = [pool.submit(be.generate, [r]) for r in (bad, good)]
    out = [f.result()[0] for f in futs]
print(json.dumps([[type(r).__name__, getattr(r, "text", str(r))] for r in out]))
be.close()
"""


def _run_script(script: str, stalled: str) -> subprocess.CompletedProcess[str]:
    """Run ``script`` in a fresh interpreter under the deadline; a stall fails the test."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    try:
        return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                              timeout=DEADLINE, env=env, cwd=ROOT, check=False)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{stalled}: no result in {DEADLINE} s")


def test_a_catastrophic_stop_regex_stalls_nothing():
    """``gen(regex="a{1,120}", stop_regex="(a|aa)+b")`` beside an unrelated run: on a
    backtracking search each step cost seconds and the other run never finished."""
    done = _run_script(_STALL_SCRIPT, "the engine stalled")
    assert done.returncode == 0, done.stderr[-2000:]
    (bad_kind, bad_text), (good_kind, good_text) = json.loads(done.stdout.strip().splitlines()[-1])
    assert bad_kind == good_kind == "GenerateResult"
    assert re.fullmatch("a{1,120}", bad_text) and good_text


# -- item 3 ------------------------------------------------------------------------------
def test_one_bad_option_fails_only_its_sequence(embedded_backend):
    """Twelve co-scheduled sequences, one with ``max_new_tokens=24.5`` (a value that got
    past option validation): it fails alone, in its own step (drafting the forced "-end"
    after 10 digits), with a typed error; the eleven others complete."""
    be = embedded_backend
    pattern = r"[0-9]{10}-end [a-z]{1,6}"
    spec = regex_spec(pattern)
    good = [GenerateRequest(f"Serial number {i}: ", SamplingParams(max_new_tokens=24), spec)
            for i in range(11)]
    params = SamplingParams(max_new_tokens=24)
    object.__setattr__(params, "max_new_tokens", 24.5)
    bad = GenerateRequest("Serial number 11: ", params, spec)
    *results, failed = be.generate([*good, bad])
    for res in results:
        assert isinstance(res, GenerateResult), res
        assert re.fullmatch(pattern, res.text)
    assert isinstance(failed, sg.BackendError) and "TypeError" in str(failed)


def test_a_fault_in_one_sequences_mask_fails_it_alone(embedded_backend):
    """The mask for the next step is computed in a worker beside the forward; one
    matcher raising there fails its sequence, not the batch."""
    be = embedded_backend
    engine = Engine(be.hf_model, EngineConfig(kv_tokens=2048))
    try:
        spec = regex_spec(r"[a-z]{3,12}")
        seqs = [be._sequence(i, GenerateRequest(f"Word number {i}:", SamplingParams(max_new_tokens=8),
                                                spec), None) for i in range(4)]
        victim = seqs[2].matcher
        real, calls = victim.fill_bitmask, [0]

        def broken(bitmask, index):
            calls[0] += 1
            if calls[0] == 3:
                raise RuntimeError("matcher exploded")
            return real(bitmask, index)

        victim.fill_bitmask = broken
        outcomes = engine.generate(seqs)
        errors = [o.error for o in outcomes]
        assert isinstance(errors[2], sg.BackendError) and "matcher exploded" in str(errors[2])
        for i in (0, 1, 3):
            assert errors[i] is None and re.fullmatch(r"[a-z]{3,12}", seqs[i].text)
        _assert_no_leak(engine)
    finally:
        engine.close()


# -- item 12 -----------------------------------------------------------------------------
def _long(be, text: str, tokens: int, flag: Cancellation | None = None) -> GenSequence:
    req = GenerateRequest(text, SamplingParams(max_new_tokens=tokens, ignore_eos=True))
    seq = be._sequence(0, req, None)
    seq.cancel = flag
    return seq


def test_a_cancelled_sequence_leaves_at_the_next_step(embedded_backend):
    be = embedded_backend
    engine = Engine(be.hf_model, EngineConfig(kv_tokens=4096))
    try:
        flag = Cancellation()
        doomed = _long(be, "Once upon a time", 2000, flag)
        other = _long(be, "The weather today", 12)
        results: dict[str, object] = {}
        threads = [threading.Thread(target=lambda k=k, s=s: results.__setitem__(k, engine.generate([s])[0]))
                   for k, s in (("doomed", doomed), ("other", other))]
        for t in threads:
            t.start()
        start = time.monotonic()
        while len(doomed.out_ids) < 5 and time.monotonic() - start < DEADLINE:
            time.sleep(0.05)
        flag.cancel("by the test")
        for t in threads:
            t.join(DEADLINE)
        assert not any(t.is_alive() for t in threads), "cancellation did not stop the sequence"
        err = results["doomed"].error
        assert isinstance(err, sg.RequestCancelled) and "by the test" in str(err)
        assert 5 <= len(doomed.out_ids) < 2000 and doomed.text is None
        assert results["other"].error is None and len(other.out_ids) == 12
        _assert_no_leak(engine)
    finally:
        engine.close()


def _story(i: int, tokens: int, cancel: Cancellation | None) -> GenerateRequest:
    return GenerateRequest(f"Story {i}: once upon a time",
                           SamplingParams(max_new_tokens=tokens, ignore_eos=True),
                           program="stories", variable="story", cancel=cancel)


def test_a_cancelled_batch_stops_computing_within_a_step(embedded_backend):
    """Through the contract: a batch's requests share one Cancellation. Once it is set,
    the engine runs at most the step in flight (and one that began as it was set), then
    no forward at all; each request fails with RequestCancelled naming its origin."""
    be = embedded_backend
    cancel = Cancellation()
    tokens = [0] * 4

    def count(index: int, delta: str) -> None:
        tokens[index] += 1

    out: list[object] = []
    runner = threading.Thread(target=lambda: out.extend(
        be.generate([_story(i, 2000, cancel) for i in range(4)], on_text=count)))
    runner.start()
    start = time.monotonic()
    while min(tokens) < 3 and time.monotonic() - start < DEADLINE:
        time.sleep(0.02)
    passes = be.stats()["forward_passes"]
    cancel.cancel("by the test")
    runner.join(DEADLINE)
    assert not runner.is_alive(), "the cancelled batch kept running"
    after = be.stats()["forward_passes"]
    assert after - passes <= 2, f"{after - passes} forward passes after the cancel"
    assert len(out) == 4 and all(isinstance(r, sg.RequestCancelled) for r in out), out
    assert all(r.program == "stories" and r.variable == "story" for r in out)
    time.sleep(0.3)
    assert be.stats()["forward_passes"] == after  # nothing runs on for it
    assert max(tokens) < 2000
    _assert_no_leak(be.engine)


def test_a_cancelled_request_never_starts(embedded_backend):
    """Set before the request reaches the engine: no forward runs for it."""
    be = embedded_backend
    cancel = Cancellation()
    cancel.cancel("early")
    passes = be.stats()["forward_passes"]
    out = be.generate([_story(0, 50, cancel)])
    assert isinstance(out[0], sg.RequestCancelled)
    assert be.stats()["forward_passes"] == passes


_RUN_BATCH_CTRL_C = """
import json, os, signal, threading, time
import structgen as sg
from structgen.backends.embedded import EmbeddedBackend

be = EmbeddedBackend()

@sg.program
def story(s, kind):
    s += "A long story about " + kind + ":" + sg.gen("out", max_tokens=2000, ignore_eos=True)

def ctrl_c():  # a real SIGINT once the items decode
    while be.stats()["generated_tokens"] < 30:
        time.sleep(0.02)
    os.kill(os.getpid(), signal.SIGINT)

threading.Thread(target=ctrl_c, daemon=True).start()
try:
    story.run_batch([{"kind": k} for k in ("ships", "trees", "stars")], backend=be, num_threads=3)
    print(json.dumps({"caught": "nothing"}))
except BaseException as exc:
    passes = be.stats()["forward_passes"]
    time.sleep(0.5)  # abandoned sequences would keep stepping meanwhile
    print(json.dumps({
        "caught": type(exc).__name__,
        "errors": [type(st.error()).__name__ for st in getattr(exc, "states", [])],
        "passes_after_catch": be.stats()["forward_passes"] - passes,
        "generated": be.stats()["generated_tokens"]}), flush=True)
be.close()
"""


def test_ctrl_c_in_run_batch_stops_the_engine():
    """Issue 13 item 12 end to end: Ctrl-C in run_batch sets the batch's Cancellation;
    the engine drops every item's sequence at its next step, so nothing computes once
    run_batch has raised, and each item fails with RequestCancelled."""
    done = _run_script(_RUN_BATCH_CTRL_C, "the interrupted batch kept running")
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    assert lines, done.stdout + done.stderr[-2000:]
    got = json.loads(lines[-1])
    assert got["caught"] == "BatchInterrupted", got
    assert got["errors"] == ["RequestCancelled"] * 3, got
    assert got["passes_after_catch"] == 0, got
    assert got["generated"] < 3 * 2000


def test_ctrl_c_in_the_waiting_thread_stops_its_sequences(embedded_backend):
    be = embedded_backend
    engine = Engine(be.hf_model, EngineConfig(kv_tokens=4096))
    try:
        seq = _long(be, "Once upon a time", 2000)

        def interrupt() -> None:
            start = time.monotonic()
            while len(seq.out_ids) < 5 and time.monotonic() - start < DEADLINE:
                time.sleep(0.05)
            os.kill(os.getpid(), signal.SIGINT)

        threading.Thread(target=interrupt, daemon=True).start()
        with pytest.raises(KeyboardInterrupt):
            engine.generate([seq])
        start = time.monotonic()
        while engine.scheduler.has_work and time.monotonic() - start < DEADLINE:
            time.sleep(0.05)
        passes = engine.stats()["forward_passes"]
        time.sleep(0.5)
        assert engine.stats()["forward_passes"] == passes  # nothing runs on for it
        assert len(seq.out_ids) < 2000
        _assert_no_leak(engine)
    finally:
        engine.close()


# -- item 13 -----------------------------------------------------------------------------
def test_a_generous_max_tokens_is_admitted_by_need(embedded_backend):
    """A 64-slot pool: four requests with max_new_tokens=10,000 and three-digit answers
    all complete (queued or preempted while memory is short), none refused."""
    be = embedded_backend
    engine = Engine(be.hf_model, EngineConfig(kv_tokens=64))
    try:
        spec = regex_spec(r"[0-9]{3}")
        text = "Item {}: a small wooden box, painted blue, with two brass hinges. Its code number is "
        seqs = [be._sequence(i, GenerateRequest(text.format(i), SamplingParams(max_new_tokens=10_000),
                                                spec), None) for i in range(4)]
        assert all(20 < len(s.prompt_ids) < 60 for s in seqs)  # each fits; four do not at once
        outcomes = engine.generate(seqs)
        assert all(o.error is None for o in outcomes), outcomes
        assert all(re.fullmatch(r"[0-9]{3}", s.text) for s in seqs)
        _assert_no_leak(engine)
    finally:
        engine.close()


@pytest.fixture(scope="module")
def short_context_model():
    """A tiny random Llama whose context is 64 positions."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64)
    return LlamaForCausalLM(cfg).eval()


def test_the_context_length_is_checked_before_admission(short_context_model):
    engine = Engine(short_context_model, EngineConfig(kv_tokens=1024))
    try:
        def seq(n: int) -> GenSequence:
            req = GenerateRequest("", SamplingParams(max_new_tokens=100))
            return GenSequence(req, [7] * n, decode=lambda ids: "x" * len(ids), eos_ids=frozenset(),
                               vocab=256)

        too_long, near_end = seq(70), seq(60)
        (err, _), (ok, _) = engine.generate([too_long, near_end])
        assert isinstance(err, ContextLengthError) and isinstance(err, sg.BackendError)
        assert err.prompt_tokens == 70 and err.context_length == 64
        assert ok is None and near_end.finish_reason == "length" and len(near_end.out_ids) == 4
    finally:
        engine.close()
