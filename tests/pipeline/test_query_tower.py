"""After QA fine-tuning the pipeline keeps the query tower that retrieves better on held-out training questions."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import TINY_QA_PRESET, save_tiny_qa

from realm.data.qa_examples import QAExample
from realm.models.retriever import Retriever
from realm.pipeline import work
from realm.pipeline.plan import PipelineOptions
from realm.pipeline.run import Pipeline
from realm.pipeline.work import QUERY_TOWER_CHOICE, keep_query_tower, split_training_questions

HELD_OUT = [QAExample("Where was Bach born?", ["Eisenach"])]


def query_weights(retriever_folder: Path) -> bytes:
    return (retriever_folder / "query_tower" / "model.safetensors").read_bytes()


@pytest.fixture
def towers(tmp_path, tiny_corpus, tokenizer) -> tuple[Path, Path, Path]:
    """(the start's retriever, a fine-tuned model folder whose query tower differs from it, their index)."""
    model, index = save_tiny_qa(tiny_corpus, tokenizer, tmp_path)
    start = tmp_path / "start"
    Retriever.load(str(model / "retriever"), TINY_QA_PRESET.retriever).save(start)
    tuned = Retriever.load(str(start), TINY_QA_PRESET.retriever)
    for parameter in tuned.query_tower.parameters():  # what fine-tuning does: the query tower moves, the rest stays
        parameter.data.add_(0.01)
    tuned.save(model / "retriever")
    assert query_weights(model / "retriever") != query_weights(start)
    return start, model, index


@pytest.mark.parametrize(
    ("start_recall", "tuned_recall", "kept"),
    [(60.0, 40.0, "start"), (50.0, 50.0, "start"), (40.0, 60.0, "fine-tuned")],  # a tie keeps the known tower
)
def test_the_fine_tuned_query_tower_stays_only_when_it_retrieves_better(
    towers, monkeypatch, start_recall, tuned_recall, kept
):
    start, best, index = towers
    tuned_weights = query_weights(best / "retriever")
    measured: list[Path] = []

    def recall(index_dir, retriever_folder, examples, ks, preset):
        measured.append(Path(retriever_folder))
        assert list(examples) == HELD_OUT and tuple(ks) == (5,)
        return {"recall@5": start_recall if Path(retriever_folder) == start else tuned_recall}

    monkeypatch.setattr(work, "zero_shot_recall", recall)
    choice = keep_query_tower(best, start, index, HELD_OUT, TINY_QA_PRESET)
    assert choice == {"kept": kept, "recall@5": {"start": start_recall, "fine-tuned": tuned_recall}, "questions": 1}
    assert json.loads((best / QUERY_TOWER_CHOICE).read_text()) == choice
    expected = query_weights(start) if kept == "start" else tuned_weights
    assert query_weights(best / "retriever") == expected
    loaded = Retriever.load(str(best), TINY_QA_PRESET.retriever)  # still a checkpoint of the index's document tower
    assert loaded.doc_fingerprint() == Retriever.load(str(start), TINY_QA_PRESET.retriever).doc_fingerprint()

    measured.clear()  # a rerun (e.g. after kill -9 between the record and the swap) redoes the choice on record
    (best / "retriever" / "query_tower" / "model.safetensors").write_bytes(tuned_weights)
    assert keep_query_tower(best, start, index, HELD_OUT, TINY_QA_PRESET) == choice and not measured
    assert query_weights(best / "retriever") == expected


def test_qa_holds_out_a_share_of_its_training_questions():
    questions = [QAExample(f"question {i}?", [str(i)]) for i in range(3000)]
    train, held_out = split_training_questions(questions)
    assert held_out == questions[: work.SELECTION_QUESTIONS] and train == questions[work.SELECTION_QUESTIONS :]
    train, held_out = split_training_questions(questions[:12])
    assert held_out == questions[:2] and train == questions[2:12]  # one in HELD_OUT_SHARE of a small set


def test_a_pipeline_given_too_few_training_questions_says_so(tmp_path):
    qa = tmp_path / "qa.jsonl"
    qa.write_text((json.dumps({"question": "Where was Bach born?", "answer": ["Eisenach"]}) + "\n") * 4)
    options = PipelineOptions(inputs=(str(qa),), run_dir=tmp_path / "run", qa_train=qa, qa_dev=qa, progress=False)
    with pytest.raises(
        ValueError, match=r"qa\.jsonl: 4 questions; QA fine-tuning needs at least 5 \(a fifth of them held out"
    ):
        Pipeline(options, TINY_QA_PRESET)
