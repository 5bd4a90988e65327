"""A base revision checked out beside this tree, for benchmarks that compare the two side by side."""

from __future__ import annotations

import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@contextmanager
def base_worktree(revision: str) -> Iterator[Path]:
    """`revision` in a temporary git worktree (its root), removed afterwards; a folder holding a revision's files
    (`git archive`, for a machine without the repository's history) is used as it is."""
    if Path(revision, "src").is_dir():
        yield Path(revision)
        return
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "base"
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "add", "--quiet", "--detach", str(tree), revision], check=True
        )
        try:
            yield tree
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], check=True)


def revision_name(revision: str) -> str:
    """How a base is named in a table: its revision, also for a folder of its files that records it (REVISION)."""
    recorded = Path(revision, "REVISION")
    return recorded.read_text().strip() if recorded.is_file() else revision
