"""The DSL on the real embedded model (SmolLM2-135M on CPU): gen(grammar=...), and issue 13
item 3's reproduction (one bad option among co-scheduled sequences).

Structure only, never model knowledge: grammar outputs are parsed with lark; batch items
are checked for completion and error type.
"""

from __future__ import annotations

import threading

import lark
import pytest

import structgen as sg
from tests.lang.deadline import within

pytestmark = pytest.mark.model

#: at most 72 characters, so 80 tokens always complete it
GRAMMAR = '''start: "[" pair (", " pair)~0..3 "]"
pair: KEY "=" value
value: NUMBER | "yes" | "no" | "(" NUMBER "+" NUMBER ")"
KEY: /[a-z]{1,6}/
NUMBER: /[0-9]{1,3}/
'''


def test_gen_grammar_output_fully_matches_the_grammar(embedded_backend):
    parser = lark.Lark(GRAMMAR, start="start")

    @sg.program
    def settings(s, topic):
        s += sg.user(f"Write a few settings for {topic} as [key=value, ...].")
        s += sg.assistant(sg.gen("cfg", grammar=GRAMMAR, max_tokens=80, temperature=0.8))

    states = settings.run_batch([{"topic": t, "seed": i} for i, t in enumerate(["a lamp", "a boat", "a game"])],
                                backend=embedded_backend)
    for st in states:
        assert st.error() is None, st.error()
        parser.parse(st["cfg"])  # raises if the output is not a sentence of the grammar


def test_one_bad_option_fails_only_its_own_item_among_co_scheduled_sequences(embedded_backend):
    """Issue 13 item 3: eleven items at max_tokens=24, one at 24.5, and three concurrent runs
    (JSON-constrained: where the engine drafts forced text, 24.5 broke every co-scheduled
    sequence with a TypeError)."""
    schema = {"type": "object", "properties": {"legs": {"type": "integer"}, "eyes": {"type": "integer"}},
              "required": ["legs", "eyes"]}

    @sg.program
    def p(s, i):
        s += f"How many legs has a spider? Attempt {i}, as JSON: " + sg.gen("out", json_schema=schema)

    items = [{"i": i, "max_tokens": 24} for i in range(11)] + [{"i": 11, "max_tokens": 24.5}]
    beside: list[sg.ProgramState | sg.StructgenError] = []

    def concurrent(i: int) -> None:
        try:
            beside.append(p.run(i=100 + i, max_tokens=24, backend=embedded_backend))
        except sg.StructgenError as exc:
            beside.append(exc)

    def scenario():
        threads = [threading.Thread(target=concurrent, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
        states = p.run_batch(items, backend=embedded_backend)
        for t in threads:
            t.join()
        return states

    def isolated(err: sg.StructgenError | None) -> bool:
        """Done, or failed on its own output (a number the model ran past max_tokens)."""
        return err is None or (isinstance(err, sg.OutputValidationError) and err.truncated)

    states = within(300, scenario)
    errors = [st.error() for st in states[:11]]
    assert all(isolated(e) for e in errors) and None in errors, errors
    err = states[11].error()
    assert isinstance(err, sg.OptionError) and err.option == "max_tokens", err
    assert len(beside) == 3 and all(isolated(st.error() if isinstance(st, sg.ProgramState) else st)
                                    for st in beside), beside
