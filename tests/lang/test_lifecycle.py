"""The run lifecycle, the drive loop's exception policy, request kinds, forks and streaming
(scripted FakeBackend, real validators; no model)."""

from __future__ import annotations

import asyncio
import json

import pytest
from pydantic import BaseModel

import structgen as sg
from structgen.backends.fake import FakeBackend
from structgen.constraints.spec import GrammarSpec
from structgen.contract.backend import Capabilities
from structgen.lang.kinds import kind_of, kinds, register
from tests.lang import kind_echo
from tests.lang.deadline import within


class Person(BaseModel):
    name: str
    age: int


def _run(program, mode: str, **kw):
    """``program.run(**kw)`` or the same through ``arun`` (one exception policy for both)."""
    if mode == "sync":
        return program.run(**kw)
    return asyncio.run(program.arun(**kw))


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_one_exception_policy_for_sync_and_async_backend_failures(mode):
    class Broken(FakeBackend):
        def generate(self, requests, *, on_text=None):
            raise RuntimeError("socket closed")

        async def agenerate(self, requests, *, on_text=None):
            raise RuntimeError("socket closed")

    @sg.program
    def p(s):
        s += "x" + sg.gen("v")

    with pytest.raises(sg.BackendError, match="socket closed") as info:
        _run(p, mode, backend=Broken())
    assert isinstance(info.value.__cause__, RuntimeError) and info.value.variable == "v"


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_an_interrupt_in_the_backend_cancels_the_runs_requests_and_propagates(mode):
    seen = []

    class Interrupted(FakeBackend):
        def generate(self, requests, *, on_text=None):
            seen.extend(requests)
            raise KeyboardInterrupt

        async def agenerate(self, requests, *, on_text=None):
            seen.extend(requests)
            raise KeyboardInterrupt

    @sg.program
    def p(s):
        s += "x" + sg.gen("v")

    with pytest.raises(KeyboardInterrupt):
        _run(p, mode, backend=Interrupted())
    assert seen and seen[0].cancel is not None and seen[0].cancel.cancelled


def test_a_wrong_number_of_results_is_a_backend_error():
    class Short(FakeBackend):
        def generate(self, requests, *, on_text=None):
            return []

    @sg.program
    def p(s):
        s += sg.gen("a")

    with pytest.raises(sg.BackendError, match="0 results for 1 requests"):
        p.run(backend=Short())


def test_every_request_of_a_run_carries_the_runs_cancellation():
    fb = FakeBackend(responder=lambda r: "ok", selector=lambda r: [[-1.0], [-2.0]])

    @sg.program
    def p(s):
        s += sg.gen("a") + sg.select("b", ["x", "y"])
        forks = s.fork(2)
        forks += sg.gen("c")
        forks.join()

    p.run(backend=fb)
    tokens = {id(r.cancel) for r in fb.requests}
    assert len(tokens) == 1 and fb.requests[0].cancel is not None and not fb.requests[0].cancel.cancelled


# -- request kinds ---------------------------------------------------------------------------------
def test_the_built_in_kinds_are_in_the_table():
    assert {k.name for k in kinds()} >= {"generate", "select"}
    with pytest.raises(sg.StructgenError, match="no request kind"):
        kind_of(object())
    with pytest.raises(ValueError, match="already belongs"):
        register(kind_echo.ECHO.__class__(**{**kind_echo.ECHO.__dict__, "name": "again"}))


def test_a_new_request_kind_from_one_module_runs_batched_and_is_checked_before_sending():
    class Echoing(FakeBackend):
        def __init__(self, outputs):
            super().__init__(outputs)
            self.echoed: list[int] = []

        def echo(self, requests):
            self.echoed.append(len(requests))
            return [kind_echo.EchoResult(r.text.upper()) for r in requests]

    @sg.program
    def p(s):
        s += "A:" + kind_echo.echo("a", "hi") + sg.gen("g")
        forks = s.fork(3)
        forks += lambda i: kind_echo.echo("e", f"f{i}")
        forks.join()

    be = Echoing(["!"])
    st = p.run(backend=be)
    assert st["a"] == "HI" and st.text() == "A:HI!" and st["e"] == ["F0", "F1", "F2"]
    assert be.echoed == [1, 3]  # the three forks' echo requests went as one batch

    with pytest.raises(sg.CapabilityError, match="echo requests") as info:
        p.run(backend=FakeBackend(["!"]))
    assert info.value.variable == "a"


# -- forks -------------------------------------------------------------------------------------------
def test_sglang_fork_item_assignment_idiom():
    fb = FakeBackend(responder=lambda r: f"<{r.prompt[-2:]}>")

    @sg.program
    def p(s):
        s += "P"
        forks = s.fork(2)
        for i in range(len(forks)):
            forks[i] += f"{i}:" + sg.gen("v", max_tokens=4)
        forks.join()

    st = p.run(backend=fb)
    assert st["v"] == ["<0:>", "<1:>"]

    @sg.program
    def swap(s):
        forks = s.fork(2)
        forks[0] = forks[1]

    with pytest.raises(sg.ProgramError, match="cannot be replaced"):
        swap.run(backend=fb)


def test_a_failed_child_fails_the_join_and_the_parent():
    fb = FakeBackend(responder=lambda r: sg.BackendError("down", backend="fake") if r.prompt.endswith("1")
                     else "ok")

    @sg.program
    def p(s):
        forks = s.fork(2)
        forks += lambda i: str(i) + sg.gen("v")
        forks.join()
        s += "after"

    with pytest.raises(sg.BackendError, match="down"):
        p.run(backend=fb)


# -- gen(grammar=...) ----------------------------------------------------------------------------------
def test_gen_grammar_builds_a_checked_grammar_constraint():
    grammar = 'start: "(" item ("," item)* ")"\nitem: /[a-c]{1,3}/'
    node = sg.gen("g", grammar=grammar)
    assert node.constraint == GrammarSpec(grammar)
    for bad in ["start: (", "start: undefined_rule", "", 42]:
        with pytest.raises(sg.ConstraintError):
            sg.gen("g", grammar=bad)
    with pytest.raises(sg.ConstraintError, match="one constraint"):
        sg.gen("g", grammar=grammar, regex="a")
    with pytest.raises(sg.ConstraintError, match="think= takes"):  # never dropped silently
        sg.gen("g", grammar=grammar, think=True)
    no_grammar = FakeBackend(["(a)"], capabilities=Capabilities(regex=True, select="logprobs"))

    @sg.program
    def p(s):
        s += sg.gen("g", grammar=grammar)

    with pytest.raises(sg.CapabilityError, match="grammar"):
        p.run(backend=no_grammar)
    assert no_grammar.requests == []


# -- streaming -------------------------------------------------------------------------------------------
def test_a_backend_that_does_not_stream_delivers_each_generation_whole():
    class Recording(FakeBackend):
        def __init__(self, outputs, **kw):
            super().__init__(outputs, **kw)
            self.callbacks: list[object] = []

        def generate(self, requests, *, on_text=None):
            self.callbacks.append(on_text)
            return super().generate(requests, on_text=on_text)

    @sg.program
    def p(s):
        s += "Q:" + sg.gen("a")

    whole = Recording(["streamed output text"], capabilities=Capabilities(streaming=False, select="logprobs"))
    st = p.run(backend=whole, stream=True)
    assert list(st.text_iter("a")) == ["streamed output text"] and whole.callbacks == [None]
    live = Recording(["streamed output text"])
    st = p.run(backend=live, stream=True)
    assert len(list(st.text_iter("a"))) > 1 and live.callbacks[-1] is not None


def test_a_gen_without_retries_streams_live():
    fb = FakeBackend(["a long streamed answer"])

    @sg.program
    def p(s):
        s += sg.gen("x")

    st = p.run(backend=fb, stream=True)
    chunks = within(30, lambda: list(st.text_iter("x")))
    assert len(chunks) > 1 and "".join(chunks) == st["x"] == "a long streamed answer"


def test_json_text_is_stored_verbatim():
    out = json.dumps({"name": "Z", "age": 2})
    st = sg.program(lambda s: s.__iadd__(sg.gen("p", json_schema=Person))).run(backend=FakeBackend([out]))
    assert st["p"] == out


def test_run_batch_progress_bar_counts_items_and_failures(capsys):
    fb = FakeBackend(responder=lambda r: "x")

    @sg.program
    def tagger(s, t):
        s += t + sg.gen("o")

    states = tagger.run_batch([{"t": "a"}, {"t": "b"}, {"t": "c"}, {"nope": 1}], backend=fb, progress_bar=True)
    assert [st.error() is None for st in states] == [True, True, True, False]
    err = capsys.readouterr().err
    assert "tagger" in err and "4/4" in err and "1 failed" in err


def test_a_nested_program_uses_the_outer_runs_backend_and_cancellation():
    fb = FakeBackend(["inner", "outer"])

    @sg.program
    def inner(s):
        s += sg.gen("i")

    @sg.program
    def outer(s):
        s += inner()["i"] + sg.gen("o")

    st = outer.run(backend=fb)
    assert st.text() == "innerouter"
    assert fb.requests[0].cancel is fb.requests[1].cancel is not None


def test_a_prompt_side_node_registers_its_handler():
    from dataclasses import dataclass

    from structgen.lang.interpreter import register_prompt_node
    from structgen.lang.ir import Expr

    @dataclass(frozen=True)
    class Shout(Expr):
        text: str

    register_prompt_node(Shout, lambda interp, node: interp.append(node.text.upper()))
    with pytest.raises(ValueError, match="already has a handler"):
        register_prompt_node(Shout, lambda interp, node: None)
    st = sg.program(lambda s: s.__iadd__(Shout("hey ") + sg.gen("x"))).run(backend=FakeBackend(["!"]))
    assert st.text() == "HEY !"
