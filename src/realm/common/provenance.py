"""Which code computed a run, for its records: the package's version and, where the package runs from a git
checkout (a clone installed editable, as scripts/install.sh does), the commit and whether the code differed from it.
A figure without its commit cannot be reproduced or checked (`realm results --check`)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import realm

PACKAGE = Path(realm.__file__).resolve().parent


def _git(checkout: Path, *args: str) -> str | None:
    try:
        done = subprocess.run(["git", "-C", str(checkout), *args], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):  # no git on this machine
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def describe_code(package: Path = PACKAGE) -> dict:
    """{"version", "commit", "dirty"}: commit None where the package is not its checkout's `src/realm` (an
    installed wheel, or a checkout of some other project around it); dirty when a tracked file differs from the
    commit or an untracked file lies under src/ (code the commit does not hold)."""
    code: dict = {"version": realm.__version__, "commit": None, "dirty": None}
    top = _git(package, "rev-parse", "--show-toplevel")
    if top is None or (Path(top) / "src" / "realm").resolve() != package.resolve():
        return code
    commit = _git(package, "rev-parse", "HEAD")
    changed = _git(Path(top), "status", "--porcelain", "--untracked-files=no")
    untracked = _git(Path(top), "status", "--porcelain", "--untracked-files=all", "--", "src")
    if commit is None or changed is None or untracked is None:
        return code
    return {**code, "commit": commit, "dirty": bool(changed) or bool(untracked)}


def describe_commit(code: dict | None) -> str:
    """`abc1234`, `abc1234 + changes`, or why there is none, for a page."""
    if not code:
        return "not recorded"
    if code.get("commit") is None:
        return f"realm {code.get('version')}, not from a git checkout"
    noted = " (noted after the run)" if code.get("noted") else ""  # a record from before runs recorded their code
    return code["commit"][:7] + (" + changes" if code.get("dirty") else "") + noted
