"""`realm` command line: corpus, index, search, eval, pipeline."""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import sys
import time
from pathlib import Path

from realm.config import PRESETS, Preset, RetrieverConfig, get_preset
from realm.corpus import META as CORPUS_META
from realm.corpus import BlockStore, build_corpus
from realm.evaluation import load_qa, recall_at_k
from realm.index import MipsIndex, MipsIndexError, build_index, current_version
from realm.sources import VITAL_ARTICLES, CorpusError
from realm.tokenization import MINILM, load_tokenizer, resolve_tokenizer_dir

log = logging.getLogger("realm")

DEFAULT_QUERY = "Who painted the Mona Lisa?"


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
    from realm.retriever import Retriever  # torch import is slow; only commands that need it pay for it

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
    from realm.embed import BlockEmbedder

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
    from realm.search import DenseSearcher

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
    from realm.search import BM25Searcher

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
    questions = [e.question for e in examples]
    hits = []
    for start in range(0, len(questions), 256):
        hits += searcher.batch_search(questions[start : start + 256], max(ks))
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
    """Until pretraining and QA land: build the default corpus, index it, answer a search.
    Each stage is skipped when its output exists and matches (fingerprints), so a re-run resumes."""
    from realm.embed import BlockEmbedder
    from realm.search import DenseSearcher

    preset = _preset(args)
    run = Path(args.run_dir)
    corpus_dir, index_dir = run / "corpus", run / "index"
    retriever = _load_retriever(args.model, preset.retriever)
    seconds: dict[str, float] = {}

    started = time.monotonic()
    if (corpus_dir / CORPUS_META).exists() and _corpus_matches(BlockStore(corpus_dir), args.inputs, preset):
        print(f"[pipeline] corpus: reusing {corpus_dir}")
    else:
        build_corpus(args.inputs, corpus_dir, retriever.tokenizer, preset.corpus, progress=not args.quiet)
    store = BlockStore(corpus_dir)
    seconds["corpus"] = time.monotonic() - started

    started = time.monotonic()
    fingerprint = retriever.doc_fingerprint()
    index = MipsIndex(index_dir) if current_version(index_dir) is not None else None
    if index is not None and (index.meta.doc_tower_fingerprint, index.meta.corpus_fingerprint) == (fingerprint, store.fingerprint):
        print(f"[pipeline] index: reusing {index_dir} v{index.version}")
    else:
        embedder = BlockEmbedder(retriever.doc_tower, retriever.tokenizer, store.config, preset.embed)
        build_index(store, embedder, fingerprint, index_dir, preset.embed, preset.index, retriever.config,
                    progress=not args.quiet)
        index = MipsIndex(index_dir)
    seconds["index"] = time.monotonic() - started

    hits = DenseSearcher(index, retriever, store).search(args.query, args.k)
    print(f"[pipeline] {store.meta.num_documents} documents, {len(store)} blocks indexed in {run}; seconds: "
          + ", ".join(f"{stage} {value:.0f}" for stage, value in seconds.items()))
    print(f"[pipeline] query: {args.query}")
    for rank, hit in enumerate(hits, start=1):
        print(f"{rank:>3}. [{hit.score:.2f}] {hit.title}: {hit.text[:200]}")
    return 0


def cmd_index_refresh(args: argparse.Namespace) -> int:
    """The asynchronous index builder: rebuild whenever the trainer publishes a newer retriever snapshot."""
    import torch

    from realm.refresh import RefreshPolicy, refresh_loop

    if args.threads:
        torch.set_num_threads(args.threads)
    preset = _preset(args)
    builds = refresh_loop(Path(args.watch), Path(args.corpus), Path(args.out), preset.embed, preset.index,
                          preset.retriever, RefreshPolicy(args.refresh_every), poll_seconds=args.poll_seconds,
                          max_builds=args.max_builds, exit_with_parent=args.exit_with_parent)
    print(f"index refresh: {builds} versions published to {args.out}")
    return 0


def _training_preset(args: argparse.Namespace) -> Preset:
    preset = _preset(args)
    pretrain = preset.pretrain
    for field in ("steps", "batch_size", "refresh_every", "masking", "num_candidates", "checkpoint_every", "lr"):
        value = getattr(args, field, None)
        if value is not None:
            pretrain = dataclasses.replace(pretrain, **{field: value})
    ict = preset.ict
    if args.command == "train" and args.action == "ict":
        ict = dataclasses.replace(ict, **{f: getattr(args, f) for f in ("steps", "batch_size", "lr")
                                          if getattr(args, f, None) is not None})
    return dataclasses.replace(preset, pretrain=pretrain, ict=ict)


def cmd_train_ict(args: argparse.Namespace) -> int:
    from realm.train_ict import train_ict

    folder = train_ict(Path(args.corpus), Path(args.out), args.model, _training_preset(args), resume=args.resume,
                       progress=not args.quiet)
    print(f"ICT retriever saved to {folder}")
    return 0


def cmd_train_pretrain(args: argparse.Namespace) -> int:
    from realm.train_pretrain import train_pretrain

    folder = train_pretrain(Path(args.corpus), Path(args.out), args.retriever, args.reader, _training_preset(args),
                            resume=args.resume, progress=not args.quiet)
    print(f"REALM retriever and reader saved to {folder}/retriever and {folder}/reader")
    return 0


def _corpus_matches(store: BlockStore, inputs: list[str], preset: Preset) -> bool:
    return store.meta.sources == list(inputs) and store.config == preset.corpus


# -- parser ---------------------------------------------------------------------------------------
def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--preset", default="cpu", choices=sorted(PRESETS), help="settings preset (default: cpu)")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")


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

    pipeline = commands.add_parser("pipeline", help="the main job: corpus -> index -> search")
    pipeline.add_argument("--inputs", nargs="+", default=[VITAL_ARTICLES])
    pipeline.add_argument("--run-dir", default="runs/default")
    pipeline.add_argument("--model", default=MINILM)
    pipeline.add_argument("--query", default=DEFAULT_QUERY)
    pipeline.add_argument("-k", type=int, default=5)
    _embedding_options(pipeline)
    _common(pipeline)
    pipeline.set_defaults(run=cmd_pipeline)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
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
