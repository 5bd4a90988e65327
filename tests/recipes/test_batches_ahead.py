"""Each trainer's batches, built ahead of the step in a thread (training.Prefetched): the same batches in the same
order with and without the thread, and from a checkpoint's data position the ones an uninterrupted run takes next."""

from __future__ import annotations

import dataclasses
import itertools
import json

import numpy as np
import pytest
import torch
from conftest import TINY_CORPUS, TINY_QA_PRESET
from recipes.test_pretrain import TINY_PRESET

from realm.data.qa_examples import AnswerBlocks, QAExample, has_answer
from realm.data.sentences import SentenceSet, build_sentences
from realm.recipes.finetune_qa import answer_labels, qa_batches, qa_questions
from realm.recipes.ict import ict_batches, sentence_spans
from realm.recipes.pretrain import pretrain_queries, train_pretrain
from realm.training.data import DataPosition, Prefetched
from realm.training.distributed import ONE_PROCESS

QUESTIONS = [
    QAExample("What is the capital of Japan?", ("Tokyo",)),
    QAExample("Where did Bach die?", ("Leipzig",)),
    QAExample("Who walked on the Moon in 1969?", ("Neil Armstrong",)),
    QAExample("When was Bach born?", (r"16\d\d",), regex=True),
    QAExample("Into which sea does the Nile flow?", ("the Mediterranean Sea", "Mediterranean")),
]


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    if isinstance(a, np.ndarray):
        return np.array_equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if dataclasses.is_dataclass(a) and not isinstance(a, type):
        return type(a) is type(b) and all(_same(getattr(a, f.name), getattr(b, f.name)) for f in dataclasses.fields(a))
    return a == b


def _check_ahead(make, count: int = 7) -> None:
    """`make(position)` -> a trainer's batch generator: depth 0 and 2 give the same batches, and a generator
    restarted at the position after batch 3 (what a checkpoint there holds) gives batches 4, 5, ..."""
    with Prefetched(make(DataPosition()), 0) as plain, Prefetched(make(DataPosition()), 2) as ahead:
        built = list(itertools.islice(plain, count))
        assert _same(built, list(itertools.islice(ahead, count)))
    with Prefetched(make(built[2][0]), 2) as resumed:
        assert _same(built[3:], list(itertools.islice(resumed, count - 3)))
    assert len({json.dumps(dataclasses.asdict(b[0])) for b in built}) == count  # the position moves


def test_ict_batches_ahead_are_the_batches_in_the_step(tiny_corpus, tokenizer):
    usable = np.array([i for i, body in enumerate(tiny_corpus.column("body")) if len(sentence_spans(body)) >= 2])
    preset = dataclasses.replace(TINY_PRESET, ict=dataclasses.replace(TINY_PRESET.ict, batch_size=3))
    titles, bodies = tiny_corpus.slice(0, len(tiny_corpus))
    _check_ahead(
        lambda position: ict_batches(titles, bodies, usable, TINY_CORPUS, position, preset, tokenizer, ONE_PROCESS)
    )


def test_masked_queries_ahead_are_the_ones_in_the_step(tiny_corpus, tokenizer):
    sentences = SentenceSet(build_sentences(tiny_corpus, progress=False), 0.0).for_masking(
        "salient", tokenizer, TINY_PRESET.retriever.query_max_tokens, TINY_PRESET.pretrain.max_masks
    )
    preset = dataclasses.replace(TINY_PRESET, pretrain=dataclasses.replace(TINY_PRESET.pretrain, batch_size=3))
    _check_ahead(lambda position: pretrain_queries(sentences, position, preset, tokenizer, ONE_PROCESS))


def test_questions_ahead_are_the_ones_in_the_step(tiny_corpus, tokenizer):
    answers = AnswerBlocks(tiny_corpus.column("body"))
    cfg = dataclasses.replace(TINY_QA_PRESET.qa, batch_size=2)
    _check_ahead(lambda position: qa_batches(QUESTIONS, position, cfg, tokenizer, 16, answers, ONE_PROCESS))


def test_answer_labels_from_the_answer_index_are_has_answer(tiny_corpus, tokenizer):
    bodies = tiny_corpus.column("body")
    answers = AnswerBlocks(bodies)
    ids = np.array([list(range(len(bodies)))] * len(QUESTIONS))
    ids[:, -2:] = -1  # rows end with no block
    valid, top = ids >= 0, ids[:, :3]
    indexed = qa_questions(QUESTIONS, tokenizer, 16, answers)
    beam, reader = answer_labels(ids, valid, top, indexed, tiny_corpus)
    assert indexed.answer_blocks[3] is None  # a regex answer is tested block by block
    truth = np.array([[ok and has_answer(bodies[i], q) for i, ok in zip(row, ok_row)]
                      for q, row, ok_row in zip(QUESTIONS, ids, valid)])  # fmt: skip
    assert beam.any() and np.array_equal(beam, truth) and np.array_equal(reader, truth[:, :3])
    assert _same(
        (beam, reader), answer_labels(ids, valid, top, qa_questions(QUESTIONS, tokenizer, 16, None), tiny_corpus)
    )


def test_pretraining_with_batches_ahead_trains_as_without(tmp_path, tiny_corpus, monkeypatch):
    losses = {}
    for depth in ("0", "3"):
        monkeypatch.setenv("REALM_PREFETCH", depth)
        train_pretrain(tiny_corpus.folder, tmp_path / depth, "random", "random", TINY_PRESET, progress=False)
        rows = [json.loads(line) for line in (tmp_path / depth / "metrics.jsonl").read_text().splitlines()]
        assert all(r["batch_seconds"] >= 0 for r in rows)
        losses[depth] = [r["loss"] for r in rows]
    assert losses["0"] == pytest.approx(losses["3"], rel=1e-6)
