"""BM25 with Snowball stemming against exact word forms: recall@k of answer-bearing blocks on each question set,
and the paired recall@5 difference with its 95% bootstrap interval (both measured in the same run).

    python experiments/bm25_stemming.py --corpus runs/pre/corpus --qa squad-open-dev \
        --qa <WebQuestions train JSONL> --qa <CuratedTrec train .regex.jsonl>
"""

from __future__ import annotations

import argparse

import numpy as np

from realm.data.blocks import BlockStore
from realm.data.qa_examples import load_qa
from realm.eval.intervals import paired_difference
from realm.eval.retrieval import first_answer_ranks
from realm.index.search import BM25Searcher, search_all

KS = (1, 5, 20)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", required=True)
    parser.add_argument("--qa", action="append", required=True, help="a question set (repeatable)")
    parser.add_argument("--limit", type=int, default=2000, help="at most this many questions a set")
    args = parser.parse_args()
    store = BlockStore(args.corpus)
    searchers = {"exact word forms": BM25Searcher(store, stemmer=None), "stemmed": BM25Searcher(store)}
    print("| questions | BM25 | " + " | ".join(f"recall@{k}" for k in KS) + " |")
    print("|---|---|" + "---:|" * len(KS))
    for path in args.qa:
        examples = load_qa(path)[: args.limit]
        hits = {}
        for name, searcher in searchers.items():
            ranks = first_answer_ranks(examples, search_all(searcher, [e.question for e in examples], max(KS)))
            hits[name] = np.array([[r is not None and r < k for k in KS] for r in ranks], dtype=np.float64)
            recalls = " | ".join(f"{100 * hits[name][:, i].mean():.2f}" for i in range(len(KS)))
            print(f"| {path.rsplit('/', 1)[-1]} ({len(examples)}) | {name} | {recalls} |")
        difference, (low, high) = paired_difference(100 * hits["stemmed"][:, 1], 100 * hits["exact word forms"][:, 1])
        print(f"| | stemmed minus exact, recall@5 | {difference:+.2f} [{low:+.2f}, {high:+.2f}] | | |")


if __name__ == "__main__":
    main()
