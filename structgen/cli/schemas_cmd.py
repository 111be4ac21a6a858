"""``structgen schemas [NAME]``: list the bundled schemas, or show one (its JSON Schema,
its pydantic model's import path and its sample inputs)."""

from __future__ import annotations

from typing import Annotated

import typer

__all__ = ["schemas_command"]


def schemas_command(
    name: Annotated[str | None, typer.Argument(help="Show this schema (omit to list them all).")] = None,
    sample: Annotated[bool, typer.Option("--sample", help="Print the sample inputs (JSONL) instead.")] = False,
) -> None:
    """List the bundled schemas, or show one."""
    from rich.console import Console
    from rich.table import Table

    from structgen import schemas
    from structgen.errors import InputError

    console = Console()
    if name is None:
        t = Table(title="bundled schemas (use the name with --schema)")
        t.add_column("name")
        t.add_column("model")
        t.add_column("fields", justify="right")
        t.add_column("description")
        for n in schemas.names():
            m = schemas.model(n)
            t.add_row(n, f"structgen.schemas.{n}:{m.__name__}", str(len(m.model_fields)),
                      (m.__doc__ or "").strip().splitlines()[0])
        console.print(t)
        return
    if name not in schemas.BUNDLED:
        raise InputError(f"no bundled schema {name!r}; bundled: {', '.join(schemas.names())}")
    if sample:
        typer.echo(schemas.sample_path(name).read_text(encoding="utf-8"), nl=False)
        return
    m = schemas.model(name)
    typer.echo(f"# {name}: structgen.schemas.{name}:{m.__name__}  ({schemas.json_path(name)})")
    typer.echo(f"# samples: {schemas.sample_path(name)}")
    typer.echo(schemas.json_path(name).read_text(encoding="utf-8"), nl=False)
