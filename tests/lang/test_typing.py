"""``@program`` keeps the program's signature for type checkers (ParamSpec): mypy, run on a
small user script, reports a wrong argument name or type in ``f.run(...)`` / ``f(...)``."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent('''
    import structgen as sg

    @sg.program
    def greet(s: sg.ProgramState, name: str, times: int = 1) -> None:
        s += "Hello " + name + sg.gen("reply", max_tokens=8)

    @sg.function(max_tokens=32)
    def untyped(s, question):
        s += question + sg.gen("answer")

    ok1: sg.ProgramState = greet.run(name="Ada", times=2)
    ok2: sg.ProgramState = greet("Ada")
    ok3 = greet.with_options(temperature=0.2, max_tokens=16, backend="fake").run(name="Ada")
    ok4 = untyped.run(question="Why?")
    ok5: list[sg.ProgramState] = greet.run_batch([{"name": "Ada"}])

    async def main() -> sg.ProgramState:
        return await greet.arun("Ada", times=3)

    greet.run(nam="Ada")  # BAD: unknown argument name
    greet.run(name=3)  # BAD: wrong type
    greet("Ada", times="two")  # BAD: wrong type
    untyped.run(questin="Why?")  # BAD: unknown argument name
    greet.with_options(temprature=0.2)  # BAD: unknown option
    greet.with_options(max_tokens=2.5)  # BAD: wrong option type
''')


def test_mypy_reports_wrong_argument_names_and_types_in_program_calls(tmp_path):
    script = tmp_path / "user_program.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "MYPYPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "mypy", "--no-error-summary", "--follow-imports=silent",
                           "--cache-dir", str(tmp_path / "cache"), "--python-version", "3.11", str(script)],
                          capture_output=True, text=True, cwd=tmp_path, env=env, timeout=600, check=False)
    errors = {int(m.group(1)): m.group(2) for m in re.finditer(r"user_program\.py:(\d+): error: (.*)", proc.stdout)}
    lines = SCRIPT.splitlines()
    bad = {i + 1 for i, line in enumerate(lines) if "# BAD" in line}
    assert set(errors) == bad, proc.stdout + proc.stderr
    assert "nam" in errors[min(bad)] and "questin" in errors[sorted(bad)[3]]
    assert "temprature" in errors[sorted(bad)[4]]
