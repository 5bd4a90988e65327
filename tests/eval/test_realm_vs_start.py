"""What REALM added, as the report states it: recall of two retrievers paired over the same questions, the share of
questions whose answer the corpus holds, and the headline sentences built from a run's records."""

from __future__ import annotations

import types

import pytest

from realm.config import get_preset
from realm.data.qa_examples import QAExample
from realm.eval.intervals import paired_difference
from realm.eval.retrieval import answer_in_corpus, paired_recall
from realm.pipeline.ablations import Ablation, AblationRow, PairedFigure
from realm.pipeline.document import ReportDocument
from realm.pipeline.headline import headline, realm_added


def test_paired_recall_is_the_difference_of_hits_over_the_same_questions():
    realm = [0, 3, None, 7, 1]  # first answer ranks of five questions
    start = [2, None, None, 19, 6]
    paired = paired_recall(realm, start, (5, 20))
    assert paired["recall@5"]["difference"] == pytest.approx(40.0)  # 3 of 5 against 1 of 5
    assert paired["recall@20"]["difference"] == pytest.approx(20.0)  # 4 of 5 against 3 of 5
    expected = paired_difference([100, 100, 0, 0, 100], [100, 0, 0, 0, 0])
    assert paired["recall@5"]["difference_95ci"] == [round(v, 2) for v in expected[1]]
    with pytest.raises(ValueError, match="same questions"):
        paired_recall(realm, start[:4], (5,))


def test_answer_coverage_uses_the_answer_match_of_recall():
    bodies = ["Leonardo da Vinci painted the Mona Lisa.", "Mount McKinley is 20,320 feet tall."]
    examples = [
        QAExample("Who painted it?", ("Leonardo da Vinci",)),
        QAExample("Who painted it?", ("Vinci painted the Mona",)),  # a run of whole tokens: found
        QAExample("Who painted it?", ("Leonard",)),  # a part of a token: not an answer in the text
        QAExample("How tall?", (r"20,?320\s*f(ee|oo)t",), regex=True),
        QAExample("How tall?", (r"6,?194\s*m",), regex=True),
    ]
    assert answer_in_corpus(bodies, examples) == [True, True, False, True, False]


def _records() -> dict:
    em = {"exact_match": 40.0, "exact_match_95ci": [37.5, 42.5], "questions": 3610}
    r = {
        "qa_start": {"retriever": "off-the-shelf"},
        "eval": {
            "question_set": "nq-test",
            "dense": em,
            "bm25": em,
            "hybrid": em,
            "realm_vs_start": {
                "start": "off-the-shelf",
                "recall@5": {"difference": 0.5, "difference_95ci": [-0.4, 1.4]},
                "recall@20": {"difference": 1.5, "difference_95ci": [0.2, 2.8]},
            },
            "answer_coverage": {"percent": 21.3, "percent_95ci": [20.0, 22.6], "questions": 3610},
        },
        "examples": {"with_retrieval": {"retrieval_gain": 0.47, "retrieval_gain_95ci": [0.06, 0.88], "sentences": 478}},
    }
    return r


def test_the_headline_says_what_realm_changed_with_intervals_and_the_papers_rows(tmp_path):
    plan = types.SimpleNamespace(work=types.SimpleNamespace(blocks=14000), preset=get_preset("cpu"))
    compared = Ablation("retriever", "REALM's", "its start's", "eval", "qa_ict", (38.2, 35.3))
    retriever_row = AblationRow(compared, PairedFigure(41.0, 39.0, 2.0, (0.5, 3.5), 1496))
    said = " ".join(realm_added(_records(), [retriever_row]))
    assert "REALM's retriever changed dev EM by +2.00 [+0.50, +3.50] points" in said
    assert "REALM's reader, with REALM's retriever (41.00) and with its start's (39.00)" in said
    assert "+0.50 [-0.40, +1.40] points (includes 0: no clear change" in said
    assert "+0.47 [+0.06, +0.88] points over 478 sentences (excludes 0)" in said
    unmeasured = " ".join(realm_added(_records(), []))
    assert "not measured in this run" in unmeasured and "REALM's retriever is not in the exact match" in unmeasured

    doc = ReportDocument()
    headline(doc, _records(), plan, [])
    text = doc.markdown(tmp_path)
    assert "on 3,610 nq-test questions: hybrid retrieval 40.0 [37.5, 42.5]" in text
    assert "21.3% [20.0, 22.6] of these questions have an answer string" in text
    assert "| REALM, pretrained on Wikipedia | 39.2" in text and "| ORQA (Lee et al., 2019) | 33.3" in text
