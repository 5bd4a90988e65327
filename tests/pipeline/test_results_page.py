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
    plans = [run / "plan.json" if (run / "plan.json").is_file() else run / "seed-0" / "plan.json" for run in runs]
    assert {command_of(json.loads(plan.read_text())) for plan in plans} == commands  # earlier runs and seeds too
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
    """pyserini's 2CR: a README command's figures, and a checker that says whether a user's run agrees: each figure's
    difference from the record within what both runs' spread allows, and the budget kept (the report's band)."""
    code = {"version": "0.1.0", "commit": "f" * 40, "dirty": False}
    records = tmp_path / "docs" / "runs"
    _checked(records / "default", 51.0, 0.98, code)
    _run(records / "other", "realm pipeline --qa-set nq", 2.0, None)
    args = ["results", "--check", "--against", str(records)]
    assert main([*args, str(_checked(tmp_path / "mine", 49.5, 0.97))]) == 0
    out = capsys.readouterr().out
    assert "against " + str(records / "default") in out and "code fffffff" in out
    # +-3 each: the difference may be 1.96 * sqrt(2) * 3 / 1.96 = 4.24 either way
    hybrid = r"exact match, hybrid +49\.50 +recorded 51\.00; difference -1\.50 \[-5\.74, \+2\.74\], both runs' intervals +agrees"
    assert re.search(hybrid, out), out
    assert out.rstrip().endswith(
        "agrees: the budget kept, and each of 2 figures within what the runs' spread allows (95%)"
    )
    assert main([*args, str(_checked(tmp_path / "on_time", 51.0, 1.04))]) == 0  # within the report's band (1.05)
    capsys.readouterr()
    assert main([*args, str(_checked(tmp_path / "low", 45.0, 1.08))]) == 1
    out = capsys.readouterr().out
    assert "does not agree: minutes taken of 50 54.00, expected 45.00 to 52.50 (recorded 49.00); " in out
    assert "exact match, hybrid 45.00, expected recorded 51.00; difference -6.00 [-10.24, -1.76]" in out
    assert main([*args, str(_run(tmp_path / "wq", "realm pipeline --qa-set wq", 20.0, None))]) == 2
    err = capsys.readouterr().err
    assert (
        err.startswith("realm: error: no record of `realm pipeline --qa-set wq` under ") and "recorded commands" in err
    )


def test_a_rerun_is_paired_with_its_record_on_the_questions_both_answered(tmp_path, capsys):
    """Where both records keep each question's outcome, the check pairs them on the dev questions both answered (a
    rerun's clock may answer fewer): a rerun that gets the shared questions right as often agrees, however its
    overall figure compares; one that loses ten points on them does not, though both intervals overlap."""

    def with_outcomes(run: Path, rows: list[int], correct: set[int]) -> Path:
        record = json.loads((run / "stages" / "eval.json").read_text())
        marks = "".join("1" if row in correct else "0" for row in rows)
        record["result"]["outcomes"] = {"rows": rows, "hybrid": marks, "dense": marks, "bm25": marks}
        em = 100 * len(correct & set(rows)) / len(rows)
        record["result"]["hybrid"] = {"exact_match": em, "exact_match_95ci": [em - 3, em + 3]}
        (run / "stages" / "eval.json").write_text(json.dumps(record))
        return run

    records = tmp_path / "docs" / "runs"
    right = set(range(0, 900, 2))  # every other question: 50%
    with_outcomes(_checked(records / "default", 50.0, 0.98), list(range(900)), right)
    args = ["results", "--check", "--against", str(records)]
    same = with_outcomes(_checked(tmp_path / "same", 0.0, 0.97), list(range(600)), right)
    assert main([*args, str(same)]) == 0
    out = capsys.readouterr().out
    assert "difference +0.00 [+0.00, +0.00], paired over 600" in out
    worse = with_outcomes(_checked(tmp_path / "worse", 0.0, 0.97), list(range(600)), right - set(range(0, 120, 2)))
    assert main([*args, str(worse)]) == 1  # 60 of its 600 lost: -10 points, paired
    assert re.search(
        r"exact match, hybrid +40\.00 +recorded 50\.00; difference -10\.00 \[-1\d\.\d\d, -\d\.\d\d\], paired over 600",
        capsys.readouterr().out,
    )


def test_a_rerun_is_checked_against_the_spread_of_a_seeds_record(tmp_path, capsys):
    """Where the record of a command is a seeds folder (`realm pipeline --seeds N`), a rerun agrees when each figure
    falls where one more run of the recipe should (the t prediction interval over the seeds), and the seeds' own
    options do not make it another command."""
    from realm.pipeline.seeds import summarise_seeds, write_seeds

    records = tmp_path / "docs" / "runs"
    seeds = [_checked(records / "default_seeds" / f"seed-{k}", em, 0.98) for k, em in enumerate((50.0, 52.0, 54.0))]
    for k, run in enumerate(seeds):
        plan = json.loads((run / "plan.json").read_text())
        plan["options"]["command"] = f"realm pipeline --seeds 3 --run-dir runs/s/seed-{k}"
        (run / "plan.json").write_text(json.dumps(plan))
    write_seeds(records / "default_seeds", summarise_seeds(seeds), "realm pipeline --seeds 3")
    args = ["results", "--check", "--against", str(records)]
    assert main([*args, str(_checked(tmp_path / "mine", 49.0, 0.97))]) == 0
    out = capsys.readouterr().out
    assert "against the seeds of " + str(records / "default_seeds") in out
    # 52 +- 4.303 * 2 * sqrt(1 + 1/3): one more run of the recipe
    assert re.search(
        r"exact match, hybrid +49\.00 +42\.06 to 61\.94 \(one more run of the seeds' recipe; their mean 52\.00\) +agrees",
        out,
    )
    assert main([*args, str(_checked(tmp_path / "low", 40.0, 0.97))]) == 1


def test_a_seeds_folder_is_a_row_per_seed_and_its_figures_over_the_seeds(tmp_path):
    """`realm pipeline --seeds 3`'s folder on the page: each seed's run a row of its command's table (the seed's
    options do not make it another command), then each figure's values by seed, mean and intervals over the seeds;
    the copies regenerate the page."""
    from realm.pipeline.seeds import summarise_seeds, write_seeds

    folder = tmp_path / "runs" / "seeds30"
    command = "realm pipeline --budget-minutes 30"
    seeds = []
    for k, em in enumerate((50.0, 52.0, 54.0)):
        run = _run(folder / f"seed-{k}", f"realm pipeline --seeds 3 --budget-minutes 30 --run-dir r/seed-{k}", em, None)
        seeds.append(run)
    write_seeds(folder, summarise_seeds(seeds), "realm pipeline --seeds 3 --budget-minutes 30")
    single = _run(tmp_path / "runs" / "one", command, 51.0, None)
    out = tmp_path / "docs" / "results.md"
    assert main(["results", str(single), str(folder), "--out", str(out)]) == 0
    page = out.read_text()
    assert page.count(f"## `{command}`") == 1
    for k in range(3):
        assert f"[seeds30/seed-{k}](runs/seeds30/seed-{k}/results.md)" in page
    assert "| exact match, hybrid | 50.00, 52.00, 54.00 | 52.00 [47.03, 56.97] | [42.06, 61.94] |" in page
    assert (out.parent / "runs" / "seeds30" / "seeds.json").is_file()
    again = tmp_path / "again.md"
    write_results_page(sorted((out.parent / "runs").iterdir()), again)
    assert again.read_text().split("\n", 3)[3] == page.split("\n", 3)[3]


def test_an_ablations_run_puts_table_2_on_the_page_from_its_records_alone(tmp_path):
    """Each arm's paired figures are written into the stage records that measure them, so the page (from the copies of
    plan.json and stages/*.json alone) shows Table 2: recall@5 and the masked-LM gain per arm, and exact match."""
    run = _run(tmp_path / "runs" / "ab", "realm pipeline --ablations --budget-minutes 120", 50.0, None)
    plan = json.loads((run / "plan.json").read_text())
    plan["options"]["ablations"] = True
    plan["preset"] = {"pretrain": {"doc_tower": "fixed"}, "ict": {"steps": 0}}
    (run / "plan.json").write_text(json.dumps(plan))

    def paired(ours: float, other: float, items: int) -> dict:
        return {"ours": ours, "other": other, "difference": ours - other, "low": -1.0, "high": 2.5, "items": items}

    eval_record = json.loads((run / "stages" / "eval.json").read_text())
    eval_record["result"] |= {
        "zero_shot/off-the-shelf": {"recall@5": 76.5},
        "zero_shot/REALM": {"recall@5": 76.8},
        "realm_vs_start": {"start": "off-the-shelf", "recall@5": {"difference": 0.3, "difference_95ci": [-0.1, 0.7]}},
    }
    eval_record["result"]["questions"]["dev"] = 1496
    (run / "stages" / "eval.json").write_text(json.dumps(eval_record))
    records = {
        "measure_uniform": {"paired": {"recall@5": paired(76.8, 76.0, 1496), "masked_lm_gain": paired(0.4, 0.1, 700)}},
        "arms_eval": {"paired": {"qa_ict": paired(45.0, 44.0, 600), "qa_uniform": paired(45.0, 43.0, 600)}},
    }  # the document tower and index arms without exact match: dashes
    for name, result in records.items():
        record = {"name": name, "seconds": 60.0, "finished": 1795827714.0, "result": result}
        (run / "stages" / f"{name}.json").write_text(json.dumps(record))
    out = tmp_path / "docs" / "results.md"
    assert main(["results", str(run), "--out", str(out)]) == 0
    page = out.read_text()
    assert "**Table 2 in miniature** (ab)" in page
    assert (
        "| retriever | REALM-pretrained retriever vs warm-start retriever (no ICT) (no REALM), REALM's reader | 76.80 | 76.50 | +0.30 [-0.10, +0.70] | – | – | – | 1496 | – |"
        in page
    )
    assert (
        "| masking | salient-span masking vs random uniform masking | 76.80 | 76.00 | +0.80 [-1.00, +2.50] | 0.40 | 0.10 | +0.30 [-1.00, +2.50] | 1496 | 700 |"
        in page
    )
    assert "| masking | salient-span masking vs random uniform masking | 45.00 | 43.00 | 2.00 | [-1.0, +2.5] |" in page
    assert "| index | refreshed index (document tower trained) vs frozen (stale) index | – |" in page


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
