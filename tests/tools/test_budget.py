"""A tool call fits ``max_tokens`` (structgen.tools.budget): the grammar bounds every argument
that could run away, so a call closes within the budget.

Checked against the real SmolLM2 tokenizer and llguidance's matcher (the bound is in the
grammar), and on the real model with a prompt that asks for a long argument and a small
``max_tokens``: the call closes, parses and validates, and is not cut. A parallel turn is
planned as a whole (``fit_calls``): in every format its longest text -- the block and ``k'``
calls at their longest -- fits, one call more is refused, and a token policy that always
extends (the longest strings, one more item, one more call) still closes within the budget.
"""

from __future__ import annotations

import json
import math

import pytest

import structgen as sg
from structgen.backends.fake import FakeBackend
from structgen.constraints.bitmask import allocate_token_bitmask, allowed_token_ids
from structgen.constraints.compiler import compiler_for
from structgen.contract.backend import Capabilities, GenerateResult
from structgen.contract.chat_template import ChatTemplate
from structgen.tools import spec as spec_module
from structgen.tools.budget import (
    CALL_FLOOR,
    MIN_CAP,
    block_chars,
    bounded_schema,
    call_chars,
    fit_calls,
    fit_to_budget,
)
from structgen.tools.definition import as_tool
from structgen.tools.formats import FORMATS, INJECTED
from structgen.tools.spec import MAX_PARALLEL, ToolRequest, build_spec
from structgen.tools.staging import calls_written, closing, next_stage


@sg.tool
def note(text: str, tags: list[str]) -> str:
    """Save a note with tags."""
    return text


@sg.tool
def lookup(city: str, country: str = "", units: str = "metric", days: int = 1, detail: bool = False) -> str:
    """Weather for a city."""
    return city


@pytest.fixture(scope="module")
def compiler(tokenizer):
    return compiler_for(tokenizer)


def accepts(compiler, spec, text: str) -> bool:
    m = compiler.compile(spec).matcher()
    ids = m.tokenize_bytes(text.encode())
    return m.validate_tokens(ids) == len(ids)


def test_a_budget_below_the_plan_is_served_best_effort():
    (tool, cap), = fit_to_budget(INJECTED, [note], max_tokens=64)
    assert tool is note and cap == MIN_CAP  # no optional argument to drop: the smallest bound


@pytest.mark.parametrize("max_tokens", [128, 256, 512])
def test_the_longest_call_fits_the_budget_and_the_grammar_holds_the_bound(compiler, max_tokens):
    (tool, cap), = fit_to_budget(INJECTED, [note], max_tokens=max_tokens)
    assert cap >= MIN_CAP and tool is note
    block = len(INJECTED.open) + len(INJECTED.close) + 2
    assert call_chars(INJECTED, note, cap) + block <= max_tokens - 1  # the plan fits, one token to spare
    assert call_chars(INJECTED, note, cap + 1) + block > max_tokens - 1  # and is the largest that does
    spec = build_spec([note], INJECTED, tool_choice="required", max_tokens=max_tokens)
    head = '<tool_call>[{"name": "note", "arguments": {"text": "'
    assert accepts(compiler, spec, head + "a" * cap + '", "tags": []}}]</tool_call>')
    assert not accepts(compiler, spec, head + "a" * (cap + 1))  # one more character: refused
    items = ", ".join(['"t"'] * (max(2, cap // 6) + 1))
    assert not accepts(compiler, spec, head + f'x", "tags": [{items}]')  # one item too many: refused
    assert spec.validate_output(head + "a" * cap + '", "tags": ["t"]}}]</tool_call>').calls[0].name == "note"


@sg.tool
def evolve(species: str, years: int) -> str:
    """Simulate evolution over some years."""
    return species


def test_a_budgeted_call_cannot_run_away_in_an_integer(compiler):
    """BFCL's irrelevance_44: SmolLM2 wrote ``"evolution_duration": 1000...`` until
    ``max_tokens`` cut the call; a budgeted grammar stops an integer at NUMBER_CHARS."""
    from structgen.constraints.schema.bounds import INTEGER_BOUND

    spec = build_spec([evolve], INJECTED, tool_choice="required", max_tokens=192)
    head = '<tool_call>[{"name": "evolve", "arguments": {"species": "whale", "years": '
    assert accepts(compiler, spec, head + f"{INTEGER_BOUND}}}}}]</tool_call>")
    assert accepts(compiler, spec, head + f"-{INTEGER_BOUND}}}}}]</tool_call>")
    assert not accepts(compiler, spec, head + "1" + "0" * 11)  # the twelfth digit is refused
    loose = build_spec([evolve], INJECTED, tool_choice="required")  # no budget: no bound
    assert accepts(compiler, loose, head + "1" + "0" * 40 + "}}]</tool_call>")


def test_a_budgeted_call_cannot_run_away_in_an_open_objects_value(compiler):
    """BFCL's irrelevance_69: a ``dict`` argument with no properties; SmolLM2 wrote a
    ``"description"`` inside it until ``max_tokens`` cut the call."""
    model = as_tool({"type": "function", "function": {
        "name": "predict", "description": "Predict with a model.",
        "parameters": {"type": "object", "properties": {"model": {"type": "object"}}, "required": ["model"]}}})
    spec = build_spec([model], INJECTED, tool_choice="required", max_tokens=96)
    head = '<tool_call>[{"name": "predict", "arguments": {"model": {"description": "'
    assert not accepts(compiler, spec, head + "x" * 96)
    assert accepts(compiler, spec, head + 'x"}}}]</tool_call>')


def test_no_budget_no_bound(compiler):
    spec = build_spec([note], INJECTED, tool_choice="required")
    head = '<tool_call>[{"name": "note", "arguments": {"text": "'
    assert accepts(compiler, spec, head + "a" * 2000 + '", "tags": []}}]</tool_call>')


def test_a_tight_budget_drops_optional_arguments_last_first(compiler):
    (fitted, cap), = fit_to_budget(INJECTED, [lookup], max_tokens=140)
    kept = list(fitted.parameters["properties"])
    assert kept[0] == "city" and "city" in fitted.parameters["required"]
    assert kept == ["city", "country", "units", "days", "detail"][:len(kept)] and len(kept) < 5
    assert call_chars(INJECTED, fitted, cap) <= 140 - 1 - len(INJECTED.open) - len(INJECTED.close) - 2
    spec = build_spec([lookup], INJECTED, tool_choice="required", max_tokens=140)
    dropped = next(k for k in ("country", "units", "days", "detail") if k not in kept)
    head = '<tool_call>[{"name": "lookup", "arguments": {"city": "Oslo", '
    assert not accepts(compiler, spec, head + f'"{dropped}"')
    assert spec.validate_output('<tool_call>[{"name": "lookup", "arguments": {"city": "Oslo"}}]</tool_call>').calls


def test_bounded_schema_keeps_enums_and_tighter_bounds():
    schema = {"type": "object", "properties": {
        "a": {"type": "string", "maxLength": 3}, "b": {"enum": ["xx", "yyyyyyyyyyyy"]},
        "c": {"type": "array", "items": {"type": "string"}, "minItems": 9},
        "d": {"type": "object"}, "e": {}}, "required": ["a"]}
    out = bounded_schema(schema, 20)
    p = out["properties"]
    assert p["a"]["maxLength"] == 3 and "maxLength" not in p["b"]
    # never below the schema's own minimum: the bounded schema accepts a subset of the original
    assert p["c"]["maxItems"] == 9 and p["c"]["minItems"] == 9 and p["c"]["items"]["maxLength"] == 20
    assert p["d"]["maxProperties"] == 3 and p["e"] == {"type": "string", "maxLength": 20}
    assert schema["properties"]["a"] == {"type": "string", "maxLength": 3}  # the tool's own schema untouched


@sg.program
def write_note(s, budget):
    s += sg.use_tools([note])
    s += sg.user("Save a very long note: write out the full text of a long story about a dragon, "
                 "at least two thousand words, with many tags.")
    s += sg.assistant(sg.gen("turn", tools=[note], tool_choice="required", max_tokens=budget))


@pytest.mark.model
@pytest.mark.parametrize("budget", [128, 160])
def test_a_call_closes_within_a_small_max_tokens_on_the_real_model(embedded_backend, budget):
    st = write_note.run(budget=budget, backend=embedded_backend)
    st.raise_if_failed()
    turn = st.value("turn")
    assert not turn.truncated and len(turn.calls) == 1  # the call closed: nothing was cut
    call = turn.calls[0]
    assert call.name == "note" and isinstance(call.raw_arguments["text"], str)
    (_, cap), = fit_to_budget(INJECTED, [note], max_tokens=budget)
    assert len(call.raw_arguments["text"]) <= cap and all(len(t) <= cap for t in call.raw_arguments["tags"])
    meta = st.get_meta_info("turn")
    assert meta["finish_reason"] != "length" and meta["completion_tokens"] <= budget


# -- a parallel turn fits as a whole ---------------------------------------------------------
def longest_note(cap: int) -> dict:
    """``note``'s longest arguments with bound ``cap`` (the grammar's items bound: cap // 6)."""
    return {"text": "a" * cap, "tags": ["a" * cap] * max(2, cap // 6)}


@pytest.mark.parametrize("fmt", sorted(FORMATS))
@pytest.mark.parametrize("parallel", [2, 3, True])
@pytest.mark.parametrize("max_tokens", [96, 192, 256, 512])
def test_k_calls_at_their_longest_fit_the_budget(fmt, parallel, max_tokens):
    f = FORMATS[fmt]
    k = MAX_PARALLEL if parallel is True else parallel
    spec = build_spec([note, lookup], f, tool_choice="required", parallel=parallel, max_tokens=max_tokens)
    kk, fitted = fit_calls(f, [note, lookup], max_tokens=max_tokens, max_calls=k)
    assert 1 <= kk <= k  # fewer calls than asked for: the turn is staged, each stage planned on what is left
    assert (spec.max_calls, spec.staged_budget) == ((kk, None) if kk == k else (k, max_tokens))
    room = max_tokens - 1 - block_chars(f)
    for (tool, cap), orig in zip(fitted, (note, lookup), strict=True):
        assert kk * call_chars(f, tool, cap) + block_chars(f) <= max_tokens - 1 or (kk == 1 and cap == MIN_CAP)
        if kk > 1:  # a tool keeps every argument when k' full calls of it fit at the floor
            assert cap >= CALL_FLOOR
            assert (tool is orig) == (kk * call_chars(f, orig, CALL_FLOOR) <= room)
    if kk < k:  # the most that fit: one call more does not, with every argument kept at the floor
        assert max(call_chars(f, t, CALL_FLOOR) for t in (note, lookup)) * (kk + 1) > room
    if kk == 1:  # nor two calls with the optional arguments left out
        lean = [fit_to_budget(f, [t], max_tokens=1)[0][0] for t in (note, lookup)]
        assert max(call_chars(f, t, CALL_FLOOR) for t in lean) * 2 > room


def test_a_budget_for_fewer_calls_stages_the_turn_and_none_for_two_leaves_one():
    small = build_spec([note], INJECTED, tool_choice="required", parallel=True, max_tokens=64)
    assert (small.max_calls, small.staged_budget, small.staged_promise) == (MAX_PARALLEL, 64, 1)
    assert build_spec([note], INJECTED, tool_choice="required", parallel=True).max_calls == MAX_PARALLEL
    (_, one), = fit_to_budget(INJECTED, [note], max_tokens=64)
    assert fit_calls(INJECTED, [note], max_tokens=64, max_calls=MAX_PARALLEL) == (1, [(note, one)])
    many = build_spec([note], INJECTED, tool_choice="required", parallel=True, max_tokens=4096)
    assert many.max_calls == MAX_PARALLEL and many.staged_budget is None  # a large budget: k itself, one request
    assert build_spec([note], INJECTED, tool_choice="required", parallel=3, max_tokens=4096).max_calls == 3


def test_optional_arguments_go_only_when_two_calls_do_not_fit_with_them():
    f = INJECTED
    full = call_chars(f, lookup, CALL_FLOOR)
    lean = call_chars(f, fit_to_budget(f, [lookup], max_tokens=1)[0][0], CALL_FLOOR)  # all optional dropped
    assert lean < full
    budget = int(2 * lean)  # two lean calls fit, two full ones do not
    max_tokens = budget + 1 + block_chars(f)
    assert 2 * lean <= budget < 2 * full
    k, ((tool, cap),) = fit_calls(f, [lookup], max_tokens=max_tokens, max_calls=4)
    assert k == 2 and cap >= CALL_FLOOR and list(tool.parameters["properties"]) == ["city"]
    k, ((tool, _),) = fit_calls(f, [lookup], max_tokens=2 * int(full) + 1 + block_chars(f), max_calls=4)
    assert k == 2 and tool is lookup  # room for two full calls: every argument kept


@pytest.mark.parametrize("fmt", sorted(FORMATS))
@pytest.mark.parametrize("max_tokens", [320, 512])
def test_the_grammar_takes_k_longest_calls_and_refuses_one_more(compiler, fmt, max_tokens):
    f = FORMATS[fmt]
    k, ((_, cap),) = fit_calls(f, [note], max_tokens=max_tokens, max_calls=MAX_PARALLEL)
    assert k >= 2
    spec = build_spec([note], f, tool_choice="required", parallel=k, max_tokens=max_tokens)  # the plan: one request
    assert spec.staged_budget is None
    text = f.render_calls([("note", longest_note(cap))] * k)
    assert len(text) <= max_tokens - 1  # the plan holds for the grammar's longest turn
    assert accepts(compiler, spec, text)
    assert len(spec.validate_output(text).calls) == k
    assert not accepts(compiler, spec, f.render_calls([("note", {"text": "a", "tags": []})] * (k + 1)))


def extend_walk(compiler, spec, limit: int) -> tuple[str, int]:
    """Drive the grammar with an adversary that always extends: at each step the allowed
    one-character token first in: a , ; newline " [ { (fill strings, one more item or call),
    else the shortest allowed token, the end of sequence only when nothing else is allowed.
    ``(text, tokens)``; fails past ``limit`` tokens."""
    m = compiler.compile(spec).matcher()
    eos = compiler.eos_token_id
    prefer = []
    for ch in 'a,;\n"[{':
        ids = m.tokenize_bytes(ch.encode())
        assert len(ids) == 1
        prefer.append(ids[0])
    bitmask = allocate_token_bitmask(1, compiler.vocab_size, kind="numpy")
    out: list[int] = []
    while not m.is_stopped():
        m.fill_bitmask(bitmask)
        allowed = allowed_token_ids(bitmask, 0, compiler.vocab_size).tolist()
        choices = [t for t in allowed if t != eos]
        if not choices:
            break
        pick = next((t for t in prefer if t in set(choices)), None)
        if pick is None:
            pick = min(choices[:5000], key=lambda t: len(m.token_bytes([t])))
        assert m.consume(pick), m.error()
        out.append(pick)
        assert len(out) <= limit, m.token_bytes(out)
    assert m.is_accepting()
    return m.token_bytes(out).decode(), len(out)


def staged_walk(compiler, spec, max_tokens: int) -> tuple[str, int, int]:
    """Drive a staged turn's stages as the generate kind does (:mod:`structgen.tools.staging`),
    each with :func:`extend_walk` limited to the tokens left: ``(text, tokens, stages)``."""
    text, used, calls, stages, stage = "", 0, 0, 0, spec
    while True:
        piece, n = extend_walk(compiler, stage, max_tokens - used - 1)  # one token kept for the end
        text, used, stages = text + piece, used + n, stages + 1
        done = calls_written(spec, text)
        if done is None or done <= calls:
            return text, used, stages
        calls = done
        stage = next_stage(spec, remaining=max_tokens - used, calls_done=done)
        if stage is None:
            return text + closing(spec), used, stages


@pytest.mark.parametrize("fmt, choice", [(f, "required") for f in sorted(FORMATS)] + [("structgen", "auto")])
@pytest.mark.parametrize("max_tokens", [320, 512])
def test_an_always_extending_policy_closes_within_max_tokens(compiler, fmt, choice, max_tokens):
    f = FORMATS[fmt]
    k, _ = fit_calls(f, [note], max_tokens=max_tokens, max_calls=MAX_PARALLEL)
    spec = build_spec([note], f, tool_choice=choice, parallel=True, max_tokens=max_tokens)
    assert 2 <= k < MAX_PARALLEL and (spec.staged_budget, spec.staged_promise) == (max_tokens, k)
    text, tokens, stages = staged_walk(compiler, spec, max_tokens)
    assert tokens <= len(text) and tokens <= max_tokens - 1  # closed with a token to spare for the end of sequence
    turn = spec.validate_output(text)
    assert not turn.truncated and len(turn.calls) >= k  # every call the plan holds, however long each one is
    assert stages == len(turn.calls)  # it takes every call offered; the block's end comes without a request
    assert all(len(c.raw_arguments["text"]) >= CALL_FLOOR for c in turn.calls)


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_a_staged_turn_makes_more_short_calls_than_the_plan_holds(compiler, fmt):
    """An always-extending policy with short strings: each stage is planned on what is left,
    so the turn makes more calls than the worst-case plan, and still closes in time."""
    f, max_tokens = FORMATS[fmt], 192
    spec = build_spec([lookup], f, tool_choice="required", parallel=True, max_tokens=max_tokens)
    assert spec.staged_budget == max_tokens  # fewer calls than asked for fit at their longest
    text, used, stages, calls = "", 0, 0, 0
    stage = spec
    while stage is not None:  # each stage: one short call ("Oslo", no optional argument), then more
        m = compiler.compile(stage).matcher()
        call = f.call_json("lookup", {"city": "Oslo"})
        piece = (f.open + "[" + call if f.list_style else f.open + call + f.close) if stages == 0 else (
            f.separator + call if f.list_style else f.separator + f.open + call + f.close)
        ids = m.tokenize_bytes(piece.encode())
        assert m.validate_tokens(ids) == len(ids), piece  # the stage's grammar takes one more call
        text, used, stages = text + piece, used + len(ids), stages + 1
        calls = calls_written(spec, text)
        stage = next_stage(spec, remaining=max_tokens - used, calls_done=calls)
    text += closing(spec)
    turn = spec.validate_output(text)
    assert len(turn.calls) == calls > spec.staged_promise and calls >= 3 and used <= max_tokens - 1
    assert calls < spec.max_calls  # it ended because no further call fit the tokens left, not at k


def test_without_the_plan_the_same_policy_runs_away(compiler):
    """The check above can fail: a grammar that allows more calls than fit runs past the budget."""
    spec = build_spec([note], INJECTED, tool_choice="required", parallel=True, max_tokens=256)
    (_, cap), = fit_to_budget(INJECTED, [note], max_tokens=256)  # one call's bounds, 16 calls allowed
    loose = spec_module.tool_grammar(INJECTED, [note], mode="required", max_calls=MAX_PARALLEL, caps=[cap])
    with pytest.raises(AssertionError):
        extend_walk(compiler, type(spec)(grammar=loose), 255)


# -- one build per turn ----------------------------------------------------------------------
@sg.program
def probed(s):
    s += sg.use_tools([note])
    s += sg.user("Save a note.")
    s += sg.assistant(sg.gen("turn", tools=[note], parallel_tool_calls=True, max_tokens=48))


def test_a_probed_turn_builds_its_spec_once(monkeypatch):
    builds = []
    real = spec_module.fit_calls
    monkeypatch.setattr(spec_module, "fit_calls", lambda *a, **kw: builds.append(1) or real(*a, **kw))
    spec_module._resolved.cache_clear()
    caps = Capabilities(regex=True, json_schema=True, grammar=True, tools=True, prefix_cache=True,
                        sampling=frozenset({"max_new_tokens", "temperature", "top_logprobs_num", "return_logprob",
                                            "return_text_in_logprobs"}))
    probe = GenerateResult(text="x", finish_reason="length",
                           meta={"output_top_logprobs": [[(math.log(0.5), 7, "<")]]})
    call = '<tool_call>[{"name": "note", "arguments": {"text": "hi", "tags": []}}]</tool_call>'
    for _ in range(2):  # the same tools run again: the same spec
        fb = FakeBackend([probe, call], capabilities=caps)
        st = probed.run(backend=fb)
        st.raise_if_failed()
        assert len(fb.requests) == 2 and fb.requests[0].constraint is None  # the probe, then the turn
        assert [c.name for c in st.tool_calls("turn")] == ["note"]
    assert len(builds) == 1


def test_memoized_specs_keep_the_count_apart_and_chat_apis_keep_k():
    many, one = ToolRequest.make([note], parallel=True), ToolRequest.make([note], parallel=1)
    assert many == one  # True == 1 as a field value: the cache key must tell them apart
    template = ChatTemplate(json.dumps, name="plain")  # no tools: the injected format
    assert many.resolve(template, 4096).max_calls == MAX_PARALLEL and one.resolve(template, 4096).max_calls == 1
    assert many.resolve(template, 64).staged_promise == 1  # the budget holds one call at its longest: staged
    assert many.resolve(template, 64).staged_budget == 64
    assert many.resolve(None, 4096).max_calls == MAX_PARALLEL and one.resolve(None, 4096).max_calls == 1
    assert many.resolve(None, 64).max_calls == MAX_PARALLEL  # a chat API writes calls its own way: k kept
    assert many.resolve(None, 64) is many.resolve(None, 64)  # built once
