"""Retrieval recall@k: does a top-k block hold a reference answer?"""

from __future__ import annotations

from collections.abc import Sequence

from realm.data.qa_examples import QAExample, has_answer
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
