"""The example corpus and questions shipped in examples/ (the README's second recipe) are what they claim."""

from __future__ import annotations

from pathlib import Path

from realm.data.qa_examples import has_answer, load_qa, tuning_split
from realm.data.sources import BadRecords, read_all

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_every_example_question_is_answered_by_its_own_article():
    documents = {d.title: d for d in read_all([str(EXAMPLES / "corpus.jsonl")], skip_bad=False, bad=BadRecords())}
    train, dev = load_qa(EXAMPLES / "qa_train.jsonl"), load_qa(EXAMPLES / "qa_dev.jsonl")
    assert len(documents) > 10 * len({e.article for e in train + dev})  # distractors: retrieval can go wrong
    for example in train + dev:
        assert has_answer(documents[example.article].text, example), example.question
    assert not {e.article for e in train} & {e.article for e in dev}  # dev articles are never trained on
    held_out, rest = tuning_split(train)  # what `realm pipeline` holds out of fine-tuning to choose on
    assert held_out and rest and not {e.article for e in held_out} & {e.article for e in rest}
