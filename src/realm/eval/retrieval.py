"""Retrieval quality: recall@k (does a top-k block hold a reference answer?), and nDCG@10 / recall@100 against
graded relevance judgements of documents (BEIR-format sets, data/beir.py)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from realm.data.qa_examples import AnswerBlocks, QAExample, has_answer
from realm.eval.intervals import bootstrap_interval, paired_difference
from realm.index.search import SearchHit


def first_answer_ranks(examples: Sequence[QAExample], hits: Sequence[Sequence[SearchHit]]) -> list[int | None]:
    """Per question, the rank (0-based) of its first answer-bearing block, or None."""
    if len(examples) != len(hits):
        raise ValueError(f"{len(examples)} examples but {len(hits)} result lists")
    return [
        next((rank for rank, hit in enumerate(row) if has_answer(hit.text, example)), None)
        for example, row in zip(examples, hits)
    ]


def recall_at_k(
    examples: Sequence[QAExample], hits: Sequence[Sequence[SearchHit]], ks: Sequence[int]
) -> dict[str, float]:
    """Percent of questions with an answer-bearing block among the top k, for each k."""
    return recall_from_ranks(first_answer_ranks(examples, hits), ks)


def recall_from_ranks(first_hit: Sequence[int | None], ks: Sequence[int]) -> dict[str, float]:
    """recall@k from each question's first answer rank (first_answer_ranks)."""
    return {f"recall@{k}": 100.0 * sum(r is not None and r < k for r in first_hit) / len(first_hit) for k in ks}


def paired_recall(first_a: Sequence[int | None], first_b: Sequence[int | None], ks: Sequence[int]) -> dict[str, dict]:
    """recall@k of retriever a minus b over the same questions (their first answer ranks), each with its paired
    95% bootstrap interval (in points)."""
    paired = {}
    for k in ks:
        a, b = ([100.0 * (r is not None and r < k) for r in ranks] for ranks in (first_a, first_b))
        difference, (low, high) = paired_difference(a, b)
        paired[f"recall@{k}"] = {"difference": round(difference, 2), "difference_95ci": [round(low, 2), round(high, 2)]}
    return paired


def answer_in_corpus(bodies: Sequence[str], examples: Sequence[QAExample]) -> list[bool]:
    """Per question, does any block hold a reference answer (`has_answer`)? The ceiling of recall at any depth: a
    question whose answer the corpus lacks cannot be answered from it. Regex answers search all the text at once."""
    answers, joined = AnswerBlocks(bodies), None
    found = []
    for example in examples:
        holding = answers.holding(example)
        if holding is None:
            joined = joined if joined is not None else "\n\n".join(bodies)
            found.append(has_answer(joined, example))
        else:
            found.append(len(holding) > 0)
    return found


BEIR_NDCG_CUT = 10
BEIR_RECALL_CUT = 100


def document_ranking(hits: Sequence[SearchHit]) -> list[tuple[str, float]]:
    """Blocks -> documents: a document's score is its best block's (MaxP), in the order of the hits."""
    best: dict[str, float] = {}
    for hit in hits:
        best.setdefault(hit.doc_id, hit.score)  # the hits are best first
    return list(best.items())


def trec_ndcg_recall(
    ranking: Sequence[tuple[str, float]],
    judged: dict[str, int],
    query_id: str | None = None,
    ndcg_cut: int = BEIR_NDCG_CUT,
    recall_cut: int = BEIR_RECALL_CUT,
) -> tuple[float, float]:
    """nDCG@ndcg_cut and recall@recall_cut of one query as trec_eval computes them (pytrec_eval's `ndcg_cut` and
    `recall`, which BEIR's EvaluateRetrieval calls): the run sorted by score, ties by document id descending;
    gain = the judged relevance (linear), discount log2(rank + 1), the ideal DCG from the judgements; relevant means
    relevance >= 1; no relevant document: 0. With `query_id`, a document of that id is dropped first (BEIR's
    `ignore_identical_ids`: in ArguAna and Quora a query is also a document)."""
    run = sorted(
        sorted((pair for pair in ranking if pair[0] != query_id), key=lambda pair: pair[0], reverse=True),
        key=lambda pair: pair[1],
        reverse=True,
    )  # trec_eval's order: score descending, then document id descending
    gains = sorted((rel for rel in judged.values() if rel > 0), reverse=True)
    if not gains:
        return 0.0, 0.0
    dcg = sum(max(judged.get(doc, 0), 0) / math.log2(rank + 2) for rank, (doc, _) in enumerate(run[:ndcg_cut]))
    ideal = sum(gain / math.log2(rank + 2) for rank, gain in enumerate(gains[:ndcg_cut]))
    found = sum(judged.get(doc, 0) >= 1 for doc, _ in run[:recall_cut])
    return dcg / ideal, found / len(gains)


def beir_metrics(
    query_ids: Sequence[str],
    qrels: dict[str, dict[str, int]],
    hits: Sequence[Sequence[SearchHit]],
    ignore_identical_ids: bool = True,
) -> dict[str, tuple[float, tuple[float, float]]]:
    """nDCG@10 and recall@100 over the queries (BEIR's means): name -> (mean, its 95% bootstrap interval)."""
    if len(query_ids) != len(hits):
        raise ValueError(f"{len(query_ids)} queries but {len(hits)} result lists")
    per_query = [
        trec_ndcg_recall(document_ranking(row), qrels[query_id], query_id if ignore_identical_ids else None)
        for query_id, row in zip(query_ids, hits)
    ]
    ndcg, recall = [n for n, _ in per_query], [r for _, r in per_query]
    return {
        f"ndcg@{BEIR_NDCG_CUT}": (float(np.mean(ndcg)), bootstrap_interval(ndcg)),
        f"recall@{BEIR_RECALL_CUT}": (float(np.mean(recall)), bootstrap_interval(recall)),
    }
