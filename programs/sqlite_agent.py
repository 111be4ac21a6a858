"""An SQLite lookup agent: it creates its own database file, then answers from it.

The database (a small table of cities) is written to a fresh temporary directory. The
tools read it only: ``list_tables`` and ``query``, which runs one SELECT statement on a
read-only connection (anything else is an error result the model sees).
"""

from __future__ import annotations

import sqlite3
import tempfile
from pathlib import Path
from typing import Any

import structgen as sg

ROWS = [("Paris", "France", 2102650), ("Lyon", "France", 522250), ("Tokyo", "Japan", 13960000),
        ("Osaka", "Japan", 2753000), ("Nairobi", "Kenya", 4397073), ("Lima", "Peru", 10092000)]


def create_database(folder: str | None = None) -> Path:
    """Write the demo database into ``folder`` (a new temporary directory by default)."""
    path = Path(folder or tempfile.mkdtemp(prefix="structgen-sqlite-")) / "cities.db"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE IF NOT EXISTS cities (name TEXT PRIMARY KEY, country TEXT, population INTEGER)")
        db.executemany("INSERT OR REPLACE INTO cities VALUES (?, ?, ?)", ROWS)
    return path


def make_tools(path: Path) -> list[sg.Tool]:
    uri = f"file:{path}?mode=ro"

    @sg.tool
    def list_tables() -> dict[str, list[str]]:
        """The tables of the database and their columns."""
        with sqlite3.connect(uri, uri=True) as db:
            names = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")]
            return {n: [c[1] for c in db.execute(f"PRAGMA table_info({n})")] for n in names}

    @sg.tool
    def query(sql: str) -> list[list[Any]]:
        """Run one read-only SQL SELECT statement; at most 20 rows come back.

        Args:
            sql: for example "SELECT name FROM cities WHERE country = 'Japan'"
        """
        if not sql.lstrip().lower().startswith("select") or ";" in sql.strip().rstrip(";"):
            raise ValueError("only one SELECT statement is allowed")
        with sqlite3.connect(uri, uri=True) as db:
            return [list(r) for r in db.execute(sql).fetchmany(20)]

    return [list_tables, query]


@sg.program
def sqlite_agent(s, question, folder=None):
    path = create_database(folder)
    tools = make_tools(path)
    s += sg.use_tools(tools)
    s += sg.system("Answer questions about the database. Look at its tables, query it, then answer.")
    s += sg.user(question)
    sg.run_tools(s, tools, name="answer", max_steps=3, max_tokens=96)
    s["database"] = str(path)


if __name__ == "__main__":
    state = sqlite_agent.run(question="Which Japanese cities are in the database?")
    print(state.text())
