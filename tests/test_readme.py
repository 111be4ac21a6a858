"""Every ```python block of README.md runs as written (on the real embedded model).

Each block runs in a fresh namespace from the repository root, so it must stand alone,
unless the comment ``<!-- readme-test: chain NAME -->`` right above it puts it in a chain:
the blocks of one chain run in order in one namespace (a later example building on an
earlier one). A block that needs something a test cannot start here is marked
``<!-- readme-test: needs ... -->`` and skipped with that reason. Runs that name no backend
use the session's embedded model.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import structgen as sg

pytestmark = pytest.mark.model

README = Path(__file__).resolve().parents[1] / "README.md"
_FENCE = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
_MARK = re.compile(r"<!--\s*readme-test:\s*(.*?)\s*-->\s*$")


@dataclass
class Chain:
    """Blocks that run in one namespace, in order (one block unless marked ``chain NAME``)."""

    line: int
    blocks: list[str] = field(default_factory=list)
    needs: str | None = None


def readme_chains(text: str) -> list[Chain]:
    chains: list[Chain] = []
    named: dict[str, Chain] = {}
    for m in _FENCE.finditer(text):
        line = text.count("\n", 0, m.start()) + 1
        before = text[:m.start()].rstrip("\n").rsplit("\n", 1)[-1]
        mark = _MARK.search(before)
        note = mark.group(1) if mark else None
        if note and note.startswith("chain "):
            name = note.removeprefix("chain ").strip()
            if name in named:
                named[name].blocks.append(m.group(1))
                continue
            named[name] = Chain(line, [m.group(1)])
            chains.append(named[name])
            continue
        chains.append(Chain(line, [m.group(1)], note))
    return chains


CHAINS = readme_chains(README.read_text())


def test_the_readme_has_python_blocks_and_marks_that_parse():
    assert len(CHAINS) >= 4
    fences = sum(line.strip() == "```python" for line in README.read_text().splitlines())
    assert sum(len(c.blocks) for c in CHAINS) == fences  # every python block runs (or skips with a reason)
    marks = re.findall(r"<!--\s*readme-test:\s*(.*?)\s*-->", README.read_text())
    assert all(m.startswith(("chain ", "needs ")) for m in marks), marks


@pytest.fixture
def default_embedded(embedded_backend):
    sg.set_default_backend(embedded_backend)
    yield embedded_backend
    sg.set_default_backend(None)


@pytest.mark.parametrize("chain", CHAINS, ids=[f"README.md:{c.line}" for c in CHAINS])
def test_readme_block_runs_as_written(chain: Chain, default_embedded, monkeypatch):
    monkeypatch.chdir(README.parent)  # paths in the README are relative to the repository root
    if chain.needs:
        pytest.skip(f"README.md:{chain.line} {chain.needs}")
    namespace: dict[str, object] = {"__name__": "__readme__"}
    for i, block in enumerate(chain.blocks):
        code = compile(block, f"README.md:{chain.line} (block {i + 1} of the chain)", "exec")
        exec(code, namespace)


def test_chain_and_needs_marks_are_read():
    text = ("<!-- readme-test: chain p -->\n```python\na = 1\n```\n```python\nx = 1\n```\n"
            "<!-- readme-test: chain p -->\n```python\nb = a\n```\n"
            "<!-- readme-test: needs a server -->\n```python\nc = 1\n```\n")
    chains = readme_chains(text)
    assert [(c.blocks, c.needs) for c in chains] == [(["a = 1\n", "b = a\n"], None), (["x = 1\n"], None),
                                                      (["c = 1\n"], "needs a server")]
