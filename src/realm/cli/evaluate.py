"""`realm search`, `realm eval retrieval|qa`, `realm ask`: retrieval, evaluation, and answers with evidence."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from realm.cli.options import (
    RETRIEVERS,
    answerer_options,
    common,
    load_retriever,
    positive_int,
    positive_ints,
    resolve_preset,
)

BEIR_BLOCKS_PER_DOCUMENT = 3  # blocks searched per document ranked: a document's score is its best block's


def _searcher(args: argparse.Namespace, kind: str = "dense"):
    """`realm search` and `realm eval retrieval`: a model over its index (for hybrid, with the BM25 weight a
    `train qa` output learned, else the default), or BM25 over a corpus or an index's blocks."""
    from realm.data.blocks import BlockStore
    from realm.index.mips import MipsIndex
    from realm.index.search import BM25Searcher, open_searcher
    from realm.models.orqa import bm25_weight_of

    if kind == "bm25" and not args.index:
        if not args.corpus:
            raise ValueError("--retriever bm25 needs --corpus or --index (to find the corpus)")
        return BM25Searcher(BlockStore(args.corpus))
    if kind != "bm25" and not (args.index and args.model):
        raise ValueError(f"the {kind} retriever needs --index and --model")
    index = MipsIndex(args.index)
    retriever = load_retriever(args.model, resolve_preset(args), index) if kind != "bm25" else None
    weight = bm25_weight_of(args.model) if kind == "hybrid" else 0.0
    store = BlockStore(args.corpus) if kind == "bm25" and args.corpus else index.corpus(args.corpus)
    return open_searcher(index, kind, retriever, weight, store)


def cmd_search(args: argparse.Namespace) -> int:
    from realm.common.text import visible_text
    from realm.index.search import hits_json

    if not visible_text(args.query):
        raise ValueError("the query is empty (it has no letter or digit)")
    searcher = _searcher(args)
    hits = searcher.search(args.query, args.k)
    if args.json:
        print(json.dumps(hits_json(hits, searcher.scores_are_retrieval_logits), ensure_ascii=False, indent=2))
        return 0
    for rank, hit in enumerate(hits, start=1):
        text = hit.text if len(hit.text) <= 300 else hit.text[:297] + "..."
        print(f"{rank:>3}. [{hit.score:.2f}] {hit.title} (block {hit.block_id}, doc {hit.doc_id})\n     {text}")
    return 0


def cmd_eval_beir(args: argparse.Namespace) -> int:
    """`realm eval retrieval --beir DIR`: nDCG@10 and recall@100 of documents, as BEIR reports them."""
    from realm.data.beir import load_beir_queries
    from realm.eval.retrieval import BEIR_RECALL_CUT, beir_metrics
    from realm.index.search import search_all

    queries = load_beir_queries(args.beir, args.split)
    ids, texts = queries.ids[: args.limit], queries.texts[: args.limit]
    started = time.monotonic()
    searcher = _searcher(args, args.retriever)
    depth = min(BEIR_BLOCKS_PER_DOCUMENT * BEIR_RECALL_CUT, len(searcher.store.live_ids))
    result = beir_metrics(ids, queries.qrels, search_all(searcher, texts, depth))
    summary: dict[str, object] = {}
    for name, (mean, interval) in result.items():
        summary |= {name: mean, f"{name}_95ci": interval}
    summary |= {"queries": len(ids), "retriever": args.retriever, "seconds": round(time.monotonic() - started, 1)}
    if args.json:
        print(json.dumps(summary))
    else:
        print(f"{args.retriever} retrieval on {len(ids)} judged queries of {args.beir} ({args.split}):")
        for name, (mean, (low, high)) in result.items():
            print(f"  {name:>10}: {mean:.4f}  [{low:.4f}, {high:.4f}] (95% interval)")
    return 0


def cmd_eval_retrieval(args: argparse.Namespace) -> int:
    from realm.data.qa_examples import load_qa
    from realm.eval.retrieval import recall_at_k
    from realm.index.search import search_all

    if (args.qa is None) == (args.beir is None):
        raise ValueError("give one of --qa (answer recall@k) and --beir (nDCG@10, recall@100)")
    if args.beir:
        return cmd_eval_beir(args)
    ks = args.k
    examples = load_qa(args.qa)
    if args.limit:
        examples = examples[: args.limit]
    started = time.monotonic()
    searcher = _searcher(args, args.retriever)
    result = recall_at_k(examples, search_all(searcher, [e.question for e in examples], max(ks)), ks)
    seconds = time.monotonic() - started
    if args.json:
        print(
            json.dumps(
                {
                    **{k: round(v, 2) for k, v in result.items()},
                    "questions": len(examples),
                    "retriever": args.retriever,
                    "seconds": round(seconds, 1),
                }
            )
        )
    else:
        print(f"{args.retriever} retrieval on {len(examples)} questions of {args.qa} ({seconds:.0f}s):")
        for name, value in result.items():
            print(f"  {name:>11}: {value:6.2f}%")
    return 0


def cmd_eval_qa(args: argparse.Namespace) -> int:
    from realm.data.qa_examples import load_qa
    from realm.eval.answerer import load_answerer
    from realm.eval.qa import evaluate_qa

    examples = load_qa(args.qa)[: args.limit]
    answerer = load_answerer(args.model, args.index, resolve_preset(args, "qa"), args.retriever, corpus=args.corpus)
    predictions = Path(args.out) if args.out else None
    result = evaluate_qa(answerer, examples, args.recall_k, predictions, args.exact_match)
    summary = {**result, "retriever": args.retriever}
    if args.json:
        print(json.dumps(summary))
    else:
        print(
            f"{args.retriever} retrieval + reader on {len(examples)} questions of {args.qa}: "
            + ", ".join(f"{name} {value}" for name, value in summary.items() if name not in ("questions", "retriever"))
        )
        if predictions is not None:
            print(f"predictions: {predictions}")
    return 0


def cmd_eval_compare(args: argparse.Namespace) -> int:
    from realm.eval.qa import PairedScore, compare_predictions

    result = compare_predictions(Path(args.a), Path(args.b))
    if args.json:
        print(json.dumps(result))
    else:
        paired = PairedScore.from_dict(result)
        low, high = paired.interval
        print(
            f"exact match {paired.exact_match_a} ({args.a}) vs {paired.exact_match_b} ({args.b}) on "
            f"{paired.questions} questions: difference {paired.difference:+.2f}, 95% interval "
            f"[{low:+.2f}, {high:+.2f}]" + ("" if low > 0 or high < 0 else " (includes 0: no clear difference)")
        )
    return 0


def cmd_ask(args: argparse.Namespace) -> int:
    from realm.common.text import visible_text
    from realm.eval.answerer import load_answerer

    if not (question := visible_text(args.question)):
        raise ValueError("the question is empty (it has no letter or digit)")
    answerer = load_answerer(args.model, args.index, resolve_preset(args, "qa"), args.retriever, corpus=args.corpus)
    answer = answerer.ask([question])[0]
    if answerer.warning:
        print(f"realm: warning: {answerer.warning}", file=sys.stderr)
    if args.json:
        warning = {"warning": answerer.warning} if answerer.warning else {}
        print(json.dumps({**answer.to_dict(), **warning}, ensure_ascii=False, indent=2))
        return 0
    print(f"{answer.answer or '(no answer)'}    p = {answer.score:.3f}\n")
    bold = sys.stdout.isatty()
    for rank, ev in enumerate(answer.evidence, start=1):
        text = ev.text
        if ev.answer_span is not None:
            start, end = ev.answer_span
            text = (
                text[:start]
                + ("\033[1;4m" if bold else "[[")
                + text[start:end]
                + ("\033[0m" if bold else "]]")
                + text[end:]
            )
        print(
            f"{rank}. {ev.title}  p(z|x) = {ev.retrieval_prob:.3f}, share of the answer = {ev.answer_prob:.3f}  "
            f"(block {ev.block_id})\n   {text}\n"
        )
    return 0


def add_commands(commands) -> None:
    search = commands.add_parser("search", help="search an index")
    search.add_argument("query")
    search.add_argument("--index", required=True)
    search.add_argument("--model", required=True)
    search.add_argument("--corpus", help="corpus folder, if it moved since the index was built")
    search.add_argument("-k", type=positive_int, default=5)
    search.add_argument("--json", action="store_true")
    common(search)
    search.set_defaults(run=cmd_search)

    evaluate = commands.add_parser("eval", help="evaluation").add_subparsers(dest="action", required=True)
    retrieval = evaluate.add_parser(
        "retrieval", help="recall@k of answer-bearing blocks, or BEIR's nDCG@10 and recall@100 of judged documents"
    )
    retrieval.add_argument(
        "--qa", help="JSONL of {question, answer: [...]} (*.regex.jsonl: regexes), or a named set (e.g. nq-test)"
    )
    retrieval.add_argument(
        "--beir", help="a BEIR folder (queries.jsonl, qrels/SPLIT.tsv) whose corpus.jsonl is indexed"
    )
    retrieval.add_argument("--split", default="test", help="the BEIR qrels split (qrels/SPLIT.tsv)")
    retrieval.add_argument("--index", help="dense index (bm25: used to find the corpus)")
    retrieval.add_argument("--model")
    retrieval.add_argument("--corpus")
    retrieval.add_argument("--retriever", choices=RETRIEVERS, default="dense")
    retrieval.add_argument("--k", type=positive_ints, default=[1, 5, 20, 100], help="cut-offs, e.g. 1,5,20")
    retrieval.add_argument("--limit", type=positive_int, help="only the first N questions")
    retrieval.add_argument("--json", action="store_true")
    common(retrieval)
    retrieval.set_defaults(run=cmd_eval_retrieval)

    eval_qa = evaluate.add_parser("qa", help="open-QA exact match, retrieval recall and a predictions file")
    answerer_options(eval_qa)
    eval_qa.add_argument("--qa", required=True, help="a QA JSONL file or a named set (squad-open-dev, nq-test, ...)")
    eval_qa.add_argument("--out", help="also write the predictions JSONL here (answers, outcomes, evidence)")
    eval_qa.add_argument("--recall-k", type=positive_ints, default=[1, 5, 20], help="cut-offs, e.g. 1,5,20")
    eval_qa.add_argument(
        "--exact-match",
        choices=["orqa", "squad"],
        default="orqa",
        help="the answer normaliser: orqa (ORQA's eval_utils, which REALM reports with: NFD first; the default) or "
        "squad (the official SQuAD v1.1 script: no Unicode normalisation)",
    )
    eval_qa.add_argument("--limit", type=positive_int)
    eval_qa.add_argument("--json", action="store_true")
    common(eval_qa)
    eval_qa.set_defaults(run=cmd_eval_qa)

    compare = evaluate.add_parser(
        "compare", help="paired difference in exact match of two `eval qa` predictions files, with its interval"
    )
    compare.add_argument("a", help="predictions JSONL of system A")
    compare.add_argument("b", help="predictions JSONL of system B (the same questions)")
    compare.add_argument("--json", action="store_true")
    common(compare)
    compare.set_defaults(run=cmd_eval_compare)

    ask = commands.add_parser("ask", help="answer a question, with the evidence it used")
    ask.add_argument("question")
    answerer_options(ask)
    ask.add_argument("--json", action="store_true")
    common(ask)
    ask.set_defaults(run=cmd_ask)
