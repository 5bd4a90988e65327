"""Hybrid retrieval: the union of the dense and BM25 top max(k, HYBRID_POOL), ranked by f(x, z) + w · BM25(x, z)."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import build_tiny_index

from realm.data.qa_examples import load_qa
from realm.data.question_sets import question_file
from realm.index.mips import MipsIndex
from realm.index.search import HYBRID_POOL, BM25Searcher, DenseSearcher, HybridSearcher, union_candidates

QUERIES = ["capital of Japan", "Who composed in the Baroque period?", "the of and", "river flowing into the sea"]


def test_union_keeps_dense_order_first_and_drops_repeats():
    dense = np.array([[3, 1, -1], [0, 2, 4]])
    sparse = np.array([[1, 5, -1], [-1, -1, -1]])
    assert union_candidates(dense, sparse).tolist() == [[3, 1, 5, -1, -1, -1], [0, 2, 4, -1, -1, -1]]


def test_bm25_scores_of_given_blocks_agree_with_its_search(tiny_corpus):
    bm25 = BM25Searcher(tiny_corpus)
    top_scores, top_ids = bm25.top(QUERIES, 3)
    assert np.allclose(bm25.scores(QUERIES, top_ids), np.where(top_ids >= 0, top_scores, 0.0), atol=1e-6)
    assert (top_ids[2] == -1).all() and not bm25.scores(QUERIES[2:3], np.array([[0, 1]])).any()  # stopwords only
    assert bm25.scores(QUERIES[:1], np.array([[-1, len(tiny_corpus) + 7]])).tolist() == [[0.0, 0.0]]


@pytest.mark.parametrize("weight", [0.0, 0.7, 1e4])
def test_hybrid_ranks_the_union_by_fused_score(tmp_path, tiny_corpus, tiny_retriever, weight):
    build_tiny_index(tiny_corpus, tiny_retriever, tmp_path / "index")
    index = MipsIndex(tmp_path / "index")
    dense, bm25 = DenseSearcher(index, tiny_retriever, tiny_corpus), BM25Searcher(tiny_corpus)
    hybrid = HybridSearcher(dense, bm25, weight)
    k = 2
    vectors = tiny_retriever.embed_queries(QUERIES).numpy()
    for q, (query, hits) in enumerate(zip(QUERIES, hybrid.batch_search(QUERIES, k))):
        depth = max(k, HYBRID_POOL)
        pool = {h.block_id for h in dense.search(query, depth)} | {h.block_id for h in bm25.search(query, depth)}
        ids = np.array(sorted(pool))
        fused = index.stored_vectors(ids) @ vectors[q] + weight * bm25.scores([query], ids[None])[0]
        expected = ids[np.argsort(-fused, kind="stable")][:k]
        assert [h.block_id for h in hits] == expected.tolist()
        assert [h.score for h in hits] == pytest.approx(sorted(fused, reverse=True)[:k], rel=1e-4, abs=1e-4)
        if weight == 1e4 and bm25.search(query, k):  # BM25 dominates: its own top first
            assert hits[0].block_id == bm25.search(query, k)[0].block_id


def test_the_hybrid_top_blocks_do_not_depend_on_how_many_are_asked_for(tmp_path, squad_slice, tiny_retriever):
    """One candidate pool: the top k are the same blocks whether k or 20 are asked for, so `eval qa --recall-k 20`
    reads the blocks `ask` and `serve` read. cf41f60 ranked the union of the two top-k lists, so a deeper search
    brought blocks into the top that a shallow one never saw (here 11 of 100 questions differ at k = 3)."""
    build_tiny_index(squad_slice, tiny_retriever, tmp_path / "index")
    index = MipsIndex(tmp_path / "index")
    hybrid = HybridSearcher(DenseSearcher(index, tiny_retriever, squad_slice), BM25Searcher(squad_slice), 4.0)
    questions = [e.question for e in load_qa(question_file("squad-open-dev"))[:100]]
    deep = hybrid.batch_search(questions, 20)
    for k in (1, 3, 5):
        shallow = hybrid.batch_search(questions, k)
        assert [[h.block_id for h in row] for row in shallow] == [[h.block_id for h in row[:k]] for row in deep]
        assert [[h.score for h in row] for row in shallow] == [[h.score for h in row[:k]] for row in deep]
