"""The DSL and the interpreter, unit-tested against the scripted FakeBackend (no model)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading

import pytest
from pydantic import BaseModel

import structgen as sg
from structgen.backends.fake import FakeBackend
from structgen.constraints.spec import ChoiceSpec, JsonSchemaSpec, RegexSpec
from structgen.contract.backend import Capabilities, GenerateResult
from structgen.lang.ir import Gen, Select


class Person(BaseModel):
    name: str
    age: int


def test_import_structgen_imports_no_engine():
    code = ("import sys, structgen; bad=[m for m in sys.modules if m.split('.')[0] in "
            "('torch','transformers','vllm','llama_cpp','httpx','numpy')]; print(bad); sys.exit(1 if bad else 0)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_public_surface_is_explicit_and_sorted():
    assert sg.__all__ == sorted(sg.__all__, key=lambda n: (not n.isupper(), n[0].islower(), n))
    for name in sg.__all__:
        assert hasattr(sg, name), name


def test_program_bare_and_with_options_and_call_equals_run():
    fb = FakeBackend(["a", "b"])

    @sg.program
    def bare(s):
        s += "x" + sg.gen("v")

    @sg.function(max_tokens=7, backend=fb)
    def opts(s):
        s += "y" + sg.gen("v")

    assert bare(backend=fb)["v"] == "a"
    assert opts.run()["v"] == "b"
    assert fb.requests[1].params.max_new_tokens == 7
    assert isinstance(bare, sg.Program) and bare.arg_names == []


def test_gen_params_reach_the_request_and_run_defaults_fill_the_rest():
    fb = FakeBackend(["1", "2"])

    @sg.program
    def p(s):
        s += sg.gen("a", max_tokens=5, stop="\n", stop_token_ids=[3], top_k=4, min_tokens=2,
                    frequency_penalty=0.5, return_logprob=True, top_logprobs_num=2)
        s += sg.gen("b")

    p.run(backend=fb, temperature=0.7, max_new_tokens=9, stop=["END"])
    a, b = fb.requests
    assert (a.params.max_new_tokens, a.params.stop, a.params.stop_token_ids, a.params.top_k) == (5, ("\n",), (3,), 4)
    assert (a.params.min_new_tokens, a.params.frequency_penalty, a.params.return_logprob) == (2, 0.5, True)
    assert a.params.temperature == 0.7 and a.program == "p" and a.variable == "a"
    assert (b.params.max_new_tokens, b.params.stop, b.params.temperature) == (9, ("END",), 0.7)
    assert b.prompt == "1"  # the first output is part of the second prompt


def test_json_schema_forms_and_typed_values():
    out = '{"name":"Alice","age":31}'
    fb = FakeBackend([out, out, out])

    @sg.program
    def p(s):
        s += sg.gen("m", json_schema=Person)
        s += sg.gen("d", json_schema=Person.model_json_schema())
        s += sg.gen("t", json_schema=json.dumps(Person.model_json_schema()))

    st = p.run(backend=fb)
    specs = [r.constraint for r in fb.requests]
    assert all(isinstance(c, JsonSchemaSpec) for c in specs)
    assert specs[0].schema == specs[1].schema == specs[2].schema and specs[0].whitespace == "compact"
    assert st["m"] == out
    assert isinstance(st.value("m"), Person) and st.value("m").age == 31
    assert st.value("d") == {"name": "Alice", "age": 31} == st.value("t")
    assert st.values()["m"] == Person(name="Alice", age=31)


def test_malformed_constraints_fail_before_anything_runs():
    with pytest.raises(sg.ConstraintError):
        sg.gen("x", regex="[a-")
    with pytest.raises(sg.ConstraintError):
        sg.gen("x", json_schema="{not json")
    with pytest.raises(sg.ConstraintError):
        sg.gen("x", json_schema=42)
    with pytest.raises(sg.ConstraintError):
        sg.gen("x", dtype=list)
    with pytest.raises(sg.ConstraintError):
        sg.gen("x", regex="a", json_schema={})


def test_dtype_and_regex_constants_and_typed_conversion():
    assert sg.REGEX_INT == r"[-+]?[0-9]+[ \n]*"
    from structgen.lang.ir import REGEX_BOOL, REGEX_FLOAT, REGEX_STR  # SGLang's module path

    assert (REGEX_BOOL, REGEX_FLOAT, REGEX_STR) == (sg.REGEX_BOOL, sg.REGEX_FLOAT, sg.REGEX_STR)
    fb = FakeBackend(["42", "-3.5", "True", '"hi there"'])

    @sg.program
    def p(s):
        s += sg.gen_int("i") + sg.gen("f", dtype=float) + sg.gen("b", dtype=bool) + sg.gen_string("s")

    st = p.run(backend=fb)
    assert [r.constraint for r in fb.requests] == [RegexSpec(sg.REGEX_INT), RegexSpec(sg.REGEX_FLOAT),
                                                   RegexSpec(sg.REGEX_BOOL), RegexSpec(sg.REGEX_STR)]
    assert (st.value("i"), st.value("f"), st.value("b"), st.value("s")) == (42, -3.5, True, "hi there")
    assert st["i"] == "42"  # s[name] is the text, as in SGLang


def test_gen_choices_is_a_select():
    node = sg.gen("c", choices=["a", "b"])
    assert isinstance(node, Select) and node.choices == ("a", "b")
    assert isinstance(sg.gen("g", regex="x"), Gen)


def test_select_scoring_methods():
    # choice 0: one good token; choice 1: a great first token then a poor one
    logprobs = [[-1.0], [-0.1, -3.0]]
    fb = FakeBackend(selector=lambda req: logprobs)

    @sg.program
    def p(s, method):
        s += "Q: " + sg.select("c", ["yes", "no way"], choices_method=method)

    assert p.run("token_length_normalized", backend=fb)["c"] == "yes"  # -1.0 > -1.55
    assert p.run(sg.greedy_token_selection, backend=fb)["c"] == "no way"  # -0.1 > -1.0 first
    st = p.run(sg.unconditional_likelihood_normalized, backend=fb)
    assert fb.requests[-1].need_unconditional is True
    assert st.get_meta_info("c")["normalized_unconditional_prompt_logprobs"] == pytest.approx([-0.5, -1.05])
    assert st.text() == "Q: yes"
    with pytest.raises(sg.ProgramError):
        sg.select("c", ["a"], choices_method="nope")
    with pytest.raises(sg.ProgramError):
        sg.select("c", [])


def test_roles_render_with_the_backend_template_and_messages():
    fb = FakeBackend(["hello", "fine"])

    @sg.program
    def chat(s):
        s += sg.system("sys")
        with s.user():
            s += "hi"
        s += sg.assistant_begin() + sg.gen("a") + sg.assistant_end()
        s += sg.user("how?")
        s += sg.assistant(sg.gen("b"))

    st = chat.run(backend=fb)
    assert st.messages() == [{"role": "system", "content": "sys"}, {"role": "user", "content": "hi"},
                             {"role": "assistant", "content": "hello"}, {"role": "user", "content": "how?"},
                             {"role": "assistant", "content": "fine"}]
    assert st.text() == ("<|system|>sys<|end|>\n<|user|>hi<|end|>\n<|assistant|>hello<|end|>\n"
                         "<|user|>how?<|end|>\n<|assistant|>fine<|end|>\n")
    # the open assistant turn travels as the last message for chat-API backends
    assert fb.requests[1].messages[-1].role == "assistant" and fb.requests[1].messages[-1].content == ""
    assert fb.requests[1].prompt.endswith("<|assistant|>")


def test_role_errors_are_typed():
    fb = FakeBackend([])

    @sg.program
    def nested(s):
        s += sg.user_begin() + sg.assistant_begin()

    with pytest.raises(sg.ProgramError, match="inside an open 'user' turn"):
        nested.run(backend=fb)

    @sg.program
    def no_template(s):
        s += sg.user("x")

    with pytest.raises(sg.ProgramError, match="no chat template"):
        no_template.run(backend=FakeBackend([], render=None))


def test_state_api():
    fb = FakeBackend(["one", "two"])

    @sg.program
    def p(s):
        with s.var_scope("scoped"):
            s += "a" + sg.gen("x")
        s["manual"] = 5
        assert "manual" in s and "missing" not in s
        s += sg.gen("y", return_logprob=True)

    st = p.run(backend=fb)
    assert st["scoped"] == "aone" and st["manual"] == 5 and st.get_var("y") == "two"
    assert st.get_meta_info("y")["finish_reason"] == "stop"
    assert st.error() is None and st.sync() is st
    with pytest.raises(sg.ProgramError, match="no variable 'nope'"):
        st["nope"]


def test_fork_batches_children_and_join_gathers():
    fb = FakeBackend(responder=lambda r: f"out{r.prompt[-1]}")

    @sg.program
    def p(s):
        s += "P"
        forks = s.fork(3)
        forks += lambda i: str(i) + sg.gen("v")
        assert [f["v"] for f in forks] == ["out0", "out1", "out2"]
        forks.join()

    st = p.run(backend=fb)
    assert fb.batches == [3]  # the three children went to the backend as one batch
    assert len({r.group for r in fb.requests}) == 3  # one scheduling group per child
    assert st["v"] == ["out0", "out1", "out2"]
    assert st.text() == "P"


def test_fork_join_concate_and_append_and_list_append():
    fb = FakeBackend(responder=lambda r: "!")

    @sg.program
    def p(s):
        s += "doc:"
        forks = s.fork(2)
        forks += ["A", "B"]
        forks += sg.gen("g")
        forks.join(mode="concate_and_append")
        s += sg.gen("final")

    st = p.run(backend=fb)
    assert st.text() == "doc:A!B!!"
    assert fb.requests[-1].prompt == "doc:A!B!"
    with pytest.raises(sg.ProgramError):
        @sg.program
        def bad(s):
            s.fork(2).join(mode="zip")

        bad.run(backend=fb)


def test_streaming_text_iter_and_async_iter():
    fb = FakeBackend(["streamed output text", "second"])

    @sg.program
    def p(s):
        s += "Q:" + sg.gen("a") + "|" + sg.gen("b")

    st = p.run(backend=fb, stream=True)
    chunks = list(st.text_iter())
    assert "".join(chunks) == "Q:streamed output text|second" == st.text()
    assert len(chunks) > 3

    st2 = p.run(backend=FakeBackend(["streamed output text", "x"]), stream=True)

    async def collect():
        out = []
        async for chunk, meta in st2.text_async_iter("a", return_meta_data=True):
            out.append(chunk)
            assert isinstance(meta, dict)
        return out

    assert "".join(asyncio.run(collect())) == "streamed output text"


def test_streaming_error_is_raised_by_the_iterator():
    fb = FakeBackend([])  # script exhausted -> BackendError

    @sg.program
    def p(s):
        s += "x" + sg.gen("a")

    st = p.run(backend=fb, stream=True)
    with pytest.raises(sg.BackendError, match="script exhausted"):
        list(st.text_iter())
    assert isinstance(st.error(), sg.BackendError)


def test_run_batch_isolates_failures_and_keeps_order():
    def responder(req):
        if "boom" in req.prompt:
            return sg.BackendError("server died", backend="fake", retryable=True)
        return req.prompt.upper()

    fb = FakeBackend(responder=responder)

    @sg.program
    def p(s, text):
        s += text + sg.gen("out")

    items = [{"text": f"item{i}"} for i in range(10)] + [{"text": "boom"}]
    states = p.run_batch(items, backend=fb, num_threads=4)
    assert [st["out"] for st in states[:10]] == [f"ITEM{i}" for i in range(10)]
    err = states[10].error()
    assert isinstance(err, sg.BackendError) and err.retryable and err.variable == "out" and err.program == "p"
    gen = p.run_batch(items[:3], backend=fb, generator_style=True, progress_bar=True)
    assert not isinstance(gen, list)
    assert [s["out"] for s in gen] == ["ITEM0", "ITEM1", "ITEM2"]
    bad = p.run_batch([{"nope": 1}], backend=fb)
    assert isinstance(bad[0].error(), sg.ProgramError)


def test_output_cut_short_raises_typed_error_with_raw_text_and_retries_resample():
    raw = '{"name":"Al'
    fb = FakeBackend(responder=lambda r: GenerateResult(raw, finish_reason="length"))

    @sg.program
    def p(s):
        s += sg.gen("person", json_schema=Person, max_tokens=4)

    with pytest.raises(sg.OutputValidationError) as info:
        p.run(backend=fb)
    err = info.value
    assert err.raw == raw and err.truncated and err.variable == "person" and err.program == "p"
    assert "max_tokens" in str(err)

    outputs = iter([GenerateResult(raw, finish_reason="length"), GenerateResult('{"name":"Al","age":3}')])
    fb2 = FakeBackend(responder=lambda r: next(outputs))

    @sg.program
    def q(s):
        s += sg.gen("person", json_schema=Person, retries=1)

    st = q.run(backend=fb2)
    assert st.value("person") == Person(name="Al", age=3)
    assert fb2.requests[1].params.temperature > 0 and st.get_meta_info("person")["attempts"] == 2


def test_unsupported_constraint_raises_before_sending():
    fb = FakeBackend(["x"], capabilities=Capabilities(json_schema=True, select="choice"))

    @sg.program
    def p(s):
        s += sg.gen("r", regex=r"\d+")

    with pytest.raises(sg.CapabilityError, match=r"fake.*regex") as info:
        p.run(backend=fb)
    assert info.value.variable == "r" and fb.requests == []

    @sg.program
    def q(s):
        s += sg.select("c", ["a", "b"], choices_method=sg.unconditional_likelihood_normalized)

    with pytest.raises(sg.CapabilityError, match="unconditional_likelihood_normalized"):
        q.run(backend=fb)
    assert fb.requests == []


def test_backend_exception_is_mapped_and_user_bugs_are_program_errors():
    fb = FakeBackend(responder=lambda r: RuntimeError("socket closed"))

    @sg.program
    def p(s):
        s += sg.gen("x")

    with pytest.raises(sg.BackendError, match="socket closed") as info:
        p.run(backend=fb)
    assert isinstance(info.value.__cause__, RuntimeError)

    @sg.program
    def buggy(s):
        raise KeyError("oops")

    with pytest.raises(sg.ProgramError, match="KeyError"):
        buggy.run(backend=fb)


def test_concurrent_runs_in_threads_and_asyncio_do_not_mix():
    fb = FakeBackend(responder=lambda r: r.prompt[::-1])

    @sg.program
    def p(s, word):
        s += word + sg.gen("rev")
        s += sg.gen("again")

    results: dict[str, str] = {}

    def work(w):
        results[w] = p.run(w, backend=fb)["rev"]

    threads = [threading.Thread(target=work, args=(f"w{i}",)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == {f"w{i}": f"w{i}"[::-1] for i in range(8)}

    async def main():
        states = await asyncio.gather(*(p.arun(f"a{i}", backend=fb) for i in range(5)))
        return [s["rev"] for s in states]

    assert asyncio.run(main()) == [f"a{i}"[::-1] for i in range(5)]


def test_set_default_backend():
    fb = FakeBackend(["d"])
    sg.set_default_backend(fb)
    try:
        @sg.program
        def p(s):
            s += sg.gen("x")

        assert p.run()["x"] == "d"
        assert sg.get_default_backend() is fb
    finally:
        sg.set_default_backend(None)
    assert "fake" in sg.available_backends() and "embedded" in sg.available_backends()
    assert isinstance(sg.get_backend("fake"), FakeBackend)
    with pytest.raises(sg.BackendError, match="no backend named"):
        sg.get_backend("nope")


SGLANG_PROGRAM = '''
import sglang as sgl
from sglang.lang.ir import REGEX_INT

@sgl.function
def tool_use(s, question):
    s += sgl.system("You are a helpful assistant.")
    s += sgl.user(question)
    s += sgl.assistant("To answer this, I need " + sgl.gen("tool", choices=["calculator", "search engine"]) + ". ")
    s += sgl.assistant(sgl.gen("n", regex=REGEX_INT, max_tokens=8))
    forks = s.fork(2)
    for i, f in enumerate(forks):
        f += sgl.gen(f"tip", max_tokens=4, stop="\\n")
    forks.join()

state = tool_use.run(question="What is 2+2?", temperature=0)
RESULT = (state["tool"], state["n"], state["tip"])
'''


def test_an_sglang_program_runs_by_changing_only_the_import():
    fb = FakeBackend(responder=lambda r: "7" if r.constraint else "tip", selector=lambda r: [[-2.0], [-1.0]])
    sg.set_default_backend(fb)
    try:
        code = SGLANG_PROGRAM.replace("import sglang as sgl", "import structgen as sgl").replace(
            "from sglang.lang.ir", "from structgen.lang.ir")
        ns: dict = {}
        exec(compile(code, "sglang_program", "exec"), ns)
        assert ns["RESULT"] == ("search engine", "7", ["tip", "tip"])
    finally:
        sg.set_default_backend(None)


def test_choice_spec_is_used_for_gen_in_constraint_backends():
    # ChoiceSpec is a first-class constraint for adapters (select="choice")
    assert ChoiceSpec(("a", "b")).describe() == "choices ['a', 'b']"


def test_program_parameters_named_like_sampling_params_are_program_arguments():
    fb = FakeBackend(["x", "y"])

    @sg.program
    def p(s, n, temperature="warm"):
        s += f"{n}{temperature}" + sg.gen("g")

    st = p.run(n=3, temperature="cold", backend=fb, max_tokens=5)
    assert st.text() == "3coldx"
    assert fb.requests[0].params.n is None and fb.requests[0].params.max_new_tokens == 5


def test_run_batch_traces_the_shared_prefix_and_warms_it_once():
    class Warmable(FakeBackend):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            self.capabilities = Capabilities(json_schema=True, prefix_cache=True, select="logprobs",
                                              sampling=self.capabilities.sampling)
            self.warmed: list[str] = []

        def warm(self, prefix):
            self.warmed.append(prefix)

    fb = Warmable(responder=lambda r: "ok")

    @sg.program
    def p(s, doc):
        s += sg.system("Extract fields.\nExamples:\nA -> 1\n")
        s += sg.user(f"Document: {doc}")
        s += sg.assistant(sg.gen("out"))
        if s["out"] == "ok":  # reading a value ends the trace; nothing is generated by it
            s += "done"

    items = [{"doc": f"d{i}"} for i in range(5)]
    prefix = p.shared_prefix(items, backend=fb)
    assert prefix == "<|system|>Extract fields.\nExamples:\nA -> 1\n<|end|>\n"
    assert fb.requests == []  # tracing sent nothing
    states = p.run_batch(items, backend=fb)
    assert fb.warmed == [prefix]
    assert all(st.text().endswith("done") for st in states)
    assert all(r.prompt.startswith(prefix) for r in fb.requests)
    # one item: nothing to share
    p.run_batch(items[:1], backend=fb)
    assert fb.warmed == [prefix]


def test_sync_all_runs_chosen_states_as_one_batch_and_set_result_records_a_helper_result():
    fb = FakeBackend(["a", "b", "c"])
    seen = {}

    @sg.program
    def p(s):
        forks = s.fork(3)
        for f in forks:
            f += sg.gen("v", max_tokens=3)
        sg.ProgramState.sync_all([forks[0], forks[2]])  # two of the three children, one batch
        seen["batches"] = list(fb.batches)
        seen["values"] = [forks[0]["v"], forks[2]["v"]]
        forks[1].sync()
        s.set_result("helper", "text", {"rich": 1}, {"steps": 2})
        s.set_result("plain", "t2")
        with pytest.raises(sg.ProgramError):
            sg.ProgramState.sync_all([forks[0], other_run_state])

    other_run_state = sg.program(lambda s: None).run(backend=FakeBackend([]))
    st = p.run(backend=fb)
    st.raise_if_failed()
    assert seen["batches"] == [2] and sorted(seen["values"]) == ["a", "b"]
    assert st["helper"] == "text" and st.value("helper") == {"rich": 1}
    assert st.get_meta_info("helper") == {"steps": 2}
    assert st["plain"] == "t2" and st.value("plain") == "t2" and "helper" not in st.text()
