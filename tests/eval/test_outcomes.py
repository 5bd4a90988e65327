"""Where the errors are (the four outcomes of a question) and the paired comparison of two predictions files."""

from __future__ import annotations

import json

import pytest

from realm.cli.main import main
from realm.data.qa_examples import QAExample
from realm.eval.qa import OUTCOMES, compare_predictions, outcome

BRONCOS = QAExample("Who won Super Bowl 50?", ("Denver Broncos", "Broncos"))
YEAR = QAExample("When was Bach born?", (r"16\d\d",), regex=True)


def test_each_question_has_exactly_one_outcome():
    assert outcome("the Denver Broncos", BRONCOS, retrieved=True) == "exact_match"
    assert outcome("Broncos", BRONCOS, retrieved=False) == "exact_match"  # right, whatever recall says
    assert outcome("Carolina Panthers", BRONCOS, retrieved=False) == "not_retrieved"
    assert outcome("Carolina Panthers", BRONCOS, retrieved=True) == "retrieved_not_read"
    assert outcome("Denver", BRONCOS, retrieved=True) == "read_not_exact"  # shares a word: wrong boundaries
    assert outcome("the", BRONCOS, retrieved=True) == "retrieved_not_read"  # articles do not count as overlap
    assert outcome("born in 1685", YEAR, retrieved=True) == "read_not_exact"  # the pattern occurs, not at the start
    assert outcome("1685 in Eisenach", YEAR, retrieved=True) == "exact_match"  # ORQA's re.match
    assert outcome("Eisenach", YEAR, retrieved=True) == "retrieved_not_read"
    assert set(OUTCOMES) == {"exact_match", "not_retrieved", "retrieved_not_read", "read_not_exact"}


def _predictions(path, correct: list[bool], questions: list[str] | None = None):
    questions = questions or [f"q{i}" for i in range(len(correct))]
    path.write_text("".join(json.dumps({"question": q, "exact_match": c}) + "\n" for q, c in zip(questions, correct)))
    return path


def test_paired_comparison_of_two_predictions_files(tmp_path, capsys):
    better = _predictions(tmp_path / "a.jsonl", [True] * 60 + [False] * 40)
    worse = _predictions(tmp_path / "b.jsonl", [True] * 30 + [False] * 70)
    result = compare_predictions(better, worse)
    assert (result["exact_match_a"], result["exact_match_b"], result["difference"]) == (60.0, 30.0, 30.0)
    low, high = result["difference_95ci"]
    assert 0 < low < 30 < high < 60  # the same questions: the shared 30 cancel, the interval excludes 0
    same = compare_predictions(better, better)
    assert same["difference"] == 0 and same["difference_95ci"] == [0, 0]
    assert main(["eval", "compare", str(better), str(worse)]) == 0
    assert "difference +30.00" in capsys.readouterr().out
    other = _predictions(tmp_path / "c.jsonl", [True] * 100, [f"x{i}" for i in range(100)])
    with pytest.raises(ValueError, match="same questions"):
        compare_predictions(better, other)
    (tmp_path / "bad.jsonl").write_text('{"question": "q0", "exact_match": true}\nnot json\n')
    assert main(["eval", "compare", str(better), str(tmp_path / "bad.jsonl")]) == 2
    assert "bad.jsonl:2:" in capsys.readouterr().err


def test_answer_selection_marginal_against_orqas_best_span(tokenizer):
    """`marginal` sums p(z, s | x) over the spans reading as one string; `best_span` (ORQA) takes the single most
    probable (block, span). Here they disagree: Paris twice at 0.3, Lyon once at 0.35."""
    import torch

    from realm.eval.answerer import compose_answer
    from realm.index.search import SearchHit
    from realm.models.span_reader import block_spans

    bodies = ["Paris", "Lyon", "Paris"]
    blocks = [block_spans(tokenizer, body, 16, 4) for body in bodies]
    assert all(len(b.spans) == 1 for b in blocks)
    hits = [SearchHit(i, f"d{i}", 0.0, "t", body) for i, body in enumerate(bodies)]
    log_joint = torch.log(torch.tensor([[0.3], [0.35], [0.3]]))  # (K, S) log p(z, s | x)
    marginal = compose_answer("q", hits, blocks, torch.zeros(3), log_joint, "marginal")
    best = compose_answer("q", hits, blocks, torch.zeros(3), log_joint, "best_span")
    assert (marginal.answer, round(marginal.score, 6)) == ("Paris", 0.6)
    assert (best.answer, round(best.score, 6)) == ("Lyon", 0.35)
    assert [e.answer_prob for e in best.evidence] == pytest.approx([0.0, 0.35, 0.0])
