"""The warm-ups that read a block: the holder warm-up (the best-scored block of another document holding the masked
span) and the copy warm-ups (the sentence's own block, whole, or for half the batch without the sentence)."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import torch
from conftest import DOCS, TINY_CORPUS, build_tiny_index
from test_pretrain import TINY_PRESET

from realm.data.blocks import BlockStore, build_corpus
from realm.data.recoverable import SpanFinder
from realm.data.sentences import SentenceSet, build_sentences, mask_each_salient_span
from realm.index.mips import MipsIndex
from realm.models.mlm_reader import Reader
from realm.models.realm import NULL_BLOCK, RealmModel
from realm.recipes.pretrain import make_pretrain_batch, masked_queries, train_pretrain
from realm.recipes.warmup import best_holders, warmup_reading

FAIR_DOCS = [  # "1889" is Paris's and two other documents'; "Japan" is Tokyo's alone
    {"id": "eiffel", "title": "Gustave Eiffel", "text": "Gustave Eiffel's company built a tower in 1889."},
    {"id": "fair", "title": "Exposition Universelle", "text": "The world's fair of 1889 was held in Paris."},
]


def _store(tmp_path, tokenizer) -> BlockStore:
    path = tmp_path / "docs.jsonl"
    path.write_text("".join(json.dumps(d) + "\n" for d in DOCS + FAIR_DOCS))
    build_corpus([str(path)], tmp_path / "corpus", tokenizer, TINY_CORPUS, progress=False)
    return BlockStore(tmp_path / "corpus")


def test_best_holders_picks_the_highest_scored_block_of_another_document(tmp_path, tokenizer, tiny_retriever):
    store = _store(tmp_path, tokenizer)
    build_tiny_index(store, tiny_retriever, tmp_path / "index")
    index = MipsIndex(tmp_path / "index")
    finder = SpanFinder(store, tokenizer)
    doc_of = {doc: block for block, doc in enumerate(store.column("doc_id"))}
    paris, eiffel, fair = index.stored_vectors(np.array([doc_of["paris"], doc_of["eiffel"], doc_of["fair"]]))
    towards_fair = fair - eiffel  # q . fair - q . eiffel = |fair - eiffel|^2 > 0
    spans, sources = ["1889", "1889", "Japan", "Atlantis"], ["paris", "paris", "tokyo", "paris"]
    picked = best_holders(finder, index, np.stack([towards_fair, -towards_fair, fair, fair]), spans, sources)
    assert picked[:, 0].tolist() == [doc_of["fair"], doc_of["eiffel"], NULL_BLOCK, NULL_BLOCK]
    # the sentence's own document never counts, however high it scores
    expected = doc_of["paris"] if paris @ fair > eiffel @ fair else doc_of["eiffel"]
    assert best_holders(finder, index, fair[None], ["1889"], ["fair"])[0, 0] == expected


def _warmup_batches(store, tokenizer, retriever, kinds, finder=None, index=None):
    """For each warm-up reading of `kinds`, the batch of every sentence with a maskable salient span:
    (sentences, their rows, each block's doc id, {kind: batch})."""
    cfg = dataclasses.replace(TINY_PRESET.pretrain, null_warmup_steps=2)
    sentences = SentenceSet(build_sentences(store, progress=False), 0.0)
    max_tokens = TINY_PRESET.retriever.query_max_tokens
    rows = np.array([i for i, (text, spans) in enumerate(zip(sentences.texts, sentences.spans))
                     if mask_each_salient_span(text, spans, tokenizer, max_tokens, cfg.max_masks)])  # fmt: skip
    model = RealmModel(retriever, Reader.load("random", TINY_PRESET.retriever.shape))
    block_doc_ids = np.array(store.column("doc_id"), dtype=object)
    queries = masked_queries(sentences, rows, 0, cfg, tokenizer, max_tokens)
    batches = {
        kind: make_pretrain_batch(model, None, sentences, rows, queries, cfg, store, block_doc_ids,
                                  torch.device("cpu"), torch.float32, warmup_reading(kind, store, finder, index))
        for kind in kinds
    }  # fmt: skip
    return sentences, rows, block_doc_ids, batches


def test_the_holder_warmup_reads_a_block_of_another_document_holding_the_span(tmp_path, tokenizer, tiny_retriever):
    store = _store(tmp_path, tokenizer)
    build_tiny_index(store, tiny_retriever, tmp_path / "run" / "index")
    index, finder = MipsIndex(tmp_path / "run" / "index"), SpanFinder(store, tokenizer)
    sentences, rows, block_doc_ids, batches = _warmup_batches(
        store, tokenizer, tiny_retriever, ["holder"], finder, index
    )
    batch = batches["holder"]
    assert batch.candidate_ids.shape == (len(rows), 2) and (batch.candidate_ids[:, 0] == NULL_BLOCK).all()
    texts, sources = batch.masked_texts(tokenizer), [sentences.doc_ids[i] for i in rows]
    recoverable, held = finder.label(texts, sources, batch.candidate_ids[:, 1:])
    assert recoverable == held  # a holder exactly where another document holds the span
    assert any(recoverable) and not all(recoverable)
    read = batch.candidate_ids[:, 1]
    assert all(block_doc_ids[z] != source for z, source in zip(read, sources) if z >= 0)
    assert (read >= 0).tolist() == recoverable
    assert warmup_reading("null", store, finder, index) is None


def test_pretraining_with_the_holder_warmup(tmp_path, tokenizer):
    store = _store(tmp_path, tokenizer)
    cfg = dataclasses.replace(TINY_PRESET.pretrain, null_warmup_steps=2, reader_warmup="holder")
    train_pretrain(store.folder, tmp_path / "run", "random", "random", dataclasses.replace(TINY_PRESET, pretrain=cfg),
                   progress=False)  # fmt: skip
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2, 3, 4]
    # b_null waits for retrieval: p(null) is 1/2 beside a holder, 1 where no other document holds the span
    assert all(0.5 <= m["p_null"] <= 1.0 for m in metrics[:2]) and min(m["p_null"] for m in metrics[:2]) < 1.0
    assert ["span_recoverable" in m for m in metrics] == [False, False, True, True]


def test_the_copy_warmup_reads_the_own_block_with_the_masked_span_in_it(tmp_path, tokenizer, tiny_retriever):
    """--reader-warmup copy: each masked sentence's one block is its own, whole, so the reader input holds the
    masked wordpieces in the same words (the context warm-up cuts them out); copy+context alternates the two."""
    store = _store(tmp_path, tokenizer)
    kinds = ["copy", "context", "copy+context"]
    sentences, rows, block_doc_ids, batches = _warmup_batches(store, tokenizer, tiny_retriever, kinds)
    copy, context = batches["copy"], batches["context"]
    assert copy.candidate_ids.tolist() == context.candidate_ids.tolist()  # the same block: the sentence's own
    assert [block_doc_ids[z] for z in copy.candidate_ids[:, 1]] == [sentences.doc_ids[i] for i in rows]

    def block_part(batch, b: int) -> str:  # the wordpieces after [CLS] x_masked [SEP] of query b's one block
        ids = [t for t in batch.reader["input_ids"][2 * b + 1].tolist() if t != tokenizer.pad_token_id]
        return " ".join(map(str, ids[ids.index(tokenizer.sep_token_id) + 1 :]))

    for b, i in enumerate(rows):
        sentence = " ".join(map(str, tokenizer(sentences.texts[i], add_special_tokens=False)["input_ids"]))
        span = " ".join(map(str, copy.targets[b][copy.mask_valid[b]].tolist()))
        assert sentence in block_part(copy, b) and sentence not in block_part(context, b)
        assert span in block_part(copy, b)
        assert block_part(batches["copy+context"], b) == block_part(copy if b % 2 == 0 else context, b)
    assert len(rows) > 2
