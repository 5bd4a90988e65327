"""The typed stage records (pipeline/records.py) have one JSON form: every archived run reads and writes back the
same JSON, and a record from before a field reads with that field empty."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from realm.eval.mlm import MaskedLMScore
from realm.eval.qa import PairedScore, QAScore
from realm.pipeline.records import EvalRecord, ExamplesRecord, Outcomes, QAStart

RUNS = Path(__file__).resolve().parents[2] / "docs" / "runs"
TYPED = {"eval": EvalRecord, "examples": ExamplesRecord, "qa_start": QAStart}


def _archived() -> list[Path]:
    return sorted(path for path in RUNS.rglob("stages/*.json") if path.stem in TYPED)


@pytest.mark.parametrize("path", _archived(), ids=lambda p: str(p.relative_to(RUNS)))
def test_every_archived_record_reads_and_writes_back_the_same_json(path):
    result = json.loads(path.read_text())["result"]
    assert TYPED[path.stem].from_dict(result).to_dict() == result


def test_the_archive_has_records_of_every_typed_stage():
    assert {path.stem for path in _archived()} == set(TYPED)


def test_an_evaluation_reads_by_field():
    path = RUNS / "default" / "stages" / "eval.json"
    record = EvalRecord.from_dict(json.loads(path.read_text())["result"])
    assert record.hybrid.exact_match == 56.52 and record.hybrid.interval == (53.36, 59.49)
    assert record.hybrid.recall[5] == 92.79 and record.hybrid.outcomes["retrieved_not_read"] == 21.54
    assert record.answered.evaluated == 1012 and record.answered.dev == 1496 and not record.answered.all_answered
    assert record.realm_vs_start is not None and record.realm_vs_start.start == "off-the-shelf"
    assert record.realm_vs_start.recall[5].difference == 0.27
    assert record.zero_shot["REALM"][5] == 76.8 and record.question_set == "squad-open-dev"
    assert record.paired["hybrid - dense"].difference == 11.36


def test_a_record_from_before_a_field_reads_it_as_empty():
    old = EvalRecord.from_dict({"dense": {"exact_match": 30.0, "questions": 12}, "hybrid": {"exact_match": 35.0}})
    assert old.dense.interval is None and old.hybrid.recall == {} and old.outcomes is None
    assert old.answered.evaluated == 12 and old.answered.all_answered  # before the plan sampled dev: all of it
    assert old.realm_vs_start is None and old.coverage is None and old.paired == {}
    assert QAScore.from_dict({"exact_match": 30.0}).to_dict() == {"exact_match": 30.0}
    scored = MaskedLMScore.from_dict({"retrieval_gain": 0.5, "retrieval_gain_95ci": [0.1, 0.9], "sentences": 40})
    assert scored.per_sentence_gain is None and scored.by_recoverability == {}
    assert ExamplesRecord.from_dict({"with_retrieval": scored.to_dict()}).all_scored


def test_outcomes_give_each_systems_exact_match_by_dev_row():
    outcomes = Outcomes.from_dict({"rows": [3, 7, 9], "dense": "101", "hybrid": "011"})
    assert outcomes.exact_match_by_row("dense") == {3: 100.0, 7: 0.0, 9: 100.0}
    assert outcomes.exact_match_by_row("bm25") is None
    assert outcomes.to_dict() == {"rows": [3, 7, 9], "dense": "101", "hybrid": "011"}


def test_a_paired_score_is_compare_predictions_form():
    form = {"exact_match_a": 60.0, "exact_match_b": 30.0, "difference": 30.0, "difference_95ci": [20.0, 40.0]}
    paired = PairedScore.from_dict(form | {"questions": 100})
    assert paired.interval == (20.0, 40.0) and paired.to_dict() == form | {"questions": 100}
