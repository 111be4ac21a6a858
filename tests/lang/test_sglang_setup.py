"""Issue 12: an SGLang script runs after swapping its import, setup lines included.

The constructors SGLang scripts write at the top map to structgen's real adapters, here
against local HTTP servers on 127.0.0.1: SGLang has no CPU build, so ``RuntimeEndpoint`` is
exercised against an SGLang-protocol stub server (tests/lang/stub_servers.py: canned but
protocol-correct answers), and ``OpenAI`` against an OpenAI-compatible stub; the live
engines' own tests are in tests/backends.
"""

from __future__ import annotations

import re
import textwrap

import pytest

import structgen as sg
from structgen.backends.embedded.loader import resolve_model_dir
from structgen.backends.openai import OpenAIBackend
from structgen.backends.sglang import SGLangBackend
from tests.lang.stub_servers import OpenAIStub, SGLangStub

SGLANG_SCRIPT = textwrap.dedent('''
    import sglang as sgl
    from sglang.lang.ir import REGEX_INT

    sgl.set_default_backend(sgl.RuntimeEndpoint(URL))

    @sgl.function
    def triage(s, ticket):
        s += sgl.system("You triage support tickets.")
        s += sgl.user(ticket)
        s += sgl.assistant("Team: " + sgl.gen("team", choices=["billing", "network"]) + ". Priority: "
                           + sgl.gen("priority", regex=REGEX_INT, max_tokens=4))
        forks = s.fork(2)
        for i in range(len(forks)):
            forks[i] += sgl.user(f"Next step {i}?") + sgl.assistant(sgl.gen("step", max_tokens=8, stop="\\n"))
        forks.join()

    state = triage.run(ticket="My invoice is wrong.", temperature=0)
    states = triage.run_batch([{"ticket": "Wifi down"}, {"ticket": "Refund please"}])
    INFO = sgl.get_server_info()
    FLUSHED = sgl.flush_cache()
    RESULT = (state["team"], state["priority"], state["step"], [st["priority"] for st in states])
''')


def _answers(sp, text):
    if sp.get("regex"):
        return "3" if re.fullmatch(sp["regex"], "3") else "?"
    return "check it\nmore"


def test_an_sglang_script_with_its_setup_lines_runs_on_structgen():
    with SGLangStub(_answers, tokenizer_path=resolve_model_dir(), preferred="biling") as server:
        code = SGLANG_SCRIPT.replace("import sglang as sgl", "import structgen as sgl").replace(
            "from sglang.lang.ir", "from structgen.lang.ir")
        ns: dict = {"URL": server.url}
        try:
            exec(compile(code, "sglang_script", "exec"), ns)
            backend = sg.get_default_backend()
        finally:
            sg.set_default_backend(None)
        assert isinstance(backend, SGLangBackend) and backend.base_url == server.url
        assert ns["RESULT"] == ("billing", "3", ["check it", "check it"], ["3", "3"])
        assert ns["INFO"]["version"] == "0.5.6-stub" and ns["FLUSHED"] is True and server.flushed == 1
        regexes = [b["sampling_params"].get("regex") for b in server.bodies("/generate")
                   if isinstance(b["text"], str)]
        assert sg.REGEX_INT in regexes  # the constraint reached the server
        prompts = [b["text"] for b in server.bodies("/generate") if isinstance(b["text"], str)]
        assert any("<|im_start|>system\nYou triage support tickets." in p for p in prompts)  # SmolLM2's template


def test_runtime_endpoint_arguments():
    with SGLangStub(_answers) as server:
        backend = sg.RuntimeEndpoint(server.url, api_key="sk-test")
        assert isinstance(backend, SGLangBackend) and backend.version == "0.5.6-stub"
        headers = server.requests[0][2]
        assert headers.get("Authorization") == "Bearer sk-test"
        with pytest.warns(UserWarning, match="chat_template_name"):
            sg.RuntimeEndpoint(server.url, chat_template_name="chatml")
    with pytest.raises(sg.BackendError, match="verify"):
        sg.RuntimeEndpoint("http://127.0.0.1:1", verify=False)


def test_openai_constructor_with_sglangs_argument_names(monkeypatch):
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    with OpenAIStub(lambda body: '{"choice":"yes"}' if body.get("response_format") else "Paris") as server:
        monkeypatch.setenv("OPENAI_API_KEY", "sk-from-env")
        backend = sg.OpenAI("gpt-4o-mini", base_url=server.url + "/v1", timeout=30, max_retries=1)
        assert isinstance(backend, OpenAIBackend) and backend.model == "gpt-4o-mini"

        @sg.function
        def ask(s, q):
            s += sg.user(q)
            s += sg.assistant(sg.gen("answer", max_tokens=8))
            s += sg.user("Sure?")
            s += sg.assistant(sg.select("sure", choices=["yes", "no"]))

        st = ask.run(q="Capital of France?", backend=backend)
        assert st["answer"] == "Paris" and st["sure"] == "yes"
        body = server.bodies("/v1/chat/completions")[0]
        assert body["model"] == "gpt-4o-mini" and body["max_tokens"] == 8
        assert body["messages"] == [{"role": "user", "content": "Capital of France?"}]
        assert server.requests[-1][2].get("Authorization") == "Bearer sk-from-env"


@pytest.mark.parametrize(("call", "match"), [
    (lambda: sg.OpenAI("gpt-3.5-turbo-instruct"), "completions"),
    (lambda: sg.OpenAI("m", is_azure=True), "Azure"),
    (lambda: sg.OpenAI("m", organization="org-1"), "organization"),
    (lambda: sg.Engine(model_path="x"), "Runtime"),
    (lambda: sg.Anthropic("claude"), "OpenAI"),
    (lambda: sg.LiteLLM("gpt-4o"), "proxy"),
    (lambda: sg.VertexAI("gemini"), "OpenAI-compatible"),
    (lambda: sg.Runtime(model_path="x", dtype="int3"), "dtype"),
])
def test_constructors_without_an_equivalent_raise_a_clear_error(call, match):
    with pytest.raises(sg.BackendError, match=match):
        call()


@pytest.mark.model
def test_runtime_runs_the_model_in_process():
    with pytest.warns(UserWarning, match="mem_fraction_static"):
        runtime = sg.Runtime(model_path=None, mem_fraction_static=0.8, tp_size=1)
    try:
        sg.set_default_backend(runtime)

        @sg.function
        def count(s):
            s += "Count: 1, 2, " + sg.gen("n", regex="[0-9]", max_tokens=2)

        assert re.fullmatch("[0-9]", count.run()["n"])
        assert sg.flush_cache() is True and sg.get_server_info()["backend"] == "embedded"
    finally:
        sg.set_default_backend(None)
        runtime.shutdown()


# -- sgl.separate_reasoning (a prompt-side node registered by structgen.compat.reasoning) ---------------
@pytest.mark.parametrize(("model_type", "output", "reasoning", "answer"), [
    ("deepseek-r1", "add 2 and 2</think> 4", "add 2 and 2", "4"),      # no start tag: starts inside
    ("qwen3", "<think>add 2 and 2</think>\n\n4", "add 2 and 2", "4"),
    ("qwen3", "4", "", "4"),                                            # no thinking at all
    ("deepseek-r1", "still thinking", "still thinking", ""),           # cut short inside the section
])
def test_separate_reasoning_splits_the_thinking_into_its_own_variable(model_type, output, reasoning, answer):
    from structgen.backends.fake import FakeBackend

    @sg.function
    def solve(s):
        s += sg.user("2+2?")
        s += sg.assistant(sg.separate_reasoning(sg.gen("answer", max_tokens=32), model_type=model_type))
        s += "after"

    state = solve.run(backend=FakeBackend([output]))
    assert state["answer"] == answer
    assert state["answer_reasoning_content"] == reasoning
    assert output in state.text() and state.text().endswith("after")  # the state keeps what the model wrote


def test_separate_reasoning_needs_a_known_model_type_and_a_named_gen():
    with pytest.raises(sg.ProgramError, match="deepseek-r1"):
        sg.separate_reasoning(sg.gen("a"), model_type="gpt-9")
    with pytest.raises(sg.ProgramError, match="named gen"):
        sg.separate_reasoning(sg.gen(), model_type="qwen3")
