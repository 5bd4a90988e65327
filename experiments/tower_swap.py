"""Which tower moved recall? Zero-shot recall@k of every query tower over every document tower's index.

REALM pretraining trains two towers; when its retriever's recall on questions differs from the warm start's,
pairing each run's query tower with each run's document tower (and that tower's index) tells which one moved
it. Each pair is a retriever of its own: the query tower of one checkpoint, the document tower of another, so
the index check (a document tower must be the one that built the index) still holds. The paired difference
in hit@5 is against the first `--retriever`'s own pair, over the same questions.

    python experiments/tower_swap.py --qa squad-open-dev \
        --retriever ict=runs/pre/ict/retriever=runs/ict_index --retriever realm=runs/pre/realm/retriever=runs/realm_index

Runs that kept the warm start's document tower (`--doc-tower fixed`) differ in their query towers alone:
--base-doc-tower scores each over the base's index only (n pairs, not n^2).
"""

from __future__ import annotations

import argparse

from pretrain_eval import KS, searcher_hits

from realm.config import get_preset
from realm.data.qa_examples import load_qa, tuning_split
from realm.data.sources import squad_question_titles
from realm.eval.intervals import paired_difference
from realm.index.mips import MipsIndex
from realm.index.search import open_searcher
from realm.models.retriever import Retriever

AT_5 = KS.index(5)  # the column the paired difference compares


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--qa", required=True, help="questions with answers")
    parser.add_argument(
        "--tuning",
        action="store_true",
        help="score the tuning split of --qa, a training file (whole held-out articles: tuning_split), as a choice "
        "between settings must; without it every question of --qa (a set to report)",
    )
    parser.add_argument("--qa-articles", help="a SQuAD file naming each --qa question's article (with --tuning)")
    parser.add_argument(
        "--retriever", action="append", required=True, help="NAME=RETRIEVER=INDEX (its document tower's); first: base"
    )
    parser.add_argument(
        "--base-doc-tower",
        action="store_true",
        help="pair every query tower with the base's document tower only (runs that kept it fixed: --doc-tower fixed)",
    )
    parser.add_argument("--preset", default="cpu")
    args = parser.parse_args()
    preset = get_preset(args.preset)
    questions = load_qa(args.qa, squad_question_titles(args.qa_articles))
    if args.tuning:
        questions = tuning_split(questions)[1]
    specs = [spec.split("=") for spec in args.retriever]
    if any(len(spec) != 3 for spec in specs):
        parser.error("every --retriever is NAME=RETRIEVER=INDEX")
    indexes = {name: MipsIndex(index) for name, _, index in specs}
    retrievers = {
        name: Retriever.load(folder, indexes[name].retriever_config(preset.retriever)) for name, folder, _ in specs
    }

    print(f"{len(questions)} questions of {args.qa}{' (its tuning split)' if args.tuning else ''}, zero-shot")
    print("| query tower | document tower (its index) | recall@1 | recall@5 | recall@20 | recall@5 minus base [95%] |")
    print("|---|---|---:|---:|---:|---:|")
    base = None
    for query_name, _, _ in specs:
        for doc_name, _, _ in specs[:1] if args.base_doc_tower else specs:
            q, d = retrievers[query_name], retrievers[doc_name]
            paired = Retriever(q.query_tower, d.doc_tower, d.tokenizer, d.config, d.null_score)
            hits = searcher_hits(open_searcher(indexes[doc_name], "dense", paired), questions)  # (Q, len(KS))
            base = hits if base is None else base
            diff, (low, high) = paired_difference(100 * hits[:, AT_5], 100 * base[:, AT_5])
            recalls = " | ".join(f"{100 * hits[:, i].mean():.2f}" for i in range(len(KS)))
            print(f"| {query_name} | {doc_name} | {recalls} | {diff:+.2f} [{low:+.2f}, {high:+.2f}] |")


if __name__ == "__main__":
    main()
