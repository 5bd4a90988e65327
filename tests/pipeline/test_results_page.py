"""docs/results.md is generated from run records (pipeline/results_page.py), and the README's table agrees with it."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from realm.cli.main import main
from realm.pipeline.results_page import command_of, write_results_page

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"


def _run(folder: Path, command: str, em: float, machine: dict | None, code: dict | None = None) -> Path:
    (folder / "stages").mkdir(parents=True)
    plan = {"options": {"command": command}, "budget_minutes": 50.0, "compute_dtype": "float32", "machine": machine}
    plan |= {"code": code} if code else {}
    (folder / "plan.json").write_text(json.dumps(plan))
    hybrid = {"exact_match": em, "exact_match_95ci": [em - 3, em + 3]}
    records = {
        "realm": {"steps": 600},
        "qa": {"train": {"steps": 500}},
        "eval": {
            "questions": {"evaluated": 900, "dev": 1496, "seed": 0},
            "hybrid": hybrid,
            "dense": {"exact_match": 30.0},
            "bm25": {"exact_match": 35.0},
            "zero_shot/REALM": {"recall@5": 76.0},
        },
        "realm_index": {"reused_from": str(folder.resolve() / "baseline_index" / "index" / "versions" / "v000001")},
    }
    for name, result in records.items():
        record = {"name": name, "seconds": 600.0, "finished": 1795827714.0, "result": result}
        (folder / "stages" / f"{name}.json").write_text(json.dumps(record))
    return folder


def test_runs_of_one_command_share_a_table_and_their_records_travel_with_the_page(tmp_path):
    machine = {"cpu": "AMD EPYC", "cores": 2, "cpu_bf16_matmul": False, "gpu": None, "torch": "2"}
    command = "realm pipeline --inputs c.jsonl --qa-train t.jsonl --qa-dev d.jsonl --budget-minutes 50"
    code = {"version": "0.1.0", "commit": "0123456789abcdef" * 2 + "01234567", "dirty": True}
    first = _run(tmp_path / "runs" / "a", f"{command} --run-dir runs/a --quiet", 40.0, machine, code)
    second = _run(tmp_path / "runs" / "b", f"realm pipeline --run-dir runs/b {command[15:]}", 41.5, None)
    assert command_of(json.loads((first / "plan.json").read_text())) == command
    out = tmp_path / "docs" / "results.md"
    assert main(["results", str(first), str(second), "--out", str(out)]) == 0
    page = out.read_text()
    assert page.count(f"## `{command}`") == 1  # one table, a row per run
    assert "| 2-core AMD EPYC, no bf16; computed in float32 | 0123456 + changes | 2026-11-2" in page
    assert "| 40.0 [37.0, 43.0] |" in page and "| 41.5 [38.5, 44.5] |" in page
    assert "| not recorded (float32) | not recorded |" in page and "[b](runs/b/results.md)" in page
    copied = out.parent / "runs" / "a" / "stages" / "realm_index.json"
    assert json.loads(copied.read_text())["result"]["reused_from"] == "baseline_index/index/versions/v000001"
    assert str(tmp_path) not in "".join(p.read_text() for p in (out.parent / "runs").rglob("*.json"))
    # the page regenerates from its own copies alone
    again = tmp_path / "again.md"
    write_results_page(sorted((out.parent / "runs").iterdir()), again)
    assert again.read_text().split("\n", 3)[3] == page.split("\n", 3)[3]


def test_docs_results_regenerates_from_the_committed_records_and_the_readme_agrees(tmp_path):
    runs = sorted((DOCS / "runs").iterdir())
    out = tmp_path / "results.md"
    write_results_page(runs, out)
    assert out.read_text().replace(str(tmp_path), "docs") == (DOCS / "results.md").read_text()
    readme = (ROOT / "README.md").read_text()
    table = readme.split("## What today's commands give")[1].split("\n## ")[0]
    rows = [line for line in table.splitlines() if line.startswith("| `realm")]
    commands = {re.match(r"\| `([^`]+)`", row)[1] for row in rows}  # type: ignore[index]
    assert {command_of(json.loads((run / "plan.json").read_text())) for run in runs} == commands  # earlier runs too
    for row in rows:
        figure = re.search(r"[+-]?\d+\.\d+ \[[+-]?\d+\.\d+, [+-]?\d+\.\d+\]", row)
        record = re.search(r"\]\((docs/runs/[^)]+)\)", row)
        assert figure and figure[0] in (DOCS / "results.md").read_text(), row
        assert record and (ROOT / record[1]).is_file(), row


def _checked(folder: Path, em: float, share: float, code: dict | None = None) -> Path:
    """A finished run of the bare command: its budget share, EM with an interval of +-3, a recall gain."""
    run = _run(folder, "realm pipeline", em, {"cpu": "AMD EPYC", "cores": 2, "cpu_bf16_matmul": False, "gpu": None})
    plan = json.loads((run / "plan.json").read_text())
    plan |= {"began": 1795827714.0 - share * 50 * 60, "code": code}
    (run / "plan.json").write_text(json.dumps(plan))
    record = json.loads((run / "stages" / "eval.json").read_text())
    gain = {"recall@5": {"difference": 0.1, "difference_95ci": [-0.3, 0.5]}}
    record["result"] |= {"realm_vs_start": {"start": "off-the-shelf", **gain}}
    (run / "stages" / "eval.json").write_text(json.dumps(record))
    return run


def test_a_rerun_is_checked_against_the_record_of_its_command(tmp_path, capsys):
    """pyserini's 2CR: a README command's figures, and a checker that says whether a user's run agrees: each figure
    within the recorded 95% interval, and the budget kept."""
    code = {"version": "0.1.0", "commit": "f" * 40, "dirty": False}
    records = tmp_path / "docs" / "runs"
    _checked(records / "default", 51.0, 0.98, code)
    _run(records / "other", "realm pipeline --qa-set nq", 2.0, None)
    args = ["results", "--check", "--against", str(records)]
    assert main([*args, str(_checked(tmp_path / "mine", 49.5, 0.97))]) == 0
    out = capsys.readouterr().out
    assert "against " + str(records / "default") in out and "code fffffff" in out
    assert re.search(r"exact match, hybrid +49\.50 +48\.00 to 54\.00 \(recorded 51\.00\) +agrees", out), out
    assert out.rstrip().endswith("agrees: the budget kept, and each of 2 figures within the recorded interval")
    assert main([*args, str(_checked(tmp_path / "low", 41.0, 1.02))]) == 1
    out = capsys.readouterr().out
    assert "does not agree: minutes taken of 50 51.00, expected at most 50.00 (recorded 49.00); " in out
    assert "exact match, hybrid 41.00, expected 48.00 to 54.00 (recorded 51.00)" in out
    assert main([*args, str(_run(tmp_path / "wq", "realm pipeline --qa-set wq", 20.0, None))]) == 2
    err = capsys.readouterr().err
    assert (
        err.startswith("realm: error: no record of `realm pipeline --qa-set wq` under ") and "recorded commands" in err
    )


def test_the_readme_rows_records_name_commits_this_history_holds():
    """Which code produced a README row: its record names the commit, and main's history holds that commit."""
    shallow = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--is-shallow-repository"], capture_output=True)
    if shallow.returncode or shallow.stdout.strip() != b"false":
        pytest.skip("not a whole git history (no checkout, or a shallow clone): the commits cannot be looked up")
    readme = (ROOT / "README.md").read_text()
    records = re.findall(r"\]\((docs/runs/[^)]+)/results\.md\)", readme.split("## What today's commands give")[1])
    assert records
    for record in records:
        code = json.loads((ROOT / record / "plan.json").read_text()).get("code") or {}
        assert code.get("commit") and code.get("dirty") is False, f"{record}: {code}"
        ancestor = subprocess.run(["git", "-C", str(ROOT), "merge-base", "--is-ancestor", code["commit"], "HEAD"])
        assert ancestor.returncode == 0, f"{record}: {code['commit']} is not in this history"
