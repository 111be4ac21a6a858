"""Where the shared data sets live: ``../shared`` next to the repository, never a fixed path.

``$STRUCTGEN_SHARED`` overrides it. In a git worktree, ``../shared`` is looked for next to
the worktree first, then next to its main checkout (the worktree's ``.git`` file names it).
Holds ``maskbench/``, ``bfcl/``, ``extract/``; tests and benchmarks that need a data set skip
or stop with a clear message when it is absent.
"""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def shared_dir(root: Path = ROOT) -> Path:
    """The shared data folder (it may not exist: callers check what they need in it)."""
    if env := os.environ.get("STRUCTGEN_SHARED"):
        return Path(env)
    candidates = [root.parent / "shared"]
    dotgit = root / ".git"
    if dotgit.is_file():  # a worktree: "gitdir: <main>/.git/worktrees/<name>"
        text = dotgit.read_text().strip()
        if text.startswith("gitdir:"):
            gitdir = Path(text.removeprefix("gitdir:").strip())
            if not gitdir.is_absolute():
                gitdir = (root / gitdir).resolve()
            if gitdir.parent.name == "worktrees":
                candidates.append(gitdir.parents[2].parent / "shared")
    return next((c for c in candidates if c.is_dir()), candidates[0])
