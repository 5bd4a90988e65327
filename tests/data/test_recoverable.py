"""Recoverability of masked spans: whole normalised tokens of a block body of another document."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest
from conftest import TINY_CORPUS

from realm.data.blocks import BlockStore, build_corpus
from realm.data.recoverable import SpanFinder
from realm.data.sentences import SCHEMA, SentenceSet

DOCS = [
    {"id": "a", "title": "Alpha", "text": "Paris is the capital of France. The Louvre opened in 1793."},
    {"id": "b", "title": "Beta", "text": "The Eiffel Tower stands in Paris, FRANCE. Its engineer was Gustave Eiffel."},
    {"id": "c", "title": "Gamma", "text": "Zürich lies on a lake. Parisian cafés differ."},
]


@pytest.fixture
def store(tmp_path, tokenizer):
    path = tmp_path / "docs.jsonl"
    path.write_text("".join(json.dumps(d) + "\n" for d in DOCS))
    build_corpus([str(path)], tmp_path / "corpus", tokenizer, TINY_CORPUS, progress=False)
    return BlockStore(tmp_path / "corpus")


def test_a_span_is_recoverable_only_from_another_documents_whole_tokens(store, tokenizer):
    finder = SpanFinder(store, tokenizer)
    assert finder.recoverable("Paris", "a")  # b's body holds it
    assert finder.recoverable("paris, france", "a")  # case and punctuation as DrQA tokens: "paris , france"
    assert not finder.recoverable("Paris France", "a")  # not a run of whole tokens anywhere ("paris , france")
    assert not finder.recoverable("Eiffel Tower", "b")  # only its own document holds it
    assert finder.recoverable("Eiffel Tower", "a")
    assert not finder.recoverable("Pari", "b")  # a token is whole or nothing ("parisian" does not hold "pari")
    assert finder.recoverable("zurich", "a")  # accents off, as the uncased tokenizer normalises
    assert not finder.recoverable("Berlin", "a")  # in no block at all
    assert not finder.recoverable("", "a")


def test_label_says_recoverable_and_held_by_a_candidate(store, tokenizer):
    finder = SpanFinder(store, tokenizer)
    doc_of = {d: i for i, d in enumerate(store.column("doc_id"))}
    candidates = np.array([[doc_of["b"], -1], [doc_of["c"], doc_of["a"]], [-1, -1]])  # (B, K-1), -1: null/padding
    recoverable, retrieved = finder.label(["Paris", "1793", "Gustave Eiffel"], ["a", "b", "a"], candidates)
    assert recoverable == [True, True, True]
    assert retrieved == [True, True, False]


def test_recoverable_masking_keeps_only_spans_another_document_holds(store, tokenizer, tmp_path):
    texts = ["Paris is the capital of France.", "The Eiffel Tower stands in Paris, FRANCE.", "Zürich lies on a lake."]
    spans = [[(0, 5), (24, 30)], [(4, 16), (27, 32)], [(0, 6)]]  # Paris, France / Eiffel Tower, Paris / Zürich
    rows = {"doc_id": ["a", "b", "c"], "text": texts, "span_starts": [[s for s, _ in r] for r in spans],
            "span_ends": [[e for _, e in r] for r in spans]}  # fmt: skip
    path = tmp_path / "sentences.arrow"
    with pa.ipc.new_file(str(path), SCHEMA) as writer:
        writer.write_table(pa.table(rows, schema=SCHEMA))
    sentences = SentenceSet(path, held_out_fraction=0.0)
    finder = SpanFinder(store, tokenizer)
    assert sentences.with_recoverable_spans(finder).spans == [[(0, 5), (24, 30)], [(27, 32)], []]  # not b's own Eiffel
    kept = sentences.for_masking("salient", tokenizer, 32, 10, recoverable=finder)
    assert kept.texts == texts[:2] and kept.usage()["used"] == 2  # Zürich: only its own document holds it
    assert len(sentences.for_masking("salient", tokenizer, 32, 10)) == 3
