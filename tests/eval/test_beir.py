"""BEIR-format evaluation: nDCG@10 and recall@100 as trec_eval computes them (checked against figures worked out by
hand), a BEIR folder as a corpus, and `realm eval retrieval --beir` end to end with BM25, whose ranking of this
small fixture is plain from the words the queries share with the documents."""

from __future__ import annotations

import json
import math

import pytest

from realm.cli.main import main
from realm.eval.retrieval import trec_ndcg_recall


def test_ndcg_and_recall_follow_trec_eval_ties_grades_and_identical_ids():
    ranking = [("d1", 3.0), ("d2", 2.0), ("d3", 2.0), ("q1", 1.5), ("d4", 1.0)]
    judged = {"d1": 0, "d3": 2, "d4": 1, "d9": 1}  # d1 judged not relevant, d9 never retrieved
    # q1 dropped; d3 before d2 (a tie: document id descending): d1 (gain 0), d3 (2), d2 (0), d4 (1)
    dcg = 2 / math.log2(3) + 1 / math.log2(5)
    ideal = 2 / math.log2(2) + 1 / math.log2(3) + 1 / math.log2(4)  # the judged gains 2, 1, 1 in order
    ndcg, recall = trec_ndcg_recall(ranking, judged, query_id="q1")
    assert ndcg == pytest.approx(dcg / ideal) and ndcg == pytest.approx(0.540586, abs=1e-6)
    assert recall == pytest.approx(2 / 3)  # d3 and d4 of d3, d4, d9

    kept, _ = trec_ndcg_recall(ranking, judged)  # q1 stays at rank 4 and pushes d4 to rank 5
    assert kept == pytest.approx((2 / math.log2(3) + 1 / math.log2(6)) / ideal)
    at_2, at_3 = trec_ndcg_recall(ranking, judged, "q1", ndcg_cut=2, recall_cut=3)
    assert at_2 == pytest.approx((2 / math.log2(3)) / (2 + 1 / math.log2(3)))
    assert at_3 == pytest.approx(1 / 3)  # d1, d3, d2: only d3
    assert trec_ndcg_recall(ranking, {"d1": 0}) == (0.0, 0.0)  # nothing relevant: 0, as trec_eval


DOCS = [
    {"_id": "alps", "title": "Alps", "text": "Mont Blanc is the highest peak of the Alps, a mountain range in Europe."},
    {"_id": "andes", "title": "Andes", "text": "Aconcagua is the highest peak of the Andes, in South America."},
    {
        "_id": "nile",
        "title": "Nile",
        "text": "The Nile is the longest river in Africa; it flows into the Mediterranean.",
    },
    {
        "_id": "danube",
        "title": "Danube",
        "text": "The Danube is a river of Europe that flows into the Black Sea.",
        "metadata": {},
    },
    {"_id": "q2", "title": "", "text": "What flows into the Black Sea?"},  # a query that is also a document
]
QUERIES = [
    {"_id": "q1", "text": "Mont Blanc peak"},
    {"_id": "q2", "text": "What flows into the Black Sea?"},
    {"_id": "q3", "text": "longest river in Africa"},
    {"_id": "q4", "text": "not judged in this split"},
]
QRELS = "query-id\tcorpus-id\tscore\nq1\talps\t1\nq1\tandes\t2\nq2\tdanube\t1\nq2\tnile\t0\nq3\tdanube\t1\nq3\tvolga\t1\nq3\tnile\t0\n"


def _beir_folder(root, qrels: str = QRELS):
    (root / "qrels").mkdir(parents=True)
    (root / "corpus.jsonl").write_text("".join(json.dumps(doc) + "\n" for doc in DOCS))
    (root / "queries.jsonl").write_text("".join(json.dumps(query) + "\n" for query in QUERIES))
    (root / "qrels" / "test.tsv").write_text(qrels)
    return root


def test_a_beir_folder_is_a_corpus_and_its_judgements_give_beirs_figures(tmp_path, capsys):
    beir, corpus = _beir_folder(tmp_path / "beir"), str(tmp_path / "corpus")
    assert main(["corpus", "build", str(beir), "--out", corpus, "--quiet"]) == 0
    assert f"{len(DOCS)} documents" in capsys.readouterr().out

    assert main(["eval", "retrieval", "--beir", str(beir), "--corpus", corpus, "--retriever", "bm25", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    # BM25 ranks by the words shared (stopwords dropped):
    # q1 "Mont Blanc peak": alps (3 words), andes (1); judged alps 1, andes 2 -> DCG 1 + 2/log2(3), ideal 2 + 1/log2(3)
    # q2: q2 itself is dropped (BEIR's ignore_identical_ids), then danube (flows, black, sea), nile (flows) -> 1
    # q3 "longest river in Africa": nile (3 words, judged 0), danube (river, 1); volga (1) is not in the corpus
    #    -> nDCG (1/log2(3)) / (1 + 1/log2(3)), recall 1/2
    ndcg = [(1 + 2 / math.log2(3)) / (2 + 1 / math.log2(3)), 1.0, (1 / math.log2(3)) / (1 + 1 / math.log2(3))]
    assert result["queries"] == 3  # q4 has no judgements in this split
    assert result["ndcg@10"] == pytest.approx(sum(ndcg) / 3) and result["ndcg@10"] == pytest.approx(0.748858, abs=1e-6)
    assert result["recall@100"] == pytest.approx((1 + 1 + 0.5) / 3)
    low, high = result["ndcg@10_95ci"]
    assert min(ndcg) <= low <= result["ndcg@10"] <= high <= max(ndcg)


@pytest.mark.parametrize(
    ("qrels", "message"),
    [
        (
            "query-id\tcorpus-id\tscore\nq1\talps\n",
            "qrels/test.tsv:2: expected query-id<TAB>corpus-id<TAB>integer score",
        ),
        ("query-id\tcorpus-id\tscore\nq9\talps\t1\n", "1 judged queries are not in"),
    ],
)
def test_bad_beir_files_name_the_file_and_line(tmp_path, capsys, qrels, message):
    beir = _beir_folder(tmp_path / "beir", qrels)
    (tmp_path / "empty").mkdir()
    assert main(["corpus", "build", str(beir), "--out", str(tmp_path / "corpus"), "--quiet"]) == 0
    argv = ["eval", "retrieval", "--beir", str(beir), "--corpus", str(tmp_path / "corpus"), "--retriever", "bm25"]
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("realm: error: ") and message in err and len(err.strip().splitlines()) == 1
    assert main(["corpus", "build", str(tmp_path / "empty"), "--out", str(tmp_path / "c2"), "--quiet"]) == 2
    assert "without a BEIR corpus.jsonl" in capsys.readouterr().err
