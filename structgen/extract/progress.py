"""What a running job shows: a rich progress bar (docs/s, tokens/s, prefix-cache hit
rate, errors, ETA) on stderr, and the summary table at the end.

:class:`Progress` is driven by the job after each record; ``quiet`` shows nothing. rich
is imported only here, only when a bar or table is shown.
"""

from __future__ import annotations

from typing import Any, TextIO

from structgen.extract.summary import Stats

__all__ = ["Progress", "summary_table"]


class Progress:
    """A live bar over ``stats``; ``update()`` after each record, ``close()`` at the end."""

    def __init__(self, stats: Stats, *, quiet: bool = False, file: TextIO | None = None,
                 refresh_per_second: float = 4.0):
        self.stats = stats
        self.quiet = quiet
        self._bar: Any = None
        self._task: Any = None
        if quiet:
            return
        import sys

        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn
        from rich.progress import Progress as RichProgress

        console = Console(file=file or sys.stderr)
        self._bar = RichProgress(
            TextColumn("[bold]extract"), BarColumn(), MofNCompleteColumn(),
            TextColumn("{task.fields[rates]}"), TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
            console=console, refresh_per_second=refresh_per_second, transient=False)
        self._task = self._bar.add_task("extract", total=stats.total, rates="")
        self._bar.start()

    def update(self) -> None:
        if self._bar is None:
            return
        s = self.stats
        rates = (f"{s.docs_per_s():.2f} docs/s  {s.tokens_per_s():.0f} tok/s  "
                 f"cache {s.cache_hit_rate():.0%}  errors {s.errors}")
        self._bar.update(self._task, completed=s.records, total=s.total, rates=rates)

    def close(self) -> None:
        if self._bar is not None:
            self.update()
            self._bar.stop()
            self._bar = None


def summary_table(stats: Stats, file: TextIO | None = None, max_fields: int = 40) -> None:
    """Print the end-of-job summary (records, valid, failures by type, fill rates)."""
    import sys

    from rich.console import Console
    from rich.table import Table

    console = Console(file=file or sys.stderr)
    d = stats.to_dict()
    t = Table(title="structgen extract", show_header=False)
    t.add_column("what")
    t.add_column("value", justify="right")
    t.add_row("records", str(d["records"]))
    t.add_row("valid", f"{d['valid']} ({d['valid'] / d['records']:.1%})" if d["records"] else "0")
    for name, n in d["failed_by_type"].items():
        t.add_row(f"failed: {name}", str(n))
    t.add_row("resumed from the journal", str(d["resumed"]))
    t.add_row("docs/s (run now)", f"{d['docs_per_s']:.2f}")
    t.add_row("generated tokens/s", f"{d['tokens_per_s']:.0f}")
    t.add_row("prefix-cache hit rate", f"{d['prefix_cache_hit_rate']:.1%}")
    console.print(t)
    fills = list(d["fill_rate"].items())
    if fills:
        f = Table(title="field fill rate (valid records with a value)")
        f.add_column("field")
        f.add_column("filled", justify="right")
        for path, rate in fills[:max_fields]:
            f.add_row(path, f"{rate:.0%}")
        if len(fills) > max_fields:
            f.add_row(f"... {len(fills) - max_fields} more (see the summary JSON)", "")
        console.print(f)
