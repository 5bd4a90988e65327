"""Does REALM pretraining do what the paper says? Masked-span accuracy with and without retrieval, and the
retriever's zero-shot recall against its warm start, each with a paired 95% interval.

Held-out sentences come from documents no run's trainer saw as X (the smallest held-out share in the runs'
config.json; they stay in the knowledge corpus Z, minus the trivial retrievals); one salient span each is masked,
with the same seeded masks for every model. For each `--run` (a `realm train pretrain` output):
    - masked-token accuracy of its reader with retrieval (the marginal over the null document and the
      run's last index version) and with the null document alone, same masks, same forward pass; the paired
      gain of retrieval and its interval over sentences (`--every-span`: each salient span masked in turn), and
      the difference of its gain and the first run's, paired over the same sentences;
    - with `--examples`: its worked examples, picked as the pipeline's report picks them (the 3 of the first 100
      held-out sentences with a salient span where the top block raises p(span) the most), and whether the top
      block holds the span;
    - with `--qa`: zero-shot recall@k of its retriever (over `--run NAME=RUN=INDEX`, an index built from the
      run's final towers) and the paired difference in hit@5 against the `--warm-start` retriever, the
      baseline measured in the same run.

    python experiments/pretrain_eval.py --corpus runs/pipe120/corpus \
        --warm-start runs/pipe120/ict/retriever=runs/pipe120/ict_index/index \
        --run realm=runs/pipe120/realm=runs/pipe120/realm_index/index --qa squad-open-dev
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from realm.common.device import default_device
from realm.common.tokenization import load_tokenizer, minilm_dir
from realm.config import RUN_CONFIG, get_preset
from realm.data.blocks import BlockStore
from realm.data.qa_examples import load_qa
from realm.data.recoverable import SpanFinder
from realm.data.sentences import SentenceSet, build_sentences
from realm.eval.intervals import bootstrap_interval, paired_difference
from realm.eval.mlm import masked_span_accuracy, worked_examples
from realm.eval.retrieval import first_answer_ranks
from realm.index.mips import MipsIndex
from realm.index.search import Searcher, open_searcher, search_all
from realm.models.mlm_reader import Reader
from realm.models.realm import RealmModel
from realm.models.retriever import Retriever
from realm.pipeline.work import EXAMPLE_POOL, SCORING, held_out_scoring

KS = (1, 5, 20)


def searcher_hits(searcher: Searcher, questions: list) -> np.ndarray:
    """(Q, len(KS)) 0/1: does a top-k block hold an answer."""
    ranks = first_answer_ranks(questions, search_all(searcher, [q.question for q in questions], max(KS)))
    return np.array([[r is not None and r < k for k in KS] for r in ranks], dtype=np.float64)


def hits_at(retriever: str, index_dir: str, questions: list, preset) -> np.ndarray:
    index = MipsIndex(index_dir)
    return searcher_hits(
        open_searcher(index, "dense", Retriever.load(retriever, index.retriever_config(preset.retriever))), questions
    )


def held_out_fraction(run_dir: str) -> float:
    """The share of documents a `realm train pretrain` run kept out of its training sentences (its config.json)."""
    return json.loads((Path(run_dir) / RUN_CONFIG).read_text())["config"]["pretrain"]["held_out_fraction"]


def print_examples(name: str, corpus: Path, run_dir: Path, preset) -> None:
    """The run's worked examples as the pipeline's examples stage computes them (pipeline/work.py)."""
    model, held_out, store, index, finder = held_out_scoring(corpus, run_dir, preset)
    p = preset.pretrain
    examples = worked_examples(
        model, held_out, store, index, p.num_candidates, preset.retriever.query_max_tokens, p.max_masks,
        pool=EXAMPLE_POOL, finder=finder,
    )  # fmt: skip
    print(f"\n{name}: worked examples (of the first {EXAMPLE_POOL} held-out sentences with a salient span)")
    print("| masked sentence | span | top block | holds the span | p(span): null document -> top block -> marginal |")
    print("|---|---|---|---|---|")
    for e in examples:
        print(
            f"| {e.masked_sentence} | {e.answer} | {e.top_block_title} | {e.top_block_holds_span} | "
            f"{e.p_without_retrieval:.3f} -> {e.p_with_top_block:.3f} -> {e.p_marginal:.3f} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", required=True)
    parser.add_argument("--run", action="append", required=True, help="NAME=RUN_DIR[=INDEX of its final towers]")
    parser.add_argument("--warm-start", help="RETRIEVER=INDEX: the baseline for zero-shot recall")
    parser.add_argument("--qa", help="questions for zero-shot recall (needs --warm-start and each run's INDEX)")
    parser.add_argument("--preset", default="cpu")
    parser.add_argument(
        "--limit", type=int, help="a seeded sample of this many held-out sentences with a salient span (default: all)"
    )
    parser.add_argument(
        "--every-span",
        action="store_true",
        help="mask each salient span of a sentence in turn (more masks, a tighter interval) instead of one seeded span",
    )
    parser.add_argument("--examples", action="store_true", help="also print each run's worked examples")
    parser.add_argument(
        "--part",
        choices=["tuning", "test"],
        default="tuning",
        help="which half of the held-out documents: tuning (to compare settings, the default) or test (what runs "
        "report; to report a chosen setting)",
    )
    args = parser.parse_args()
    preset = get_preset(args.preset)
    store = BlockStore(args.corpus)
    runs = [spec.split("=") for spec in args.run]
    fraction = min(held_out_fraction(run_dir) for _, run_dir, *_ in runs)  # sentences no run trained on
    held_out = SentenceSet(build_sentences(store, progress=False), fraction, part=args.part)
    print(
        f"{len(held_out)} held-out sentences of the {args.part} part from {len(set(held_out.doc_ids))} documents "
        f"(of the {fraction:.0%} every run held out); scoring {args.limit or 'all'}"
    )
    k = preset.pretrain.num_candidates

    tokenizer = load_tokenizer(minilm_dir())  # the cpu preset's tokenizer normalises the words
    finder = SpanFinder(store, tokenizer)
    if args.limit:  # a seeded sample spread over the part, as the pipeline draws its own (not the first in order)
        tokens, masks = preset.retriever.query_max_tokens, preset.pretrain.max_masks
        held_out = held_out.with_salient_spans(tokenizer, tokens, masks).sample(args.limit, SCORING["sample_seed"])
    print(
        f"\n| run | masked spans (sentences) | token acc. with retrieval ({k} candidates) | null document only "
        "| gain [95%] | p(null) | recoverable / retrieved spans | gain on retrieved spans [95%] "
        f"| gain minus {runs[0][0]}'s, paired [95%] |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    first_gains = None
    for name, run_dir, *_ in runs:
        model = RealmModel(
            Retriever.load(str(Path(run_dir) / "retriever"), preset.retriever),
            Reader.load(str(Path(run_dir) / "reader")),
        ).to(default_device())
        r = masked_span_accuracy(
            model,
            held_out,
            store,
            MipsIndex(Path(run_dir) / "index"),
            k,
            preset.retriever.query_max_tokens,
            preset.pretrain.max_masks,
            limit=None,
            every_span=args.every_span,
            finder=finder,
        )
        low, high = r["retrieval_gain_95ci"]
        retrieved = r["by_recoverability"]["retrieved"]
        first_gains = first_gains or r["per_sentence_gain"]  # the same masks for every run: a paired comparison
        diff, (dlow, dhigh) = paired_difference(r["per_sentence_gain"], first_gains)
        print(
            f"| {name} | {r['spans']} ({r['sentences']}) | {r['token_accuracy']:.2f} | {r['null_token_accuracy']:.2f} | "
            f"{r['retrieval_gain']:+.2f} [{low:+.2f}, {high:+.2f}] | {r['p_null']:.3f} | "
            f"{r['recoverable_share']:.1f}% / {r['retrieved_share']:.1f}% | {retrieved['retrieval_gain']:+.2f} "
            "[{:+.2f}, {:+.2f}] | {:+.2f} [{:+.2f}, {:+.2f}] |".format(
                *retrieved["retrieval_gain_95ci"], diff, dlow, dhigh
            )
        )

    if args.examples:
        for name, run_dir, *_ in runs:
            print_examples(name, Path(args.corpus), Path(run_dir), preset)
    if not args.qa:
        return
    if not args.warm_start or any(len(run) != 3 for run in runs):
        parser.error("--qa needs --warm-start RETRIEVER=INDEX and every --run as NAME=RUN_DIR=INDEX")
    questions = load_qa(args.qa)
    base = hits_at(*args.warm_start.split("="), questions, preset)
    print(f"\n{len(questions)} questions of {args.qa}, zero-shot")
    print("| retriever | recall@1 | recall@5 [95%] | recall@20 | recall@5 minus the warm start [95%] |")
    print("|---|---:|---:|---:|---:|")
    rows = [("warm start", base)] + [
        (name, hits_at(f"{run}/retriever", index, questions, preset)) for name, run, index in runs
    ]
    for name, hits in rows:
        low, high = bootstrap_interval(100 * hits[:, 1])
        diff, (dlow, dhigh) = paired_difference(100 * hits[:, 1], 100 * base[:, 1])
        print(
            f"| {name} | {100 * hits[:, 0].mean():.2f} | {100 * hits[:, 1].mean():.2f} [{low:.1f}, {high:.1f}] | "
            f"{100 * hits[:, 2].mean():.2f} | {diff:+.2f} [{dlow:+.2f}, {dhigh:+.2f}] |"
        )


if __name__ == "__main__":
    main()
