"""A staged parallel turn (structgen.tools.staging) through the interpreter.

With a scripted backend whose every output is checked against the grammar of the request
that asked for it (the real SmolLM2 tokenizer and llguidance): the stages continue one
text, each is sent with the tokens really left, a short call makes room for the next, the
joined turn validates, streams as it is written, and its meta counts every stage. On the
real model: whatever the model writes, the staged turn validates within ``max_tokens``,
and every stage after the first reuses the turn's prefix from the cache.
"""

from __future__ import annotations

import math

import pytest

import structgen as sg
from structgen.backends.fake import FakeBackend
from structgen.constraints.compiler import compiler_for
from structgen.contract.backend import GenerateResult
from structgen.tools.budget import CALL_FLOOR, block_chars, longest_call
from structgen.tools.formats import INJECTED


@sg.tool
def note(text: str, tags: list[str]) -> str:
    """Save a note with tags."""
    return text


@sg.program
def notes(s, max_tokens):
    s += sg.use_tools([note])
    s += sg.user("Save three notes.")
    s += sg.assistant(sg.gen("turn", tools=[note], tool_choice="required", parallel_tool_calls=True,
                             max_tokens=max_tokens))


CALL = INJECTED.call_json("note", {"text": "hi", "tags": []})
PIECES = ["<tool_call>[" + CALL, ", " + CALL, ", " + CALL, "]</tool_call>"]


@pytest.fixture(scope="module")
def compiler(tokenizer):
    return compiler_for(tokenizer)


def scripted(compiler, pieces):
    """A responder writing ``pieces`` in turn, each checked against its request's grammar;
    its token count is the real tokenizer's."""
    queue = list(pieces)

    def respond(req):
        piece = queue.pop(0)
        m = compiler.compile(req.constraint).matcher()
        ids = m.tokenize_bytes(piece.encode())
        assert m.validate_tokens(ids) == len(ids), (piece, req.constraint.grammar)
        assert len(ids) <= req.params.max_new_tokens
        return GenerateResult(text=piece, meta={"completion_tokens": len(ids)})
    return respond


def test_stages_continue_one_text_with_the_tokens_left(compiler, tokenizer):
    budget = 224  # one call of `note` at its longest, two do not: the turn is staged
    fb = FakeBackend(responder=scripted(compiler, PIECES))
    st = notes.run(max_tokens=budget, backend=fb, stream=True)
    streamed = "".join(st.text_iter())
    st.raise_if_failed()
    reqs = fb.requests
    assert len(reqs) == 4  # three calls, then the block's end
    used = 0
    for i, req in enumerate(reqs):
        assert req.prompt == reqs[0].prompt + "".join(PIECES[:i])  # each stage continues the text so far
        assert req.params.max_new_tokens == budget - used  # with the tokens really left
        used += len(tokenizer.encode(PIECES[i], add_special_tokens=False))
    assert (reqs[0].constraint.staged_budget, reqs[0].constraint.staged_promise) == (budget, 1)
    assert st["turn"] == "".join(PIECES) and st["turn"] in streamed and streamed == st.text()
    assert [c.name for c in st.tool_calls("turn")] == ["note"] * 3
    meta = st.get_meta_info("turn")
    assert meta["tool_stages"] == 4 and meta["completion_tokens"] == used


def test_the_block_ends_without_a_request_once_no_call_fits(compiler, tokenizer):
    t1, t2 = (len(tokenizer.encode(p, add_special_tokens=False)) for p in PIECES[:2])
    # a third call needs room for `, ` and the call at the floor, and the block's end
    floor = longest_call(INJECTED, [note], CALL_FLOOR, lean=True)
    need = 1 + block_chars(INJECTED) + len(INJECTED.separator) + math.ceil(floor)
    budget = t1 + t2 + need - 1  # room for a second call after the first, not for a third
    fb = FakeBackend(responder=scripted(compiler, PIECES[:2]))
    st = notes.run(max_tokens=budget, backend=fb)
    st.raise_if_failed()
    assert len(fb.requests) == 2  # after the second call no third fits: "]</tool_call>" is added
    assert st["turn"].endswith("]</tool_call>") and len(st.tool_calls("turn")) == 2
    assert st.get_meta_info("turn")["tool_stages"] == 2


def test_an_answer_ending_like_the_separator_ends_the_turn(compiler):
    @sg.program
    def ask(s):
        s += sg.use_tools([note])
        s += sg.user("Hello")
        s += sg.assistant(sg.gen("turn", tools=[note], tool_choice={"mode": "auto", "relevance_threshold": None,
                                                                    "call_threshold": 0},
                                 parallel_tool_calls=True, max_tokens=64))

    fb = FakeBackend(responder=scripted(compiler, ["<tool_call>[]</tool_call>Hi,"]))
    st = ask.run(backend=fb)
    st.raise_if_failed()
    assert len(fb.requests) == 1 and st.tool_calls("turn") == [] and st["turn"].endswith("Hi,")


def test_a_retry_starts_the_staged_turn_over(compiler):
    pieces = ["<tool_call>[" + CALL, "]</tool_call>"]
    bad = GenerateResult(text="<tool_call>[" + CALL[:-3], finish_reason="length")  # cut: invalid
    queue = [bad, *pieces]

    def respond(req):
        out = queue.pop(0)
        return out if isinstance(out, GenerateResult) else GenerateResult(text=out)

    @sg.program
    def retried(s):
        s += sg.use_tools([note])
        s += sg.user("Save notes.")
        s += sg.assistant(sg.gen("turn", tools=[note], tool_choice="required", parallel_tool_calls=True,
                                 max_tokens=176, retries=1))

    fb = FakeBackend(responder=respond)
    st = retried.run(backend=fb)
    st.raise_if_failed()
    assert fb.requests[1].prompt == fb.requests[0].prompt  # the retry is the first stage again
    assert fb.requests[1].constraint == fb.requests[0].constraint
    assert st["turn"] == "".join(pieces) and len(st.tool_calls("turn")) == 1


@pytest.mark.parametrize("max_tokens", [48, 96, 256])
def test_a_staged_turn_on_the_real_model_closes_in_time(embedded_backend, max_tokens):
    @sg.program
    def many(s, city):
        s += sg.use_tools([note])
        s += sg.user(f"Save one note per city, tagged 'trip': {city}, Oslo, Rome, Lima, Kyiv.")
        s += sg.assistant(sg.gen("turn", tools=[note], tool_choice="required", parallel_tool_calls=True,
                                 max_tokens=max_tokens))

    states = many.run_batch([{"city": c} for c in ("Paris", "Quito", "Seoul")], backend=embedded_backend)
    for st in states:
        st.raise_if_failed()
        meta = st.get_meta_info("turn")
        turn = st["turn"]
        calls = st.tool_calls("turn")
        assert len(calls) >= 1 and turn.endswith("]</tool_call>")
        assert meta["completion_tokens"] <= max_tokens and meta["tool_stages"] >= len(calls)
        assert meta["tool_stages"] <= len(calls) + 1
        # each later stage's prompt (the turn so far, longer than the first's) came from the cache
        # but for the few tokens where the stages meet
        assert meta["cached_tokens"] >= (meta["tool_stages"] - 1) * (meta["prompt_tokens"] - 4)
