"""`realm train ict|pretrain|qa`: the recipes. Each command's flags change only its own trainer's config."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from realm.cli.options import common, non_negative_int, positive_float, positive_int, resolve_preset
from realm.common.weights import MINILM


def cmd_train_ict(args: argparse.Namespace) -> int:
    from realm.recipes.ict import train_ict

    folder = train_ict(
        Path(args.corpus),
        Path(args.out),
        args.model,
        resolve_preset(args, "ict"),
        resume=args.resume,
        progress=not args.quiet,
        allow_config_change=args.allow_config_change,
    )
    print(f"ICT retriever saved to {folder}")
    return 0


def cmd_train_pretrain(args: argparse.Namespace) -> int:
    from realm.recipes.pretrain import train_pretrain

    folder = train_pretrain(
        Path(args.corpus),
        Path(args.out),
        args.retriever,
        args.reader,
        resolve_preset(args, "pretrain"),
        resume=args.resume,
        progress=not args.quiet,
        allow_config_change=args.allow_config_change,
    )
    print(f"REALM retriever and reader saved to {folder}/retriever and {folder}/reader")
    return 0


def cmd_train_qa(args: argparse.Namespace) -> int:
    import dataclasses

    from realm.data.qa_examples import load_qa
    from realm.recipes.finetune_qa import train_qa
    from realm.recipes.reading import train_reading

    preset, train, reader = resolve_preset(args, "qa"), load_qa(args.train), args.reader
    if args.reading_epochs is not None:
        preset = dataclasses.replace(preset, reading=dataclasses.replace(preset.reading, epochs=args.reading_epochs))
    if preset.reading.total_steps(len(train)):  # the reader first reads answer-bearing blocks (recipes/reading.py)
        read = train_reading(
            args.model, Path(args.index), train, Path(args.out) / "read", preset, args.resume, not args.quiet, reader
        )
        print(f"reading stage: reader saved to {read}")
        reader = str(read)
    best = train_qa(
        args.model,
        Path(args.index),
        train,
        load_qa(args.dev),
        Path(args.out),
        preset,
        resume=args.resume,
        progress=not args.quiet,
        reader_spec=reader,
        allow_config_change=args.allow_config_change,
    )
    print(f"best model (dev exact match {json.loads((best / 'dev.json').read_text())['exact_match']:.2f}) in {best}")
    return 0


def _resume_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--resume", action="store_true", help="continue from the newest checkpoint in --out")
    parser.add_argument(
        "--allow-config-change",
        action="store_true",
        help="resume even though settings differ from the run's config.json (they are listed)",
    )


def _replay_options(parser: argparse.ArgumentParser, steps: bool = False) -> None:
    """The step counts a run under a deadline records in its steps.json: given as these, they replay its schedule."""
    if steps:
        parser.add_argument("--steps", type=positive_int, help="steps in all (default: the epochs')")
        parser.add_argument("--lr-warmup", type=non_negative_int, help="learning-rate warm-up steps (default: ORQA's)")
    parser.add_argument(
        "--decay-from",
        type=non_negative_int,
        help="the learning rate decays from no earlier than this step (a deadline's run, replayed: its steps.json)",
    )


def add_commands(commands) -> None:
    train = commands.add_parser("train", help="training recipes").add_subparsers(dest="action", required=True)
    _ict_command(train)
    _pretrain_command(train)
    _qa_command(train)


def _ict_command(train) -> None:
    ict = train.add_parser("ict", help="Inverse Cloze Task warm start of the retriever")
    ict.add_argument("--corpus", required=True)
    ict.add_argument("--out", required=True)
    ict.add_argument("--model", default=MINILM, help="warm start of both towers (default: minilm)")
    ict.add_argument("--steps", type=positive_int)
    ict.add_argument("--batch-size", type=positive_int)
    ict.add_argument("--lr", type=float)
    _replay_options(ict)
    _resume_options(ict)
    common(ict)
    ict.set_defaults(run=cmd_train_ict)


def _pretrain_command(train) -> None:
    pretrain = train.add_parser("pretrain", help="REALM pretraining with an asynchronously refreshed index")
    pretrain.add_argument("--corpus", required=True, help="knowledge corpus Z (its sentences are also X)")
    pretrain.add_argument("--out", required=True)
    pretrain.add_argument("--retriever", default=MINILM, help="retriever warm start, e.g. an ICT run's retriever/")
    pretrain.add_argument("--reader", default=MINILM, help="reader warm start (BERT folder or minilm)")
    pretrain.add_argument("--steps", type=positive_int)
    pretrain.add_argument("--batch-size", type=positive_int, help="global batch (split across torchrun processes)")
    pretrain.add_argument("--lr", type=float)
    pretrain.add_argument("--retriever-lr", type=float, help="learning rate of both towers (default: preset)")
    pretrain.add_argument(
        "--doc-tower",
        choices=["trained", "fixed"],
        help="fixed: only the query tower trains; the first index stays exact, no refreshes",
    )
    pretrain.add_argument(
        "--retriever-frozen-steps",
        type=non_negative_int,
        help="towers stay frozen for the first N steps while the reader's fresh head learns",
    )
    pretrain.add_argument(
        "--null-warmup-steps",
        type=non_negative_int,
        help="the first N steps train the reader on the null document alone (no retrieval; cheap steps)",
    )
    pretrain.add_argument(
        "--reader-warmup",
        choices=["null", "copy", "context", "copy+context", "holder"],
        help="what the warm-up reads beside the null document: nothing, the sentence's own block whole (copy), "
        "without it (context) or each for half the batch (copy+context), or the best-scored block of another "
        "document that holds the masked span (holder)",
    )
    pretrain.add_argument(
        "--reader-warmup-window", type=non_negative_int, help="own-block words kept each side of the sentence (0: all)"
    )
    pretrain.add_argument(
        "--reader-loss",
        choices=["marginal", "marginal+candidates"],
        help="marginal: the paper's; marginal+candidates adds each candidate's own masked-LM loss (the reader only)",
    )
    pretrain.add_argument(
        "--num-candidates", type=positive_int, help="candidates per query, the null document included"
    )
    pretrain.add_argument("--masking", choices=["salient", "random-span", "uniform"])
    pretrain.add_argument(
        "--salient-spans",
        choices=["any", "recoverable"],
        help="recoverable: mask only salient spans that a block of another document holds",
    )
    pretrain.add_argument(
        "--refresh-every", type=non_negative_int, help="snapshot for the index builder every N steps; 0: frozen"
    )
    pretrain.add_argument(
        "--builder",
        choices=["local", "external"],
        help="local: start the index builder beside the trainer; external: one runs elsewhere "
        "(realm index refresh --config OUT/builder.json ...)",
    )
    pretrain.add_argument("--checkpoint-every", type=positive_int)
    _replay_options(pretrain)
    _resume_options(pretrain)
    common(pretrain)
    pretrain.set_defaults(run=cmd_train_pretrain)


def _qa_command(train) -> None:
    qa = train.add_parser("qa", help="open-QA fine-tuning over a frozen document index")
    qa.add_argument("--model", default=MINILM, help="minilm, a `train pretrain` output or a `train qa` output")
    qa.add_argument("--index", required=True, help="index built by the model's document tower")
    qa.add_argument(
        "--reader",
        help="reader warm start in place of the model's own (e.g. an ICT run with minilm: the ICT-only baseline)",
    )
    qa.add_argument(
        "--train",
        required=True,
        help="JSONL {question, answer: [...]} (*.regex.jsonl: regexes), or a named set (squad-open-train, nq-dev, ...)",
    )
    qa.add_argument("--dev", required=True, help="questions that choose the checkpoint: a file or a named set")
    qa.add_argument("--out", required=True)
    qa.add_argument("--epochs", type=positive_float, help="passes over the training questions (0.5: half of one)")
    qa.add_argument("--batch-size", type=positive_int)
    qa.add_argument("--lr", type=float, help="reader learning rate (the fresh span head: x the preset's multiplier)")
    qa.add_argument("--retriever-lr", type=float, help="query tower learning rate (default: preset)")
    qa.add_argument(
        "--retriever",
        choices=["dense", "hybrid"],
        help="dense, or hybrid: dense + w · BM25 over the union of both top lists, w learned (default: preset)",
    )
    qa.add_argument(
        "--reading-epochs",
        type=float,
        help="passes of the reading stage before fine-tuning: the reader on answer-bearing blocks (default: the "
        "preset's, cpu 2; 0: none, ORQA's recipe)",
    )
    qa.add_argument("--top-k", type=positive_int, help="blocks given to the reader")
    qa.add_argument("--beam", type=positive_int, help="blocks searched for the retrieval loss")
    _replay_options(qa, steps=True)
    _resume_options(qa)
    common(qa)
    qa.set_defaults(run=cmd_train_qa)
