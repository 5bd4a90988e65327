"""The hybrid retriever's BM25 weight w: likelihood and recall of f(x, z) + w · BM25(x, z) over a grid of w.

For each question, the candidates are the union of the dense and the BM25 top `--beam` (as in fine-tuning);
a candidate is positive when it holds a reference answer. For each w it prints the mean log-likelihood of the
positives, log sum_{z+} softmax_z (f + w · BM25), over questions with one (what fine-tuning's retrieval loss
maximises), and recall@k of the fused ranking; then the maximum-likelihood w. Fit it on training questions;
read recall on dev questions. Two more fusions for comparison: the same sum with BM25 divided by its maximum
over the query's candidates (BM25's scale varies with the query's terms; f's does not), and reciprocal rank
fusion (Cormack et al. 2009, sum of 1 / (60 + rank); no weight, not differentiable, a reference only).

    python experiments/hybrid_weight.py --model minilm --index data/exp/index \
        --qa squad-open-train --limit 2000
"""

from __future__ import annotations

import argparse

import numpy as np

from realm.config import get_preset
from realm.data.qa_examples import has_answer, load_qa
from realm.index.mips import MipsIndex
from realm.index.search import BM25Searcher, hybrid_candidates
from realm.models.retriever import Retriever

GRID = (0.0, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.8, 1.0, 1.5, 2.0, 4.0, 1e3)
NORMALISED_GRID = (2.0, 4.0, 6.0, 8.0, 10.0, 12.0, 15.0, 20.0, 30.0)
RRF_K = 60


def logsumexp(x: np.ndarray) -> np.ndarray:
    """(Q, C) -> (Q,), -inf entries allowed (a row of only -inf gives -inf)."""
    top = x.max(1, keepdims=True)
    top = np.where(np.isfinite(top), top, 0.0)
    with np.errstate(divide="ignore"):
        return np.log(np.exp(x - top).sum(1)) + top[:, 0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="minilm")
    parser.add_argument("--index", required=True)
    parser.add_argument("--qa", required=True)
    parser.add_argument("--limit", type=int, default=2000)
    parser.add_argument("--beam", type=int, default=100, help="candidates from each retriever")
    parser.add_argument("--ks", default="1,5,20")
    parser.add_argument("--no-stemming", action="store_true", help="BM25 over exact word forms (the baseline)")
    args = parser.parse_args()
    ks = [int(k) for k in args.ks.split(",")]

    examples = load_qa(args.qa)[: args.limit]
    index = MipsIndex(args.index)
    store = index.corpus()
    retriever = Retriever.load(args.model, index.retriever_config(get_preset("cpu").retriever))
    sparse = BM25Searcher(store, stemmer=None if args.no_stemming else "english")
    questions = [e.question for e in examples]
    vectors = retriever.embed_queries(questions).numpy()  # (Q, D)
    ids, bm25 = hybrid_candidates(index, sparse, questions, vectors, args.beam)  # (Q, C)
    valid = ids >= 0
    dense = np.einsum("qcd,qd->qc", index.stored_vectors(np.where(valid, ids, index.block_ids[0])), vectors)
    unique = np.unique(ids[valid])
    texts = dict(zip(unique.tolist(), (b.body for b in store.take(unique.tolist()))))
    positive = np.array(
        [
            [ok and has_answer(texts[int(i)], e) for i, ok in zip(row, row_ok)]
            for e, row, row_ok in zip(examples, ids, valid)
        ]
    )
    has_positive = positive.any(1)
    print(
        f"{len(examples)} questions of {args.qa}; union of dense and BM25 top {args.beam}: "
        f"{valid.sum(1).mean():.1f} candidates a question, {100 * has_positive.mean():.1f}% with a positive"
    )

    def row(label: str, logits: np.ndarray) -> float:
        logits = np.where(valid, logits, -np.inf)  # (Q, C)
        likelihood = float((logsumexp(np.where(positive, logits, -np.inf)) - logsumexp(logits))[has_positive].mean())
        order = np.argsort(-logits, axis=1, kind="stable")
        ranked = np.take_along_axis(positive, order, 1)
        recalls = [100 * ranked[:, :k].any(1).mean() for k in ks]
        print(f"| {label} | {likelihood:.3f} | " + " | ".join(f"{r:.2f}" for r in recalls) + " |")
        return likelihood

    print("| fusion | log-likelihood of positives | " + " | ".join(f"recall@{k}" for k in ks) + " |")
    print("|---|---:|" + "---:|" * len(ks))
    best = max((row(f"f + {w:g} · BM25", dense + w * bm25), w) for w in GRID)
    normalised = bm25 / np.maximum(bm25.max(1, keepdims=True), 1e-6)  # (Q, C) in [0, 1]
    best_normalised = max((row(f"f + {w:g} · BM25 / max BM25", dense + w * normalised), w) for w in NORMALISED_GRID)
    rank = lambda scores: np.argsort(np.argsort(-np.where(valid, scores, -np.inf), 1, kind="stable"), 1)  # noqa: E731
    row("reciprocal rank fusion", 1 / (RRF_K + rank(dense)) + 1 / (RRF_K + rank(np.where(bm25 > 0, bm25, -1.0))))
    print(f"maximum-likelihood w on these grids: {best[1]:g} (raw BM25), {best_normalised[1]:g} (normalised)")


if __name__ == "__main__":
    main()
