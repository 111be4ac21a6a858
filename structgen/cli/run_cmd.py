"""``structgen run file.py:program --arg k=v``: run one structgen program from a file and
print its variables as JSON."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from structgen.errors import InputError

__all__ = ["load_program", "parse_args", "run_command"]


def load_program(target: str) -> Any:
    """The program ``NAME`` of ``path/to/file.py:NAME`` (or ``pkg.module:NAME``)."""
    from structgen.lang.program import Program

    where, sep, name = target.rpartition(":")
    if not sep or not where or not name:
        raise InputError(f"expected FILE.py:PROGRAM or pkg.module:PROGRAM, got {target!r}")
    if where.endswith(".py"):
        path = Path(where)
        if not path.is_file():
            raise InputError("no such file", source=where)
        spec = importlib.util.spec_from_file_location(path.stem, path)
        if spec is None or spec.loader is None:
            raise InputError("cannot load as a module", source=where)
        module = importlib.util.module_from_spec(spec)
        sys.path.insert(0, str(path.resolve().parent))
        try:
            spec.loader.exec_module(module)
        finally:
            sys.path.pop(0)
    else:
        try:
            module = importlib.import_module(where)
        except ImportError as exc:
            raise InputError(f"cannot import {where!r}: {exc}") from exc
    prog = getattr(module, name, None)
    if not isinstance(prog, Program):
        raise InputError(f"{name!r} in {where} is {type(prog).__name__}, not a structgen @program")
    return prog


def parse_args(pairs: list[str]) -> dict[str, Any]:
    """``k=v`` pairs; a value that parses as JSON is taken as JSON, else as text."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise InputError(f"--arg takes KEY=VALUE, got {pair!r}")
        try:
            out[key] = json.loads(value)
        except ValueError:
            out[key] = value
    return out


def _plain(value: Any) -> Any:
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        return dump(mode="json")
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def run_command(
    target: Annotated[str, typer.Argument(help="`file.py:program` or `pkg.module:program`.")],
    arg: Annotated[list[str] | None, typer.Option("--arg", "-a", help="Program argument KEY=VALUE (repeat).")] = None,
    backend: Annotated[str, typer.Option("--backend", "-b", help="Backend name.")] = "embedded",
    url: Annotated[str | None, typer.Option("--url", help="Engine server URL.")] = None,
    model: Annotated[str | None, typer.Option("--model", "-m", help="Model path or served name.")] = None,
    text: Annotated[bool, typer.Option("--text", help="Also print the program's whole text.")] = False,
) -> None:
    """Run a structgen program once and print its variables (typed values) as JSON."""
    from structgen.extract.api import make_backend

    prog = load_program(target)
    kwargs = parse_args(arg or [])
    be = make_backend(backend, (url,) if url else (), model)
    try:
        state = prog.run(backend=be, **kwargs)  # a failed run raises its StructgenError
        out = {"values": _plain(state.values())}
        if text:
            out["text"] = state.text()
        typer.echo(json.dumps(out, ensure_ascii=False, indent=2))
    finally:
        be.close()
