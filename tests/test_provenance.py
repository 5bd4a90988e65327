"""Which code computed a run (common/provenance.py): the commit of the checkout the package runs from, and whether
the code differed from it."""

from __future__ import annotations

import subprocess
from pathlib import Path

from realm.common.provenance import describe_code, describe_commit


def _git(folder: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(folder), *args], capture_output=True, text=True, check=True).stdout.strip()


def test_a_checkouts_commit_and_its_changes(tmp_path):
    package = tmp_path / "clone" / "src" / "realm"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (tmp_path / "clone" / "README.md").write_text("x\n")
    _git(tmp_path / "clone", "init", "-q")
    _git(tmp_path / "clone", "add", ".")
    _git(tmp_path / "clone", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "first")
    head = _git(tmp_path / "clone", "rev-parse", "HEAD")
    assert describe_code(package) | {"version": None} == {"version": None, "commit": head, "dirty": False}
    (tmp_path / "clone" / "runs").mkdir()  # untracked outputs beside the code are not changes
    (tmp_path / "clone" / "runs" / "plan.json").write_text("{}")
    assert describe_code(package)["dirty"] is False
    (package / "new.py").write_text("")  # code the commit does not hold
    assert describe_code(package)["dirty"] is True
    (package / "new.py").unlink()
    (tmp_path / "clone" / "README.md").write_text("changed\n")
    code = describe_code(package)
    assert code["dirty"] is True and describe_commit(code) == head[:7] + " + changes"


def test_a_package_outside_its_own_checkout_has_no_commit(tmp_path):
    other = tmp_path / "project"  # a venv's site-packages inside someone else's repository
    (other / "venv" / "realm").mkdir(parents=True)
    _git(other, "init", "-q")
    code = describe_code(other / "venv" / "realm")
    assert code["commit"] is None and describe_commit(code).endswith("not from a git checkout")
    assert describe_commit(None) == "not recorded"
