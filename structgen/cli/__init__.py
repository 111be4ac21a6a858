"""The ``structgen`` command line (``structgen extract``, ``run``, ``schemas``); also
``python -m structgen``. Importing :mod:`structgen` does not import it."""

from __future__ import annotations

from typing import Any

__all__ = ["main"]


def main(argv: list[str] | None = None) -> Any:
    from structgen.cli.main import main as _main

    return _main(argv)
