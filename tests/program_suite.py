"""One suite of example programs, run against every backend that can run here.

Each check runs a program from ``programs/`` on the given backend and asserts
*structure* (regex full match, schema validity, choice membership, message counts,
types), never model knowledge. Backend test modules call :func:`run_suite_case`.

With a real model (the embedded SmolLM2, or a server serving it) a value a program shows
must not come back empty: a blank is a broken demo. A server test with a random-weight
model runs the checks inside :func:`random_weights`, which keeps them to structure.
"""

from __future__ import annotations

import contextvars
import json
import re
from collections.abc import Iterator
from contextlib import contextmanager

import jsonschema
import pytest

import structgen as sg
from programs import (
    calculator_agent,
    chat,
    classify,
    dtype_gen,
    few_shot_qa,
    json_extraction,
    mcp_agent,
    parallel_decoding,
    parallel_encoding,
    react,
    regex_gen,
    sqlite_agent,
    subagents,
)
from tests.jsontext import outside_strings

_REAL_MODEL = contextvars.ContextVar("real_model", default=True)


@contextmanager
def random_weights() -> Iterator[None]:
    """Checks run inside see a random-weight model: what it says is noise, even nothing."""
    token = _REAL_MODEL.set(False)
    try:
        yield
    finally:
        _REAL_MODEL.reset(token)


def _shown(value: object, what: str) -> None:
    """A value the program prints: an empty one would show as a blank (a broken demo)."""
    assert isinstance(value, str), f"{what} is not text: {value!r}"
    assert value.strip() or not _REAL_MODEL.get(), f"{what} came back empty: {value!r}"


def check_few_shot_qa(backend):
    st = few_shot_qa.few_shot_qa.run(question="What is the capital of Spain?", backend=backend)
    ans = st["answer"]
    assert isinstance(ans, str) and "\n" not in ans
    _shown(ans, "answer")
    assert st.text().endswith(ans)
    assert st.text().count("Q: ") == len(few_shot_qa.EXAMPLES) + 1


def check_chat(backend):
    qs = ["What is water made of?", "And ice?"]
    st = chat.chat.run(questions=qs, backend=backend)
    msgs = st.messages()
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "user", "assistant"]
    assert msgs[1]["content"] == qs[0] and msgs[3]["content"] == qs[1]
    assert msgs[2]["content"] == st["answer_0"] and msgs[4]["content"] == st["answer_1"]
    _shown(st["answer_0"], "answer_0")
    _shown(st["answer_1"], "answer_1")


def check_json_extraction(backend):
    texts = ["Alice Martin is 31 years old and lives in Lyon.", "Bob Chen, 45, lives in Toronto."]
    states = json_extraction.extract_person.run_batch([{"text": t} for t in texts], backend=backend)
    schema = json_extraction.Person.model_json_schema()
    for st in states:
        assert st.error() is None, st.error()
        raw = st["person"]
        jsonschema.validate(json.loads(raw), schema)
        person = st.value("person")
        assert isinstance(person, json_extraction.Person)
        _shown(person.name, "person.name")
        _shown(person.city, "person.city")
        assert not any(ch.isspace() for ch in outside_strings(raw)), raw  # compact JSON by default


def check_regex_gen(backend):
    st = regex_gen.regex_gen.run(host="example.org", backend=backend)
    assert re.fullmatch(regex_gen.IPV4, st["ip"]), st["ip"]
    assert re.fullmatch(regex_gen.ISO_DATE, st["date"]), st["date"]


def check_classify(backend):
    st = classify.classify.run(review="Great screen, terrible battery.", backend=backend)
    assert st["label"] in classify.LABELS
    msgs = st.messages()
    assert [m["role"] for m in msgs] == ["user", "assistant"]
    assert msgs[1]["content"] == "Sentiment: " + st["label"]


def check_parallel_decoding(backend):
    st = parallel_decoding.tips.run(topic="sleeping well", n=3, backend=backend)
    assert isinstance(st["tip"], list) and len(st["tip"]) == 3
    assert all(isinstance(t, str) and "\n" not in t for t in st["tip"])
    assert "\n" not in st["summary"]
    for i, tip in enumerate(st["tip"]):
        _shown(tip, f"tip {i + 1}")
    _shown(st["summary"], "summary")


def check_parallel_encoding(backend):
    docs = ["Cats purr.", "Dogs bark.", "Cows moo."]
    st = parallel_encoding.answer_from_docs.run(docs=docs, question="Which animal barks?", backend=backend)
    text = st.text()
    positions = [text.index(f"Document {i + 1}: {d}") for i, d in enumerate(docs)]
    assert positions == sorted(positions)
    assert text.index("Question:") > positions[-1]
    _shown(st["answer"], "answer")


def check_react(backend):
    st = react.react.run(question="What is 2 + 2?", max_steps=2, backend=backend)
    steps = st["steps"]
    assert 1 <= steps <= 2
    for i in range(1, steps + 1):
        assert st[f"action_{i}"] in react.ACTIONS
        assert re.fullmatch(r"[^\]\n]{1,40}", st[f"arg_{i}"]), st[f"arg_{i}"]  # the closing "]" is the stop
        _shown(st[f"thought_{i}"], f"thought_{i}")
    if st[f"action_{steps}"] == "Finish":
        assert st["answer"] == st[f"arg_{steps}"]


def check_dtype_gen(backend):
    st = dtype_gen.facts.run(thing="a dog", backend=backend)
    assert re.fullmatch(sg.REGEX_INT, st["legs"]) and isinstance(st.value("legs"), int)
    assert re.fullmatch(sg.REGEX_FLOAT, st["weight"]) and isinstance(st.value("weight"), float)
    assert st["mammal"] in ("True", "False") and isinstance(st.value("mammal"), bool)
    assert re.fullmatch(sg.REGEX_STR, st["name"]) and isinstance(st.value("name"), str)
    _shown(st.value("name"), "name")


_STOPS = {"answer", "max_steps", "max_calls", "max_seconds", "loop_guard", "final_tool"}


def _check_agent_run(st, var, tool_names):
    """Structure of a finished tool loop: its record, every call valid, the conversation's roles."""
    res = st.value(var)
    assert res.stopped in _STOPS and len(res.steps) >= 1
    assert st[var] == (res.answer or "")
    if res.stopped == "answer":
        assert "<tool_call>" not in res.answer
        _shown(res.answer, "the agent's answer")
    for step in res.steps:
        turn = st.value(step.variable)
        assert [c.name for c in turn.calls] == [c.tool for c in step.calls]
        for call, rec in zip(turn.calls, step.calls, strict=True):
            assert rec.tool in tool_names and rec.arguments == call.raw_arguments
            assert (rec.error is None) or isinstance(rec.error, str)
    roles = [m["role"] for m in st.messages()]
    assert roles[-1] in ("assistant", "tool") and "assistant" in roles
    return res


def check_calculator_agent(backend):
    assert calculator_agent.calculate(expression="(2 + 3) * 4") == 20
    st = calculator_agent.agent.run("What is 12 * 7, and how many metres are 2 km?", backend=backend)
    res = _check_agent_run(st, "answer", {"calculate", "convert"})
    for rec in res.calls:
        if rec.tool == "convert" and rec.error is None:
            assert isinstance(rec.result, float)


def check_sqlite_agent(backend):
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as folder:
        st = sqlite_agent.sqlite_agent.run(question="Which cities of Japan are listed?", folder=folder,
                                           backend=backend)
        assert Path(st["database"]).is_file() and Path(st["database"]).parent == Path(folder)
        res = _check_agent_run(st, "answer", {"list_tables", "query"})
        for rec in res.calls:
            if rec.tool == "query" and rec.error is None:
                assert isinstance(rec.result, list)


def check_subagents(backend):
    topics = ["Paris", "Tokyo", "Lima"]
    st = subagents.research.run(topics=topics, backend=backend)
    assert len(st["findings"]) == 3 and all(isinstance(f, str) for f in st["findings"])
    assert all(1 <= n <= 2 for n in st["steps"])
    assert "\n" not in st["summary"]
    # a finding is the sub-agent's answer after its lookup, which the grammar lets be empty ('[]'
    # then no text); the demo shows the summary, which must not be
    _shown(st["summary"], "summary")


def check_mcp_agent(backend):
    with mcp_agent.server() as srv:
        st = mcp_agent.mcp_agent.run(question="What is the capital of Peru?", tools=list(srv.tools),
                                     backend=backend)
        _check_agent_run(st, "answer", {t.name for t in srv.tools})


TOOL_CASES = {"calculator_agent", "sqlite_agent", "subagents", "mcp_agent"}


def _needs_tools(name, fn):
    """A tool-calling case on a backend that declares no tool calls: the run must fail loudly
    (CapabilityError naming tool calls) before any request, never drop the constraint."""
    if name not in TOOL_CASES:
        return fn

    def case(backend):
        if getattr(backend.capabilities, "tools", False):
            return fn(backend)
        from structgen.errors import CapabilityError
        with pytest.raises(CapabilityError, match="tool calls"):
            fn(backend)
    case.__name__ = fn.__name__
    return case


CASES = {name[len("check_"):]: _needs_tools(name[len("check_"):], fn)
         for name, fn in dict(globals()).items() if name.startswith("check_")}


def run_suite_case(name: str, backend) -> None:
    CASES[name](backend)
