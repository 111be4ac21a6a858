"""The ``structgen`` command: ``extract``, ``run`` and ``schemas`` (typer).

Each command lives in its own module; this one builds the app and maps structgen's
errors to a one-line message and exit status 2 (bad input, schema or backend), never a
traceback.
"""

from __future__ import annotations

import sys
from typing import Any

import typer

from structgen.cli.extract_cmd import extract_command
from structgen.cli.run_cmd import run_command
from structgen.cli.schemas_cmd import schemas_command
from structgen.errors import StructgenError

__all__ = ["app", "main"]

app = typer.Typer(
    name="structgen",
    help="Structured LLM programs and batch JSON extraction.\n\n"
         "Extract validated JSON records from documents with a schema (`structgen extract`), "
         "run a structgen program (`structgen run`), or list the bundled schemas (`structgen schemas`).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="markdown",
)
app.command("extract", no_args_is_help=True)(extract_command)
app.command("run", no_args_is_help=True)(run_command)
app.command("schemas")(schemas_command)


def main(argv: list[str] | None = None) -> Any:
    """Console-script entry point."""
    try:
        return app(args=argv, standalone_mode=True)
    except StructgenError as exc:
        print(f"structgen: error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    except KeyboardInterrupt:
        print("structgen: interrupted (finished records are kept; run the same command to resume)",
              file=sys.stderr)
        raise SystemExit(130) from None
