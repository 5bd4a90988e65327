"""Typed search over a knowledge corpus: the dense REALM retriever, and BM25 as the sparse baseline.

Both searchers answer `search(query, k)` and `batch_search(queries, k)` with `SearchHit`s, best first.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from realm.data.blocks import BlockStore
from realm.index.mips import MipsIndex
from realm.models.realm import RealmModel, select_candidates
from realm.models.retriever import Retriever

logging.getLogger("bm25s").setLevel(logging.WARNING)  # it logs every index build at DEBUG


@dataclass(frozen=True)
class SearchHit:
    block_id: int
    doc_id: str
    score: float
    title: str
    text: str


class Searcher(Protocol):
    store: BlockStore  # the knowledge it searches
    # True: SearchHit.score is the retrieval logit f(x, z), so softmax over hits gives p(z | x). False: a score
    # that only ranks (BM25), so a reader marginalises with a uniform p(z | x).
    scores_are_retrieval_logits: bool

    def batch_search(self, queries: list[str], k: int) -> list[list[SearchHit]]: ...

    def search(self, query: str, k: int) -> list[SearchHit]: ...


def _hits(store: BlockStore, scores: np.ndarray, ids: np.ndarray) -> list[list[SearchHit]]:
    """(Q, k) scores and block ids -> hits with titles and text (one Arrow take for the whole batch)."""
    valid = ids >= 0
    blocks = iter(store.take(ids[valid].tolist()))
    out: list[list[SearchHit]] = []
    for row_scores, row_ids, row_valid in zip(scores, ids, valid):
        row = []
        for score, block_id, ok in zip(row_scores, row_ids, row_valid):
            if ok:
                block = next(blocks)
                row.append(SearchHit(int(block_id), block.doc_id, float(score), block.title, block.body))
        out.append(row)
    return out


class DenseSearcher:
    """MIPS over Embed_doc with queries embedded by Embed_input; refuses an index built by another doc tower."""

    scores_are_retrieval_logits = True

    def __init__(self, index: MipsIndex, retriever: Retriever, corpus: BlockStore | None = None):
        index.check_doc_tower(retriever.doc_fingerprint())
        self.index = index
        self.retriever = retriever
        self.store = corpus or index.corpus()

    def batch_search(self, queries: list[str], k: int) -> list[list[SearchHit]]:
        vectors = self.retriever.embed_queries(queries).numpy()  # (Q, D)
        scores, ids = self.index.search(vectors, k)
        return _hits(self.store, scores, ids)

    def search(self, query: str, k: int) -> list[SearchHit]:
        return self.batch_search([query], k)[0]


class BM25Searcher:
    """Okapi BM25 (bm25s, English stopwords) over `title + body` of the live blocks (an index version's
    knowledge, without removed documents, when `store` comes from `MipsIndex.corpus()`)."""

    scores_are_retrieval_logits = False

    def __init__(self, store: BlockStore):
        import bm25s  # only BM25 needs it (a GPU image may not have it)

        self.store = store
        self.ids = store.live_ids  # BM25 row -> block id
        titles, bodies = store.slice(0, len(store))
        texts = [f"{titles[i]}\n{bodies[i]}" for i in self.ids]
        tokens = bm25s.tokenize(texts, stopwords="en", show_progress=False)
        self.model = bm25s.BM25()
        self.model.index(tokens, show_progress=False)

    def batch_search(self, queries: list[str], k: int) -> list[list[SearchHit]]:
        k = min(k, len(self.ids))
        import bm25s

        tokens = bm25s.tokenize(queries, stopwords="en", return_ids=False, show_progress=False)
        rows, scores = self.model.retrieve(tokens, k=k, show_progress=False, n_threads=0)
        ids = np.where(scores > 0, self.ids[rows], -1)  # a block sharing no term with the query is not a hit
        return _hits(self.store, scores, ids)

    def search(self, query: str, k: int) -> list[SearchHit]:
        return self.batch_search([query], k)[0]


def search_all(searcher: Searcher, queries: list[str], k: int, batch_size: int = 256) -> list[list[SearchHit]]:
    """`batch_search` in batches, so a whole evaluation set never sits in one embedding batch."""
    hits: list[list[SearchHit]] = []
    for start in range(0, len(queries), batch_size):
        hits += searcher.batch_search(queries[start : start + batch_size], k)
    return hits


EXTRA_RETRIEVED = 8  # retrieve this many more than needed, so candidates survive the trivial-retrieval filter


def retrieve(
    model: RealmModel,
    index: MipsIndex,
    query: dict[str, torch.Tensor],
    block_doc_ids: np.ndarray,
    source_doc_ids: list[str],
    num_retrieved: int,
) -> np.ndarray:
    """Top candidates for masked queries from the (possibly stale) index, trivial ones dropped: (B, K-1)."""
    with torch.no_grad():
        vectors = model.retriever.query_vectors(query)
    _, ids = index.search(vectors, num_retrieved + EXTRA_RETRIEVED)
    return select_candidates(ids, block_doc_ids, source_doc_ids, num_retrieved)
