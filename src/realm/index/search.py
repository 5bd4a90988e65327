"""Typed search over a knowledge corpus: the dense REALM retriever, BM25, and the hybrid of the two.

Every searcher answers `search(query, k)` and `batch_search(queries, k)` with `SearchHit`s, best first.
Hybrid retrieval ranks one candidate pool, the union of the dense and the BM25 top max(k, HYBRID_POOL), by

    f_hybrid(x, z) = Embed_input(x) · Embed_doc(z) + w · BM25(x, z)

with w learned in QA fine-tuning (models/orqa.py): the dense score of a BM25-only block comes from its
stored vector, the BM25 score of a dense-only block from BM25 itself, so both terms are exact for every
candidate. p(z | x) = softmax over the candidates of f_hybrid. The pool does not depend on k up to HYBRID_POOL,
so the top 5 are the same blocks whether 5 or 20 are asked for: `eval qa` (recall@20), `ask`, `serve` and
fine-tuning (its beam, its dev score) give the reader the same blocks (`hybrid_top`).
"""

from __future__ import annotations

import dataclasses
import logging
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from realm.data.blocks import BlockStore
from realm.index.mips import MipsIndex
from realm.models.orqa import DEFAULT_BM25_WEIGHT
from realm.models.realm import RealmModel, select_candidates
from realm.models.retriever import Retriever

HYBRID_POOL = 100  # hybrid ranking: the union of the dense and the BM25 top max(k, HYBRID_POOL) (the cpu beam)


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
    # the deepest k for which search(q, k)[:j] == search(q, j) for every j <= k (one deep search serves every depth)
    prefix_depth: int

    def batch_search(self, queries: list[str], k: int) -> list[list[SearchHit]]: ...

    def search(self, query: str, k: int) -> list[SearchHit]: ...


def retrieval_logits(hits: Sequence[SearchHit], scores_are_retrieval_logits: bool) -> torch.Tensor:
    """(K,) the logits of p(z | x) among these hits, as the reader weighs them: f(x, z), or zeros (uniform) when the
    searcher's scores only rank (BM25)."""
    if not scores_are_retrieval_logits:
        return torch.zeros(len(hits))
    return torch.tensor([hit.score for hit in hits], dtype=torch.float32)


def hits_json(hits: Sequence[SearchHit], scores_are_retrieval_logits: bool) -> list[dict]:
    """What `realm search --json` prints and `POST /search` returns: each hit with its p(z | x) among these hits."""
    probs = torch.softmax(retrieval_logits(hits, scores_are_retrieval_logits), 0).tolist()
    return [{**dataclasses.asdict(hit), "retrieval_prob": p} for hit, p in zip(hits, probs)]


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
    prefix_depth = sys.maxsize

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
    """Okapi BM25 (bm25s, English stopwords, Snowball English stemming: Lucene's English analyser, which pyserini's
    BM25 uses, stems too) over `title + body` of the live blocks (an index version's knowledge, without removed
    documents, when `store` comes from `MipsIndex.corpus()`). `stemmer=None`: exact word forms (docs/log
    compares the two)."""

    scores_are_retrieval_logits = False
    prefix_depth = sys.maxsize

    def __init__(self, store: BlockStore, stemmer: str | None = "english"):
        import bm25s  # only BM25 needs it (a GPU image may not have it)

        logging.getLogger("bm25s").setLevel(logging.WARNING)  # its import sets DEBUG: a line per index build

        self.store = store
        self.stemmer = _snowball(stemmer)
        self.ids = store.live_ids  # BM25 row -> block id
        titles, bodies = store.slice(0, len(store))
        texts = [f"{titles[i]}\n{bodies[i]}" for i in self.ids]
        tokens = bm25s.tokenize(texts, stopwords="en", stemmer=self.stemmer, show_progress=False)
        self.model = bm25s.BM25()
        self.model.index(tokens, show_progress=False)

    def _tokenize(self, queries: list[str]) -> list[list[str]]:
        import bm25s

        return bm25s.tokenize(queries, stopwords="en", stemmer=self.stemmer, return_ids=False, show_progress=False)

    def top(self, queries: list[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        """(Q, k) BM25 scores and block ids, best first; id -1 where a block shares no term with the query."""
        k = min(k, len(self.ids))
        rows, scores = self.model.retrieve(self._tokenize(queries), k=k, show_progress=False, n_threads=0)
        return scores, np.where(scores > 0, self.ids[rows], -1)

    def scores(self, queries: list[str], block_ids: np.ndarray) -> np.ndarray:
        """(Q, R) BM25(x, z) of the given blocks (0 at id -1 and for blocks outside this knowledge)."""
        rows = np.clip(np.searchsorted(self.ids, block_ids), 0, len(self.ids) - 1)  # (Q, R)
        known = (block_ids >= 0) & (self.ids[rows] == block_ids)
        out = np.zeros(block_ids.shape, dtype=np.float32)
        for q, tokens in enumerate(self._tokenize(queries)):
            if tokens:  # a query of stopwords only scores 0 everywhere
                out[q] = np.where(known[q], self.model.get_scores(tokens)[rows[q]], 0.0)
        return out

    def batch_search(self, queries: list[str], k: int) -> list[list[SearchHit]]:
        return _hits(self.store, *self.top(queries, k))

    def search(self, query: str, k: int) -> list[SearchHit]:
        return self.batch_search([query], k)[0]


def _snowball(language: str | None):
    """A PyStemmer stemmer (what bm25s calls as `stemmer.stemWords`), or None."""
    if language is None:
        return None
    import Stemmer

    return Stemmer.Stemmer(language)


def union_candidates(dense_ids: np.ndarray, sparse_ids: np.ndarray) -> np.ndarray:
    """(Q, R1) and (Q, R2) block ids (-1: none) -> (Q, R1 + R2) their union per row, dense first, -1 padded."""
    out = np.full((len(dense_ids), dense_ids.shape[1] + sparse_ids.shape[1]), -1, dtype=np.int64)
    for q, (dense, sparse) in enumerate(zip(dense_ids, sparse_ids)):
        row = list(dict.fromkeys(int(i) for i in (*dense, *sparse) if i >= 0))
        out[q, : len(row)] = row
    return out


def hybrid_candidates(
    index: MipsIndex, sparse: BM25Searcher, queries: list[str], vectors: np.ndarray, k: int
) -> tuple[np.ndarray, np.ndarray]:
    """Query vectors (Q, D) -> the union of the dense and BM25 top k: block ids (Q, C), -1 padded, and their
    BM25(x, z) (Q, C)."""
    _, dense_ids = index.search(vectors, k)
    ids = union_candidates(dense_ids, sparse.top(queries, k)[1])
    return ids, sparse.scores(queries, ids)


def rank_hybrid(
    index: MipsIndex, vectors: np.ndarray, ids: np.ndarray, bm25: np.ndarray, weight: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Candidates (Q, C) (-1: none) with their BM25(x, z), sorted by f(x, z) + w · BM25(x, z), best first:
    (logits, ids, bm25), each (Q, C); logit -inf at -1."""
    stored = index.stored_vectors(np.where(ids >= 0, ids, index.block_ids[0]))  # (Q, C, D)
    logits = np.where(ids >= 0, np.einsum("qcd,qd->qc", stored, vectors) + weight * bm25, -np.inf)  # (Q, C)
    order = np.argsort(-logits, axis=1, kind="stable")
    return tuple(np.take_along_axis(a, order, 1) for a in (logits, ids, bm25))  # type: ignore[return-value]


def hybrid_ranking(
    index: MipsIndex, sparse: BM25Searcher, queries: list[str], vectors: np.ndarray, weight: float, depth: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The union of the dense and the BM25 top `depth`, ranked by f(x, z) + w · BM25(x, z): (logits, ids, bm25),
    each (Q, C), best first (-1 / -inf where a row has fewer candidates)."""
    ids, bm25 = hybrid_candidates(index, sparse, queries, vectors, depth)
    return rank_hybrid(index, vectors, ids, bm25, weight)


def hybrid_top(
    index: MipsIndex, sparse: BM25Searcher, queries: list[str], vectors: np.ndarray, weight: float, k: int
) -> tuple[np.ndarray, np.ndarray]:
    """The hybrid top k, the one candidate pool every hybrid search ranks (module doc): logits and ids, (Q, k)."""
    logits, ids, _ = hybrid_ranking(index, sparse, queries, vectors, weight, max(k, HYBRID_POOL))
    return logits[:, :k], ids[:, :k]


class HybridSearcher:
    """The union of the dense and the BM25 top k, ranked by f(x, z) + w · BM25(x, z) (module doc)."""

    scores_are_retrieval_logits = True
    prefix_depth = HYBRID_POOL

    def __init__(self, dense: DenseSearcher, sparse: BM25Searcher, bm25_weight: float):
        self.dense = dense
        self.sparse = sparse
        self.bm25_weight = bm25_weight
        self.store = dense.store

    def batch_search(self, queries: list[str], k: int) -> list[list[SearchHit]]:
        vectors = self.dense.retriever.embed_queries(queries).numpy()  # (Q, D)
        return _hits(self.store, *hybrid_top(self.dense.index, self.sparse, queries, vectors, self.bm25_weight, k))

    def search(self, query: str, k: int) -> list[SearchHit]:
        return self.batch_search([query], k)[0]


def open_searcher(
    index: MipsIndex,
    kind: str,
    retriever: Retriever | None = None,
    bm25_weight: float = DEFAULT_BM25_WEIGHT,
    store: BlockStore | None = None,
    bm25: BM25Searcher | None = None,
) -> Searcher:
    """Every searcher over an index version: `dense` (refuses an index built by another document tower), `bm25` over
    its live blocks (`store`: those blocks, read once by the caller; default `index.corpus()`), or `hybrid`, both
    fused with the weight w of f(x, z) + w · BM25(x, z) (`bm25`: a BM25 index the caller keeps)."""
    if kind not in ("dense", "bm25", "hybrid"):
        raise ValueError(f"unknown retriever {kind!r}: expected dense, bm25 or hybrid")
    store = store if store is not None else index.corpus()
    if kind == "bm25":
        return bm25 or BM25Searcher(store)
    if retriever is None:
        raise ValueError(f"the {kind} retriever needs a model (its query tower)")
    dense = DenseSearcher(index, retriever, store)
    return dense if kind == "dense" else HybridSearcher(dense, bm25 or BM25Searcher(store), bm25_weight)


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
