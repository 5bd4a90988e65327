"""Retrieval recall@k: does a top-k block hold a reference answer?"""

from __future__ import annotations

from collections.abc import Sequence

from realm.data.qa_examples import QAExample, has_answer
from realm.index.search import SearchHit


def recall_at_k(
    examples: Sequence[QAExample], hits: Sequence[Sequence[SearchHit]], ks: Sequence[int]
) -> dict[str, float]:
    """Percent of questions with an answer-bearing block among the top k, for each k."""
    if len(examples) != len(hits):
        raise ValueError(f"{len(examples)} examples but {len(hits)} result lists")
    first_hit = []  # rank (0-based) of the first answer-bearing block, or None
    for example, row in zip(examples, hits):
        first_hit.append(next((rank for rank, hit in enumerate(row) if has_answer(hit.text, example)), None))
    return {f"recall@{k}": 100.0 * sum(r is not None and r < k for r in first_hit) / len(examples) for k in ks}
