"""`realm` command line: corpus, index, search, eval, pipeline."""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import shlex
import sys
import time
from pathlib import Path

from realm.common.tokenization import MINILM, load_tokenizer, resolve_tokenizer_dir
from realm.config import PRESETS, Preset, RetrieverConfig, get_preset
from realm.data.blocks import BlockStore, build_corpus
from realm.data.qa_examples import load_qa
from realm.data.sources import VITAL_ARTICLES, CorpusError
from realm.eval.retrieval import recall_at_k
from realm.index.mips import MipsIndex, MipsIndexError, build_index

log = logging.getLogger("realm")


def _preset(args: argparse.Namespace) -> Preset:
    """The chosen preset with command-line overrides applied."""
    preset = get_preset(args.preset)
    corpus = preset.corpus
    if getattr(args, "max_block_tokens", None):
        corpus = dataclasses.replace(corpus, max_block_tokens=args.max_block_tokens)
    retriever = preset.retriever
    if getattr(args, "pooling", None):
        retriever = dataclasses.replace(retriever, pooling=args.pooling)
    embed = preset.embed
    for field, attr in (("batch_size", "batch_size"), ("compute_dtype", "dtype"), ("storage_dtype", "storage"),
                        ("shard_size", "shard_size")):
        if getattr(args, attr, None):
            embed = dataclasses.replace(embed, **{field: getattr(args, attr)})
    index = preset.index
    if getattr(args, "backend", None):
        index = dataclasses.replace(index, backend=args.backend)
    return dataclasses.replace(preset, corpus=corpus, retriever=retriever, embed=embed, index=index)


def _load_retriever(spec: str, config: RetrieverConfig):
    from realm.models.retriever import Retriever  # torch import is slow; only commands that need it pay for it

    return Retriever.load(spec, config)


def _retriever_for_index(spec: str, index: MipsIndex, preset: Preset):
    """Load the model with the retriever settings the index was built with (pooling, sizes)."""
    config = dataclasses.replace(preset.retriever, **index.meta.retriever)
    return _load_retriever(spec, config)


# -- commands -------------------------------------------------------------------------------------
def cmd_corpus_build(args: argparse.Namespace) -> int:
    preset = _preset(args)
    tokenizer = load_tokenizer(resolve_tokenizer_dir(args.tokenizer))
    meta = build_corpus(args.inputs, Path(args.out), tokenizer, preset.corpus, skip_bad=args.skip_bad,
                        progress=not args.quiet)
    print(f"corpus {args.out}: {meta.num_documents} documents -> {meta.num_blocks} blocks "
          f"(<= {meta.max_block_tokens} wordpieces), {meta.skipped_records} bad records skipped, "
          f"fingerprint {meta.fingerprint}, {meta.build_seconds:.1f}s")
    return 0


def cmd_index_build(args: argparse.Namespace) -> int:
    from realm.index.embed import BlockEmbedder

    preset = _preset(args)
    store = BlockStore(args.corpus)
    retriever = _load_retriever(args.model, preset.retriever)
    fingerprint = retriever.doc_fingerprint()
    embedder = BlockEmbedder(retriever.doc_tower, retriever.tokenizer, store.config, preset.embed)
    log.info("embedding %d blocks with %s in %s on %s", len(store), args.model, embedder.dtype, embedder.device)
    meta = build_index(store, embedder, fingerprint, Path(args.out), preset.embed, preset.index, retriever.config,
                       progress=not args.quiet)
    print(f"index {args.out} v{meta.version}: {meta.num_vectors} x {meta.dim} ({meta.backend}), "
          f"embedded in {meta.embed_seconds:.0f}s ({meta.num_vectors / max(meta.embed_seconds, 1e-9):.1f} blocks/s), "
          f"built in {meta.build_seconds:.0f}s")
    return 0


def _dense_searcher(args: argparse.Namespace):
    from realm.index.search import DenseSearcher

    index = MipsIndex(args.index)
    retriever = _retriever_for_index(args.model, index, _preset(args))
    return DenseSearcher(index, retriever, index.corpus(args.corpus))


def cmd_search(args: argparse.Namespace) -> int:
    hits = _dense_searcher(args).search(args.query, args.k)
    if args.json:
        print(json.dumps([dataclasses.asdict(h) for h in hits], ensure_ascii=False, indent=2))
        return 0
    for rank, hit in enumerate(hits, start=1):
        text = hit.text if len(hit.text) <= 300 else hit.text[:297] + "..."
        print(f"{rank:>3}. [{hit.score:.2f}] {hit.title} (block {hit.block_id}, doc {hit.doc_id})\n     {text}")
    return 0


def cmd_eval_retrieval(args: argparse.Namespace) -> int:
    from realm.index.search import BM25Searcher, search_all

    ks = sorted({int(k) for k in args.k.split(",")})
    examples = load_qa(args.qa)
    if args.limit:
        examples = examples[: args.limit]
    started = time.monotonic()
    if args.retriever == "bm25":
        if not (args.corpus or args.index):
            raise ValueError("--retriever bm25 needs --corpus or --index (to find the corpus)")
        store = BlockStore(args.corpus) if args.corpus else MipsIndex(args.index).corpus()
        searcher = BM25Searcher(store)
    else:
        if not (args.index and args.model):
            raise ValueError("the dense retriever needs --index and --model")
        searcher = _dense_searcher(args)
    hits = search_all(searcher, [e.question for e in examples], max(ks))
    result = recall_at_k(examples, hits, ks)
    seconds = time.monotonic() - started
    if args.json:
        print(json.dumps({**{k: round(v, 2) for k, v in result.items()}, "questions": len(examples),
                          "retriever": args.retriever, "seconds": round(seconds, 1)}))
    else:
        print(f"{args.retriever} retrieval on {len(examples)} questions of {args.qa} ({seconds:.0f}s):")
        for name, value in result.items():
            print(f"  {name:>11}: {value:6.2f}%")
    return 0


def cmd_pipeline(args: argparse.Namespace) -> int:
    """Every stage from the corpus to the report; a re-run skips what matches and resumes what was cut off."""
    from realm.pipeline.run import Pipeline, PipelineOptions

    preset = get_preset(args.preset)
    budget = None if args.budget_minutes == 0 else (args.budget_minutes or preset.pipeline_budget_minutes)
    options = PipelineOptions(inputs=tuple(args.inputs), run_dir=Path(args.run_dir), warm_start=args.warm_start,
                              qa_train=Path(args.qa_train) if args.qa_train else None,
                              qa_dev=Path(args.qa_dev) if args.qa_dev else None, ablations=args.ablations,
                              budget_minutes=budget, progress=not args.quiet,
                              command=" ".join(["realm", *map(shlex.quote, args.argv)]))
    Pipeline(options, preset).run()
    return 0


def cmd_index_refresh(args: argparse.Namespace) -> int:
    """The asynchronous index builder: rebuild whenever the trainer publishes a newer retriever snapshot."""
    import torch

    from realm.index.refresh import RefreshPolicy, refresh_loop

    if args.threads:
        torch.set_num_threads(args.threads)
    preset = _preset(args)
    builds = refresh_loop(Path(args.watch), Path(args.corpus), Path(args.out), preset.embed, preset.index,
                          preset.retriever, RefreshPolicy(args.refresh_every), poll_seconds=args.poll_seconds,
                          max_builds=args.max_builds, exit_with_parent=args.exit_with_parent)
    print(f"index refresh: {builds} versions published to {args.out}")
    return 0


def cmd_index_add(args: argparse.Namespace) -> int:
    """New knowledge without retraining: embed documents with the index's own document tower, publish a version."""
    from realm.index.update import add_documents

    preset = _preset(args)
    index = MipsIndex(args.index)
    retriever = _retriever_for_index(args.model, index, preset)
    done = add_documents(index, args.docs, retriever, preset.embed, preset.index.keep_versions,
                         skip_bad=args.skip_bad, corpus=args.corpus)
    print(f"index {args.index} v{done.version}: added {done.documents} documents ({done.blocks} blocks), "
          f"{done.skipped} bad records skipped; {done.live_blocks} blocks live")
    return 0


def cmd_index_remove(args: argparse.Namespace) -> int:
    from realm.index.update import remove_documents

    ids = list(args.ids or [])
    if args.ids_file:
        ids += [line.strip() for line in Path(args.ids_file).read_text(encoding="utf-8").splitlines() if line.strip()]
    if not ids:
        raise ValueError("name the documents to remove with --ids and/or --ids-file")
    done = remove_documents(MipsIndex(args.index), ids, _preset(args).index.keep_versions, corpus=args.corpus)
    print(f"index {args.index} v{done.version}: removed {done.documents} documents ({done.blocks} blocks); "
          f"{done.live_blocks} blocks live")
    return 0


def _training_preset(args: argparse.Namespace) -> Preset:
    preset = _preset(args)
    pretrain = preset.pretrain
    for field in ("steps", "batch_size", "refresh_every", "masking", "num_candidates", "checkpoint_every", "lr",
                  "retriever_lr", "retriever_frozen_steps"):
        value = getattr(args, field, None)
        if value is not None:
            pretrain = dataclasses.replace(pretrain, **{field: value})
    ict = preset.ict
    if args.command == "train" and args.action == "ict":
        ict = dataclasses.replace(ict, **{f: getattr(args, f) for f in ("steps", "batch_size", "lr")
                                          if getattr(args, f, None) is not None})
    return dataclasses.replace(preset, pretrain=pretrain, ict=ict)


def cmd_train_ict(args: argparse.Namespace) -> int:
    from realm.recipes.ict import train_ict

    folder = train_ict(Path(args.corpus), Path(args.out), args.model, _training_preset(args), resume=args.resume,
                       progress=not args.quiet)
    print(f"ICT retriever saved to {folder}")
    return 0


def cmd_train_pretrain(args: argparse.Namespace) -> int:
    from realm.recipes.pretrain import train_pretrain

    folder = train_pretrain(Path(args.corpus), Path(args.out), args.retriever, args.reader, _training_preset(args),
                            resume=args.resume, progress=not args.quiet)
    print(f"REALM retriever and reader saved to {folder}/retriever and {folder}/reader")
    return 0


def _qa_preset(args: argparse.Namespace) -> Preset:
    preset = _preset(args)
    qa = dataclasses.replace(preset.qa, **{f: getattr(args, f) for f in ("epochs", "batch_size", "lr", "top_k", "beam")
                                           if getattr(args, f, None) is not None})
    return dataclasses.replace(preset, qa=qa)


def cmd_train_qa(args: argparse.Namespace) -> int:
    from realm.recipes.finetune_qa import train_qa

    best = train_qa(args.model, Path(args.index), load_qa(args.train), load_qa(args.dev), Path(args.out),
                    _qa_preset(args), resume=args.resume, progress=not args.quiet, reader_spec=args.reader)
    print(f"best model (dev exact match {json.loads((best / 'dev.json').read_text())['exact_match']:.2f}) in {best}")
    return 0


def cmd_eval_qa(args: argparse.Namespace) -> int:
    from realm.eval.answerer import load_answerer
    from realm.eval.qa import evaluate_qa

    preset = _qa_preset(args)
    examples = load_qa(args.qa)[: args.limit]
    answerer = load_answerer(args.model, args.index, preset, args.retriever, corpus=args.corpus)
    result = evaluate_qa(answerer, examples, [int(k) for k in args.recall_k.split(",")], Path(args.out))
    summary = {**result, "retriever": args.retriever}
    if args.json:
        print(json.dumps(summary))
    else:
        print(f"{args.retriever} retrieval + reader on {len(examples)} questions of {args.qa}: "
              + ", ".join(f"{name} {value}" for name, value in summary.items() if name not in ("questions", "retriever")))
        print(f"predictions: {args.out}")
    return 0


def cmd_ask(args: argparse.Namespace) -> int:
    from realm.eval.answerer import load_answerer

    answerer = load_answerer(args.model, args.index, _qa_preset(args), args.retriever, corpus=args.corpus)
    answer = answerer.ask([args.question])[0]
    if args.json:
        print(json.dumps(answer.to_dict(), ensure_ascii=False, indent=2))
        return 0
    print(f"{answer.answer or '(no answer)'}    p = {answer.score:.3f}\n")
    bold = sys.stdout.isatty()
    for rank, ev in enumerate(answer.evidence, start=1):
        text = ev.text
        if ev.answer_span is not None:
            start, end = ev.answer_span
            text = text[:start] + ("\033[1;4m" if bold else "[[") + text[start:end] + ("\033[0m" if bold else "]]") + text[end:]
        print(f"{rank}. {ev.title}  p(z|x) = {ev.retrieval_prob:.3f}, share of the answer = {ev.answer_prob:.3f}  "
              f"(block {ev.block_id})\n   {text}\n")
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    """The model loads once; the service follows the index folder's published version."""
    import uvicorn

    from realm.serve.service import QAService, create_app

    service = QAService.load(args.model, args.index, _qa_preset(args), args.retriever, corpus=args.corpus)
    uvicorn.run(create_app(service), host=args.host, port=args.port, log_level="warning" if args.quiet else "info")
    return 0


# -- parser ---------------------------------------------------------------------------------------
def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--preset", default="cpu", choices=sorted(PRESETS), help="settings preset (default: cpu)")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")


def _answerer_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="a `train qa` output (or minilm, a `train pretrain` output)")
    parser.add_argument("--index", required=True, help="index built by the model's document tower "
                        "(a version published later, e.g. by `index add`, is picked up by `serve`)")
    parser.add_argument("--retriever", choices=["dense", "bm25"], default="dense", help="bm25: same reader, BM25 search")
    parser.add_argument("--corpus", help="corpus folder, if it moved since the index was built")
    parser.add_argument("--top-k", type=int, help="blocks given to the reader (default: preset)")


def _embedding_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--pooling", choices=["cls", "mean"], help="tower pooling for a warm start (default: preset)")
    parser.add_argument("--backend", choices=["flat", "hnsw", "ivfpq"], help="faiss index type (default: flat, exact)")
    parser.add_argument("--batch-size", type=int, help="blocks per embedding batch")
    parser.add_argument("--dtype", choices=["auto", "bf16", "fp32"], help="compute dtype (auto: bf16 where supported)")
    parser.add_argument("--storage", choices=["fp16", "fp32"], help="stored embedding dtype (default fp16)")
    parser.add_argument("--shard-size", type=int, help="blocks per resumable shard")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="realm", description="REALM: retrieval-augmented language models")
    commands = parser.add_subparsers(dest="command", required=True)

    corpus = commands.add_parser("corpus", help="knowledge corpus").add_subparsers(dest="action", required=True)
    build = corpus.add_parser("build", help="split documents into blocks")
    build.add_argument("inputs", nargs="+", help=f"JSONL(.gz) / SQuAD .json|.zip files, or {VITAL_ARTICLES!r}")
    build.add_argument("--out", required=True, help="corpus folder")
    build.add_argument("--tokenizer", default=MINILM, help="'minilm' or a folder with a BERT tokenizer")
    build.add_argument("--max-block-tokens", type=int, help="block budget incl. [CLS] title [SEP] body [SEP]")
    build.add_argument("--skip-bad", action="store_true", help="skip malformed records and count them")
    _common(build)
    build.set_defaults(run=cmd_corpus_build)

    index = commands.add_parser("index", help="MIPS index").add_subparsers(dest="action", required=True)
    ibuild = index.add_parser("build", help="embed every block and publish a new index version")
    ibuild.add_argument("--corpus", required=True)
    ibuild.add_argument("--model", required=True, help="'minilm', 'random', or a checkpoint folder")
    ibuild.add_argument("--out", required=True, help="index folder")
    _embedding_options(ibuild)
    _common(ibuild)
    ibuild.set_defaults(run=cmd_index_build)

    refresh = index.add_parser("refresh", help="asynchronous index builder: follow a trainer's retriever snapshots")
    refresh.add_argument("--watch", required=True, help="the trainer's snapshots folder")
    refresh.add_argument("--corpus", required=True)
    refresh.add_argument("--out", required=True, help="index folder to publish new versions into")
    refresh.add_argument("--refresh-every", type=int, default=1, help="0: never rebuild (frozen index)")
    refresh.add_argument("--poll-seconds", type=float, default=2.0)
    refresh.add_argument("--max-builds", type=int, help="exit after this many builds")
    refresh.add_argument("--threads", type=int, help="torch threads (leave cores to a trainer on the same machine)")
    refresh.add_argument("--exit-with-parent", action="store_true", help="stop when the process that started it exits")
    _embedding_options(refresh)
    _common(refresh)
    refresh.set_defaults(run=cmd_index_refresh)

    add = index.add_parser("add", help="add documents to a live index (embedded by the model that built it)")
    add.add_argument("--index", required=True)
    add.add_argument("--docs", required=True, help='JSONL(.gz) of {"id", "title", "text"}')
    add.add_argument("--model", required=True, help="the model that built the index ('minilm' or a checkpoint folder)")
    add.add_argument("--corpus", help="corpus folder, if it moved since the index was built")
    add.add_argument("--skip-bad", action="store_true", help="skip malformed records and count them")
    _common(add)
    add.set_defaults(run=cmd_index_add)

    remove = index.add_parser("remove", help="remove documents from a live index")
    remove.add_argument("--index", required=True)
    remove.add_argument("--ids", nargs="+", metavar="ID", help="document ids")
    remove.add_argument("--ids-file", help="file with one document id per line")
    remove.add_argument("--corpus", help="corpus folder, if it moved since the index was built")
    _common(remove)
    remove.set_defaults(run=cmd_index_remove)

    train = commands.add_parser("train", help="training recipes").add_subparsers(dest="action", required=True)
    ict = train.add_parser("ict", help="Inverse Cloze Task warm start of the retriever")
    ict.add_argument("--corpus", required=True)
    ict.add_argument("--out", required=True)
    ict.add_argument("--model", default=MINILM, help="warm start of both towers (default: minilm)")
    ict.add_argument("--steps", type=int)
    ict.add_argument("--batch-size", type=int)
    ict.add_argument("--lr", type=float)
    ict.add_argument("--resume", action="store_true", help="continue from the newest checkpoint in --out")
    _common(ict)
    ict.set_defaults(run=cmd_train_ict)

    pretrain = train.add_parser("pretrain", help="REALM pretraining with an asynchronously refreshed index")
    pretrain.add_argument("--corpus", required=True, help="knowledge corpus Z (its sentences are also X)")
    pretrain.add_argument("--out", required=True)
    pretrain.add_argument("--retriever", default=MINILM, help="retriever warm start, e.g. an ICT run's retriever/")
    pretrain.add_argument("--reader", default=MINILM, help="reader warm start (BERT folder or minilm)")
    pretrain.add_argument("--steps", type=int)
    pretrain.add_argument("--batch-size", type=int, help="global batch (split across torchrun processes)")
    pretrain.add_argument("--lr", type=float)
    pretrain.add_argument("--retriever-lr", type=float, help="learning rate of both towers (default: preset)")
    pretrain.add_argument("--retriever-frozen-steps", type=int,
                          help="towers stay frozen for the first N steps while the reader's fresh head learns")
    pretrain.add_argument("--num-candidates", type=int, help="candidates per query, the null document included")
    pretrain.add_argument("--masking", choices=["salient", "random-span", "uniform"])
    pretrain.add_argument("--refresh-every", type=int, help="snapshot for the index builder every N steps; 0: frozen")
    pretrain.add_argument("--checkpoint-every", type=int)
    pretrain.add_argument("--resume", action="store_true", help="continue from the newest checkpoint in --out")
    _common(pretrain)
    pretrain.set_defaults(run=cmd_train_pretrain)

    search = commands.add_parser("search", help="search an index")
    search.add_argument("query")
    search.add_argument("--index", required=True)
    search.add_argument("--model", required=True)
    search.add_argument("--corpus", help="corpus folder, if it moved since the index was built")
    search.add_argument("-k", type=int, default=5)
    search.add_argument("--json", action="store_true")
    _common(search)
    search.set_defaults(run=cmd_search)

    evaluate = commands.add_parser("eval", help="evaluation").add_subparsers(dest="action", required=True)
    retrieval = evaluate.add_parser("retrieval", help="recall@k of answer-bearing blocks")
    retrieval.add_argument("--qa", required=True, help="JSONL of {question, answer: [...]} (*.regex.jsonl: regexes)")
    retrieval.add_argument("--index", help="dense index (bm25: used to find the corpus)")
    retrieval.add_argument("--model")
    retrieval.add_argument("--corpus")
    retrieval.add_argument("--retriever", choices=["dense", "bm25"], default="dense")
    retrieval.add_argument("--k", default="1,5,20,100")
    retrieval.add_argument("--limit", type=int, help="only the first N questions")
    retrieval.add_argument("--json", action="store_true")
    _common(retrieval)
    retrieval.set_defaults(run=cmd_eval_retrieval)

    qa = train.add_parser("qa", help="open-QA fine-tuning over a frozen document index")
    qa.add_argument("--model", default=MINILM, help="minilm, a `train pretrain` output or a `train qa` output")
    qa.add_argument("--index", required=True, help="index built by the model's document tower")
    qa.add_argument("--reader", help="reader warm start in place of the model's own (e.g. an ICT run with minilm: "
                    "the ICT-only baseline)")
    qa.add_argument("--train", required=True, help="JSONL {question, answer: [...]} (*.regex.jsonl: regexes)")
    qa.add_argument("--dev", required=True)
    qa.add_argument("--out", required=True)
    qa.add_argument("--epochs", type=int)
    qa.add_argument("--batch-size", type=int)
    qa.add_argument("--lr", type=float)
    qa.add_argument("--top-k", type=int, help="blocks given to the reader")
    qa.add_argument("--beam", type=int, help="blocks searched for the retrieval loss")
    qa.add_argument("--resume", action="store_true", help="continue from the newest checkpoint in --out")
    _common(qa)
    qa.set_defaults(run=cmd_train_qa)

    eval_qa = evaluate.add_parser("qa", help="open-QA exact match, retrieval recall and a predictions file")
    _answerer_options(eval_qa)
    eval_qa.add_argument("--qa", required=True)
    eval_qa.add_argument("--out", required=True, help="predictions JSONL")
    eval_qa.add_argument("--recall-k", default="1,5,20")
    eval_qa.add_argument("--limit", type=int)
    eval_qa.add_argument("--json", action="store_true")
    _common(eval_qa)
    eval_qa.set_defaults(run=cmd_eval_qa)

    ask = commands.add_parser("ask", help="answer a question, with the evidence it used")
    ask.add_argument("question")
    _answerer_options(ask)
    ask.add_argument("--json", action="store_true")
    _common(ask)
    ask.set_defaults(run=cmd_ask)

    serve = commands.add_parser("serve", help="HTTP API and web page answering questions with their evidence")
    _answerer_options(serve)
    serve.add_argument("--host", default="127.0.0.1", help="default: this machine only")
    serve.add_argument("--port", type=int, default=8000)
    _common(serve)
    serve.set_defaults(run=cmd_serve)

    pipeline = commands.add_parser("pipeline", help="the main job: corpus -> ICT -> REALM -> [QA] -> report")
    pipeline.add_argument("--inputs", nargs="+", default=[VITAL_ARTICLES], help="corpus inputs (default: vital-articles)")
    pipeline.add_argument("--run-dir", default="runs/default", help="stage outputs and report.md / report.html")
    pipeline.add_argument("--warm-start", default=MINILM, help="retriever towers and reader to start from")
    pipeline.add_argument("--qa-train", help="open-QA training questions (JSONL): adds fine-tuning and evaluation")
    pipeline.add_argument("--qa-dev", help="open-QA dev questions (JSONL)")
    pipeline.add_argument("--ablations", action="store_true",
                          help="also ICT-only retriever, uniform masking and frozen index (needs --qa-train/--qa-dev)")
    pipeline.add_argument("--budget-minutes", type=float,
                          help="scale training steps so the run fits (default: the preset's, cpu 45; 0: no scaling)")
    _common(pipeline)
    pipeline.set_defaults(run=cmd_pipeline)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.argv = sys.argv[1:] if argv is None else argv
    logging.basicConfig(level=logging.WARNING if args.quiet else logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        return args.run(args)
    except (CorpusError, MipsIndexError, FileNotFoundError, FileExistsError, ValueError) as err:
        print(f"realm: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("realm: interrupted; completed shards are kept and the next run resumes", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
