"""Masked-span accuracy of a (retriever, reader) pair on held-out sentences: how much retrieval helps the LM.

Each sentence gets one salient span masked (seeded, so every model sees the same masks). With an index,
candidates are retrieved as in training (trivial ones dropped, null document first) and the prediction
is the argmax of the marginal sum_z p(z | x) p(y_j | z, x); without one, the null document alone.
"""

from __future__ import annotations

import numpy as np
import torch

from realm.corpus import BlockStore
from realm.index import MipsIndex
from realm.pretrain_data import SentenceSet, mask_sentence
from realm.realm_model import RealmModel, make_batch, pad_queries, retrieve
from realm.training import example_rng

EVAL_SEED = 12345


@torch.no_grad()
def masked_span_accuracy(model: RealmModel, sentences: SentenceSet, store: BlockStore, index: MipsIndex | None,
                         num_candidates: int, query_max_tokens: int, max_masks: int = 10, limit: int | None = None,
                         batch_size: int = 16) -> dict[str, float]:
    """Token accuracy, whole-span accuracy, mean p(null) and mean retrieval utility over the sentences."""
    model.eval()
    tokenizer = model.retriever.tokenizer
    block_doc_ids = np.array(store.column("doc_id"), dtype=object)
    n = min(limit or len(sentences), len(sentences))
    tokens = correct_tokens = spans = correct_spans = 0
    p_null = utility = 0.0
    for start in range(0, n, batch_size):
        rows = range(start, min(start + batch_size, n))
        queries = [mask_sentence(sentences.texts[i], sentences.spans[i], "salient", tokenizer, query_max_tokens,
                                 max_masks, example_rng(EVAL_SEED, 0, i)) for i in rows]
        retrieved = np.empty((len(queries), 0), dtype=np.int64)
        if index is not None and num_candidates > 1:
            query, *_ = pad_queries(queries, tokenizer.pad_token_id)
            retrieved = retrieve(model, index, query, block_doc_ids, [sentences.doc_ids[i] for i in rows],
                                 num_candidates - 1)
        batch = make_batch(queries, retrieved, store, tokenizer, store.config)
        _, stats = model(batch)
        hits = stats["correct"]  # (B, M) bool, False on padding
        valid = batch.mask_valid
        tokens += int(valid.sum())
        correct_tokens += int(hits.sum())
        spans += len(queries)
        correct_spans += int((hits | ~valid).all(dim=1).sum())
        p_null += stats["p_null"].item() * len(queries)
        utility += stats["utility"].item() * len(queries)
    model.train()
    return {"token_accuracy": 100 * correct_tokens / tokens, "span_accuracy": 100 * correct_spans / spans,
            "p_null": p_null / spans, "utility": utility / spans, "sentences": spans}
