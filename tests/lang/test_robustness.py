"""Issue 13, the DSL side: validated run options (item 3), errors from below the program
body (item 6), streaming with retries (item 9), Ctrl-C in run_batch (item 12).

Each test fails on the code before these fixes; the ones that could hang run under a
deadline. Only the public API and the scripted FakeBackend are used here (the embedded
model versions are in test_embedded_lang.py).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from pydantic import BaseModel

import structgen as sg
from structgen.backends.fake import FakeBackend
from structgen.contract.backend import GenerateResult
from tests.lang.deadline import within

ROOT = Path(__file__).resolve().parents[2]


class Person(BaseModel):
    name: str
    age: int


# -- item 3: every sampling option is checked where it is passed -------------------------------------
BAD_OPTIONS = [("max_tokens", 24.5), ("max_tokens", 0), ("min_tokens", -1), ("temperature", "hot"),
               ("temperature", float("nan")), ("top_p", 0), ("top_p", 1.5), ("top_k", 2.5), ("min_p", 2),
               ("stop", [1]), ("stop_token_ids", ["a"]), ("stop_regex", "("), ("ignore_eos", "yes"),
               ("frequency_penalty", 5), ("n", 0), ("return_logprob", 1), ("top_logprobs_num", -2)]


@pytest.mark.parametrize(("option", "value"), BAD_OPTIONS)
def test_a_bad_option_in_gen_raises_a_typed_error_naming_it(option, value):
    with pytest.raises(sg.OptionError, match=rf"^{option} must be") as info:
        sg.gen("x", **{option: value})
    assert info.value.option == option and info.value.value is value


@pytest.mark.parametrize(("option", "value"), [("max_tokens", 24.5), ("max_new_tokens", "24"),
                                               ("temperature", -1), ("seed", True)])
def test_a_bad_option_in_run_or_program_defaults_raises_before_anything_is_sent(option, value):
    fb = FakeBackend(["x"])

    @sg.program
    def p(s):
        s += sg.gen("x")

    with pytest.raises(sg.OptionError, match=rf"^{option} must be") as info:
        p.run(backend=fb, **{option: value})
    assert info.value.program == "p" and fb.requests == []
    with pytest.raises(sg.OptionError, match=option):
        sg.program(**{option: value})(lambda s: None)


def test_good_options_are_normalised():
    node = sg.gen("x", stop="END", stop_token_ids=[2, 3], max_tokens=5, temperature=0)
    assert dict(node.params) == {"stop": ("END",), "stop_token_ids": (2, 3), "max_new_tokens": 5,
                                 "temperature": 0}


def test_in_run_batch_a_bad_item_fails_alone():
    fb = FakeBackend(responder=lambda r: f"{r.params.max_new_tokens}")

    @sg.program
    def p(s, text):
        s += text + sg.gen("out")

    items = [{"text": f"t{i}", "max_tokens": 24} for i in range(11)] + [{"text": "bad", "max_tokens": 24.5}]
    states = p.run_batch(items, backend=fb)
    assert [st.error() for st in states[:11]] == [None] * 11
    assert [st["out"] for st in states[:11]] == ["24"] * 11
    err = states[11].error()
    assert isinstance(err, sg.OptionError) and err.option == "max_tokens" and err.value == 24.5
    assert len(fb.requests) == 11  # the bad item sent nothing
    with pytest.raises(sg.OptionError, match="temperature"):  # a bad shared option fails the call
        p.run_batch(items[:2], backend=fb, temperature="x")


# -- item 6 (program side): errors from below the program body are never blamed on it ----------------
def test_an_output_the_validator_cannot_parse_is_an_output_error_with_its_raw_text_and_retries():
    deep = "[" * 100_000 + "]" * 100_000  # json.loads raises RecursionError on it
    schema = {"type": "array"}

    @sg.program
    def p(s):
        s += sg.gen("x", json_schema=schema)

    with pytest.raises(sg.OutputValidationError) as info:
        p.run(backend=FakeBackend([deep]))
    assert info.value.raw == deep and info.value.variable == "x"
    assert not isinstance(info.value, sg.ProgramError)

    @sg.program
    def q(s):
        s += sg.gen("x", json_schema=schema, retries=1)

    st = q.run(backend=FakeBackend([deep, "[1]"]))
    assert st.value("x") == [1] and st.get_meta_info("x")["attempts"] == 2


@pytest.mark.parametrize("content", [123, None, ["a", "b"]])
def test_non_text_content_from_a_backend_is_a_backend_error(content):
    fb = FakeBackend(responder=lambda r: GenerateResult(content))

    @sg.program
    def p(s):
        s += "Q:" + sg.gen("x")

    with pytest.raises(sg.BackendError, match=type(content).__name__) as info:
        p.run(backend=fb)
    assert info.value.variable == "x"


def test_a_backend_failure_inside_the_body_is_not_blamed_on_the_body():
    fb = FakeBackend(responder=lambda r: GenerateResult(123))

    @sg.program
    def p(s):
        s += "x" + sg.gen("a")
        s += "y" + s["a"]  # reading the value fails below the body

    with pytest.raises(sg.BackendError) as info:
        p.run(backend=fb)
    assert "program body" not in str(info.value)


# -- item 9: streaming with retries -------------------------------------------------------------------
def test_streaming_with_retries_never_shows_a_rejected_attempt():
    """Issue 13 item 9: the stream holds a retried gen back until an attempt validates."""
    raw = '{"name":"Al'
    attempts = iter([GenerateResult(raw, finish_reason="length"), GenerateResult('{"name":"Al","age":3}')])
    fb = FakeBackend(responder=lambda r: next(attempts))  # streams each result in three deltas

    @sg.program
    def p(s):
        s += "Person: " + sg.gen("person", json_schema=Person, retries=2) + "\nEnd"

    def scenario():
        st = p.run(backend=fb, stream=True)
        everything = "".join(st.text_iter())
        return st, everything

    st, everything = within(30, scenario)
    assert everything == st.text() == 'Person: {"name":"Al","age":3}\nEnd'
    assert st.get_meta_info("person")["attempts"] == 2
    st2 = p.run(backend=FakeBackend(['{"name":"B","age":1}']), stream=True)
    assert within(30, lambda: "".join(st2.text_iter("person"))) == st2["person"]


# -- item 12: Ctrl-C and interrupts in run_batch --------------------------------------------------------
class Stepping(FakeBackend):
    """Decodes in 10 ms steps, checking each request's cancel flag between steps as an engine
    does; "quick" prompts take 3 steps, "slow" ones 2,000 (20 s)."""

    def __init__(self):
        super().__init__()
        self.steps = 0
        self.quick_done = 0

    def generate(self, requests, *, on_text=None):
        out = []
        for r in requests:
            cancel = getattr(r, "cancel", None)
            for _ in range(3 if "quick" in r.prompt else 2000):
                if cancel is not None and cancel.cancelled:
                    out.append(cancel.error(program=r.program, variable=r.variable))
                    break
                time.sleep(0.01)
                self.steps += 1
            else:
                out.append(GenerateResult(f"done:{r.prompt}"))
                self.quick_done += "quick" in r.prompt
        return out


CTRL_C_CHILD = textwrap.dedent('''
    import json, os, signal, sys, threading, time
    sys.path.insert(0, sys.argv[1])
    import structgen as sg
    from tests.lang.test_robustness import Stepping

    backend = Stepping()

    @sg.program
    def p(s, kind):
        s += kind + sg.gen("out")

    items = [{"kind": "quick"}] * 4 + [{"kind": "slow"}] * 4

    def ctrl_c():  # a real SIGINT once the quick items are done and the slow ones decode
        while backend.quick_done < 4 or backend.steps < 30:
            time.sleep(0.01)
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=ctrl_c, daemon=True).start()
    try:
        p.run_batch(items, backend=backend, num_threads=8)
        print(json.dumps({"caught": "nothing"}))
    except BaseException as exc:
        at_catch = backend.steps
        time.sleep(0.5)  # abandoned work would keep stepping meanwhile
        states = getattr(exc, "states", None) or []
        print(json.dumps({
            "caught": type(exc).__name__, "is_keyboard_interrupt": isinstance(exc, KeyboardInterrupt),
            "outs": [st["out"] if st.error() is None else None for st in states],
            "errors": [type(st.error()).__name__ if st.error() else None for st in states],
            "steps_after_catch": backend.steps - at_catch}), flush=True)
''')


def test_ctrl_c_cancels_the_outstanding_items_promptly_and_raises_with_what_finished(tmp_path):
    script = tmp_path / "ctrl_c.py"
    script.write_text(CTRL_C_CHILD)
    proc = subprocess.run([sys.executable, str(script), str(ROOT)], capture_output=True, text=True,
                          timeout=120, cwd=ROOT, check=False)  # the slow items alone would take 20 s each
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    assert lines, proc.stdout + proc.stderr
    got = json.loads(lines[-1])
    assert got["caught"] == "BatchInterrupted" and got["is_keyboard_interrupt"], got
    assert got["outs"][:4] == ["done:quick"] * 4  # what finished is kept
    assert got["errors"] == [None] * 4 + ["RequestCancelled"] * 4
    assert got["steps_after_catch"] == 0  # nothing abandoned keeps running
    assert proc.returncode == 0


@pytest.mark.parametrize("interrupt", [KeyboardInterrupt, SystemExit])
def test_an_interrupt_raised_in_one_item_cancels_the_batch_and_keeps_what_finished(interrupt):
    backend = Stepping()

    @sg.program
    def p(s, kind):
        s += kind + sg.gen("out")
        if kind == "boom":
            while backend.quick_done < 3:  # the quick items finish first
                time.sleep(0.01)
            raise interrupt

    items = [{"kind": "quick"}] * 3 + [{"kind": "slow"}] * 3 + [{"kind": "boom"}]

    def scenario():
        try:
            p.run_batch(items, backend=backend, num_threads=8)
        except BaseException as exc:
            return exc
        return None

    exc = within(60, scenario)
    assert isinstance(exc, sg.BatchInterrupted) and isinstance(exc.cause, interrupt), exc
    assert [st["out"] for st in exc.states[:3]] == ["done:quick"] * 3
    assert all(isinstance(st.error(), sg.RequestCancelled) for st in exc.states[3:])
    assert exc.finished == 3
    steps = backend.steps
    time.sleep(0.3)
    assert backend.steps == steps  # the slow items stopped


def test_leaving_a_generator_style_batch_early_cancels_the_rest():
    backend = Stepping()

    @sg.program
    def p(s, kind):
        s += kind + sg.gen("out")

    def scenario():
        states = p.run_batch([{"kind": "quick"}] + [{"kind": "slow"}] * 3, backend=backend,
                             generator_style=True, num_threads=4)
        first = next(states)
        states.close()
        return first

    first = within(60, scenario)
    assert first["out"] == "done:quick"
    time.sleep(0.2)
    steps = backend.steps
    time.sleep(0.3)
    assert backend.steps == steps
