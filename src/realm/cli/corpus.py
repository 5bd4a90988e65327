"""`realm corpus build`: documents -> blocks of at most N wordpieces (the knowledge corpus Z); `realm qa split`:
a QA file -> train and dev parts."""

from __future__ import annotations

import argparse
from pathlib import Path

from realm.cli.options import common, positive_int, resolve_preset
from realm.common.weights import MINILM
from realm.data.sources import SQUAD_PARAGRAPHS, VITAL_ARTICLES


def cmd_corpus_build(args: argparse.Namespace) -> int:
    from realm.common.tokenization import load_tokenizer, resolve_tokenizer_dir
    from realm.data.blocks import build_corpus
    from realm.data.sources import Columns

    preset = resolve_preset(args)
    tokenizer = load_tokenizer(resolve_tokenizer_dir(args.tokenizer))
    columns = Columns(args.id_column, args.title_column, args.text_column)
    meta = build_corpus(args.inputs, Path(args.out), tokenizer, preset.corpus, args.skip_bad, not args.quiet, columns)
    print(
        f"corpus {args.out}: {meta.num_documents} documents -> {meta.num_blocks} blocks "
        f"(<= {meta.max_block_tokens} wordpieces), {meta.skipped_records} bad records skipped, "
        f"fingerprint {meta.fingerprint}, {meta.build_seconds:.1f}s"
    )
    return 0


def cmd_qa_split(args: argparse.Namespace) -> int:
    from realm.data.qa_examples import split_qa_file
    from realm.data.question_sets import question_file

    train, dev, n_train, n_dev = split_qa_file(question_file(args.input), args.dev_fraction, args.out)
    print(f"{args.input}: {n_train} questions -> {train}, {n_dev} -> {dev}")
    return 0


def add_commands(commands) -> None:
    corpus = commands.add_parser("corpus", help="knowledge corpus").add_subparsers(dest="action", required=True)
    build = corpus.add_parser("build", help="split documents into blocks")
    build.add_argument(
        "inputs",
        nargs="+",
        help=f"JSONL(.gz) / DPR passage .tsv(.gz) / Parquet / SQuAD .json|.zip files, or {VITAL_ARTICLES!r} / {SQUAD_PARAGRAPHS!r}",
    )
    build.add_argument("--out", required=True, help="corpus folder")
    build.add_argument("--tokenizer", default=MINILM, help="'minilm' or a folder with a BERT tokenizer")
    build.add_argument("--max-block-tokens", type=positive_int, help="block budget incl. [CLS] title [SEP] body [SEP]")
    build.add_argument("--skip-bad", action="store_true", help="skip malformed records and count them")
    build.add_argument("--id-column", default="id", help="the field (JSONL key, Parquet column) of a document's id")
    build.add_argument("--title-column", default="title", help="the field of a document's title")
    build.add_argument("--text-column", default="text", help="the field of a document's text")
    common(build)
    build.set_defaults(run=cmd_corpus_build)

    qa = commands.add_parser("qa", help="question-answer files").add_subparsers(dest="action", required=True)
    split = qa.add_parser("split", help="split off a dev part for tuning (whole articles where questions name them)")
    split.add_argument("input", help="JSONL {question, answer: [...]} (*.regex.jsonl: regexes), or a named set")
    split.add_argument(
        "--dev-fraction",
        type=float,
        default=0.2,
        help="the share of questions in dev (default 0.2): whole articles where questions name theirs (`title`), "
        "else single questions, chosen by a hash of each",
    )
    split.add_argument("--out", required=True, help="folder for train.jsonl and dev.jsonl (.regex.jsonl for regexes)")
    common(split)
    split.set_defaults(run=cmd_qa_split)
