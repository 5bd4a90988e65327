"""The reading stage (recipes/reading.py): its labels, the blocks it finds, resume, and the QA file's offsets."""

from __future__ import annotations

import dataclasses
import json
import shutil

import numpy as np
import pytest
from conftest import TINY_QA_PRESET

from realm.config import ReadingConfig, get_preset
from realm.data.qa_examples import QAExample, has_answer, load_qa
from realm.models.orqa import QAModel
from realm.models.span_reader import block_spans
from realm.recipes import reading
from realm.recipes.finetune_qa import qa_model_over
from realm.recipes.reading import context_window, find_evidence, offset_labels, train_reading

READING = ReadingConfig(epochs=2.0, batch_size=2, negatives=1, depth=4, lr=1e-3, checkpoint_every=2, log_every=1)
PRESET = dataclasses.replace(TINY_QA_PRESET, reading=READING)


def labelled(tokenizer, body: str, chars, max_tokens: int = 64, width: int = 10) -> list[str]:
    spans = block_spans(tokenizer, body, max_tokens, width)
    return [spans.text(body, s) for s, ok in zip(spans.spans, offset_labels(spans, chars)) if ok]


def test_offsets_label_the_span_at_word_piece_boundaries(tokenizer):
    body = "Johann Sebastian Bach was born in Eisenach in 1685, and died in Leipzig."
    start = body.index("Eisenach")
    assert len(tokenizer.tokenize("Eisenach")) > 1  # several wordpieces: one span from the first to the last
    assert labelled(tokenizer, body, [(start, start + len("Eisenach"))]) == ["Eisenach"]
    year = body.index("1685")
    assert labelled(tokenizer, body, [(year, year + 4)]) == ["1685"]  # not "1685," (the comma is a word of its own)
    assert labelled(tokenizer, body, [(start + 2, start + 8)]) == []  # an offset inside a word labels nothing


def test_offsets_label_every_occurrence_given_and_none_cut_by_the_blocks_end(tokenizer):
    body = "Bach lived in Leipzig. Later Leipzig honoured him."
    first, second = body.index("Leipzig"), body.rindex("Leipzig")
    both = labelled(tokenizer, body, [(first, first + 7), (second, second + 7)])
    assert both == ["Leipzig", "Leipzig"]
    assert labelled(tokenizer, body, [(first, first + 7)]) == ["Leipzig"]  # the offset chooses the occurrence
    born = "Bach was born in Eisenach."
    at = born.index("Eisenach")
    cut = len(tokenizer.tokenize(born[:at])) + 1  # the body truncated after the answer's first wordpiece
    assert labelled(tokenizer, born, [(at, at + 8)], max_tokens=cut) == []  # no span reads as it
    assert labelled(tokenizer, born, [(at, at + 8)], max_tokens=cut + 4) == ["Eisenach"]


def test_a_context_window_holds_the_answer_and_starts_at_a_word(tokenizer):
    context = " ".join(f"word{i} filler text here." for i in range(60)) + " The answer is Ulaanbaatar today."
    start = context.index("Ulaanbaatar")
    for seed in range(5):
        begin, end = context_window(tokenizer, context, (start, start + 11), 24, np.random.default_rng(seed))
        window = context[begin:end]
        assert "Ulaanbaatar" in window and len(tokenizer.tokenize(window)) <= 24
        assert begin == 0 or context[begin - 1] == " "  # a whole word first
    short = "Paris is the capital of France."
    assert context_window(tokenizer, short, (0, 5), 24, np.random.default_rng(0)) == (0, len(short))


@pytest.fixture
def reading_setup(tmp_path, squad_slice, tokenizer):
    from conftest import save_tiny_qa

    model_dir, index_dir = save_tiny_qa(squad_slice, tokenizer, tmp_path)
    bodies = squad_slice.column("body")
    return model_dir, index_dir, bodies


def test_the_positive_is_the_best_ranked_block_holding_the_answer(reading_setup):
    model_dir, index_dir, bodies = reading_setup
    hybrid = dataclasses.replace(PRESET, qa=dataclasses.replace(PRESET.qa, retriever="hybrid"))  # BM25 finds the word
    model, index, _, sparse = qa_model_over(str(model_dir), index_dir, hybrid)
    assert sparse is not None
    store = index.corpus()
    word = max((w.strip(".,;:()'\"") for w in bodies[3].split()), key=len)  # a rare word: BM25 finds it
    questions = [QAExample(f"What about {word}?", (word,), where="q.jsonl:1")]
    questions.append(QAExample("Which word is nowhere?", ("xylophonequartz",), where="q.jsonl:2"))
    deep = dataclasses.replace(READING, depth=60)  # the random query tower ranks at random: look deep
    examples, found = find_evidence(model, questions, index, store, sparse, deep)
    ranked = reading.retrieved_blocks(model, [q.question for q in questions], index, sparse, deep.depth)[0]
    holders = [b for b in ranked if has_answer(bodies[b], questions[0])]
    assert holders  # some retrieved block holds it: the best-ranked of them is the positive
    (example,) = examples
    assert example.bodies[0] == bodies[holders[0]] and example.source == "retrieval"
    assert not any(has_answer(body, questions[0]) for body in example.bodies[1:])  # negatives hold no answer
    assert found.no_answer_block == 1 and found.lines["no_answer_block"] == ["q.jsonl:2"]  # counted, named


def test_the_gold_paragraph_is_read_at_its_offsets_and_a_bad_offset_is_counted(reading_setup):
    model_dir, index_dir, _ = reading_setup
    model, index, _, sparse = qa_model_over(str(model_dir), index_dir, PRESET)
    context = "Genghis Khan founded the empire. Kublai Khan founded the Yuan dynasty in 1271 in Khanbaliq."
    at = context.index("1271")
    good = QAExample("When was the Yuan founded?", ("1271",), context=context, answer_starts=(at,), where="f:1")
    bad = QAExample("When?", ("1271",), context=context, answer_starts=(None,), where="f:2")
    examples, found = find_evidence(model, [good, bad], index, index.corpus(), sparse, READING)
    assert found.from_context == 1 and examples[0].source == "context"
    body = examples[0].bodies[0]
    assert [body[s:e] for s, e in examples[0].answer_chars] == ["1271"]
    assert found.offsets_not_matching == 1 and found.lines["offsets_not_matching"] == ["f:2"]


def test_reading_trains_and_resumes_exactly_after_a_kill(tmp_path, reading_setup, monkeypatch):
    model_dir, index_dir, bodies = reading_setup
    words = [b.split()[1].strip(".,;:") for b in bodies[:12]]
    questions = [QAExample(f"Which word comes after {b.split()[0]}?", (w,)) for b, w in zip(bodies[:12], words)]
    crashed, save_checkpoint = tmp_path / "crashed", reading.save_checkpoint

    def save_then_copy(out, step, *args, **kwargs):
        save_checkpoint(out, step, *args, **kwargs)
        if step == 2:
            shutil.copytree(out, crashed)  # the run as a kill just after the step-2 checkpoint leaves it

    monkeypatch.setattr(reading, "save_checkpoint", save_then_copy)
    preset = dataclasses.replace(PRESET, reading=dataclasses.replace(READING, steps=4))
    out = train_reading(str(model_dir), index_dir, questions, tmp_path / "run", preset, progress=False)
    summary = json.loads((tmp_path / "run" / "reading.json").read_text())
    assert summary["steps"] == 4 and summary["read_questions"] == summary["found"]["from_retrieval"] > 0
    loaded = QAModel.load(str(model_dir), PRESET.retriever, reader=str(out))
    assert loaded.reader.fine_tuned  # QA starts from the trained span head
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    train_reading(str(model_dir), index_dir, questions, crashed, preset, resume=True, progress=False)
    resumed = [json.loads(line) for line in (crashed / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in resumed] == [1, 2, 3, 4]
    for a, b in zip(rows[2:], resumed[2:]):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-4)


def test_nothing_to_read_is_one_clear_error(tmp_path, reading_setup):
    model_dir, index_dir, _ = reading_setup
    nowhere = [QAExample("Which word is nowhere?", ("xylophonequartz",))]
    with pytest.raises(ValueError, match="none of the 1 training questions has an answer-bearing block"):
        train_reading(str(model_dir), index_dir, nowhere, tmp_path / "run", PRESET, progress=False)


def test_a_qa_file_gives_contexts_and_offsets(tmp_path):
    path = tmp_path / "qa.jsonl"
    rows = [
        {"question": "Where?", "answer": ["Paris", "paris"], "context": "It is Paris.", "answer_start": [6, 0]},
        {"question": "Who?", "answer": ["Bach"]},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    first, second = load_qa(path)
    assert first.context == "It is Paris." and first.answer_starts == (6, None)  # 0 does not hold "paris"
    assert first.answer_chars == [(6, 11)] and first.where == f"{path}:1"
    assert second.context is None and second.answer_chars == []
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"question": "Q?", "answer": ["a", "b"], "context": "a b", "answer_start": [0]}) + "\n")
    with pytest.raises(ValueError, match=r"bad\.jsonl:1: .*one for each answer"):
        load_qa(bad)


def test_the_shipped_training_questions_carry_their_paragraphs():
    train = load_qa("squad-open-train")
    with_offsets = [e for e in train if e.answer_chars]
    assert len(with_offsets) == len(train)  # every SQuAD answer's offset matches its paragraph
    e = with_offsets[0]
    assert all(e.context[s:t] == a for a, (s, t) in zip(e.answers, e.answer_chars))
    assert e.where == "squad-open-train:1"  # a record names the set's line, not this machine's cache path
    assert all(e.context is None for e in load_qa("squad-open-dev"))  # nothing that answers dev sees its paragraph


def test_the_plan_has_a_reading_stage_where_the_preset_reads_and_the_paper_preset_none():
    from realm.pipeline.estimate import Workload, scale_preset
    from realm.pipeline.stage_table import estimate

    work = Workload(blocks=1000, qa_train=800, qa_dev=100, qa_held_out=100)
    assert "read" not in [s.name for s in estimate(get_preset("paper"), work)]
    cpu = get_preset("cpu")
    reads = dataclasses.replace(cpu, reading=dataclasses.replace(cpu.reading, epochs=2.0))
    read = [s for s in estimate(scale_preset(reads, 0.5, 800), work) if s.name == "read"]
    assert [s.steps for s in read] == [50]  # two passes over 800 questions at 16 a step, halved
    assert read[0].fixed_seconds == cpu.costs.read_startup + 800 * cpu.costs.read_question
    names = [s.name for s in estimate(reads, work)]
    assert names.index("qa_start") < names.index("read") < names.index("qa")  # the order the pipeline runs them
