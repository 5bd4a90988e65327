"""After QA fine-tuning the pipeline keeps the query tower that retrieves better on held-out training questions."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import TINY_QA_PRESET, save_tiny_qa

from realm.data.qa_examples import QAExample, tuning_split
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


def test_the_selection_questions_are_a_sample_of_held_out_articles():
    """The questions that choose the QA start and the query tower: at most SELECTION_QUESTIONS, drawn from whole
    articles that fine-tuning never sees (a Super Bowl-only first 500 chose them before), in file order."""
    questions = [
        QAExample(f"{a}: question {i}?", (str(i),), article=f"article {a}") for a in range(40) for i in range(75)
    ]
    train, selection = split_training_questions(questions)
    assert len(selection) == work.SELECTION_QUESTIONS
    assert not {e.article for e in selection} & {e.article for e in train}
    assert len({e.article for e in selection}) >= 5 and selection != questions[: work.SELECTION_QUESTIONS]
    assert [questions.index(e) for e in selection] == sorted(questions.index(e) for e in selection)
    assert split_training_questions(list(questions)) == (train, selection)  # the same on every run
    assert len(train) + len(tuning_split(questions)[1]) == len(questions)  # the rest of those articles: unused
    plain = [QAExample(f"question {i}?", (str(i),)) for i in range(12)]  # a file that names no article
    train, selection = split_training_questions(plain)
    assert len(selection) == 2 and len(train) == 10  # a fifth, each question an article of its own
    assert not split_training_questions(questions[:12])[1]  # one article: none fits in a fifth


def test_a_pipeline_given_too_few_training_questions_says_so(tmp_path):
    qa = tmp_path / "qa.jsonl"
    qa.write_text((json.dumps({"question": "Where was Bach born?", "answer": ["Eisenach"]}) + "\n") * 4)
    options = PipelineOptions(inputs=(str(qa),), run_dir=tmp_path / "run", qa_train=qa, qa_dev=qa, progress=False)
    with pytest.raises(ValueError, match=r"qa\.jsonl: 4 questions, and no article's questions fit in a fifth of them"):
        Pipeline(options, TINY_QA_PRESET)


def test_a_pipeline_takes_the_articles_of_its_questions_from_a_squad_file(tmp_path):
    """--qa-articles: a QA file without titles (the shared SQuAD-open one) gets them from the SQuAD file its
    questions came from, and the selection questions are whole articles that fine-tuning never sees."""
    articles = {f"Article {a}": [f"Question {a}.{i}?" for i in range(3)] for a in range(10)}
    squad = {
        "data": [
            {"title": title.replace(" ", "_"), "paragraphs": [{"context": "text", "qas": [{"question": q, "id": q}]}]}
            for title, questions in articles.items()
            for q in questions
        ]
    }
    (tmp_path / "squad.json").write_text(json.dumps(squad))
    qa = tmp_path / "qa.jsonl"
    qa.write_text("".join(json.dumps({"question": q, "answer": ["x"]}) + "\n" for qs in articles.values() for q in qs))
    options = PipelineOptions(
        inputs=(str(qa),), run_dir=tmp_path / "run", qa_train=qa, qa_dev=qa, qa_articles=tmp_path / "squad.json"
    )
    pipeline = Pipeline(options, TINY_QA_PRESET)
    held_out = {e.article for e in pipeline.qa_held_out}
    assert len(pipeline.qa_held_out) == 6 and len(held_out) == 2 and held_out <= set(articles)
    assert not held_out & {e.article for e in pipeline.qa_train}
    assert pipeline.selection()["articles"] == 2
