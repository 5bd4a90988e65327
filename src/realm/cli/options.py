"""Flags shared by several commands, and the one mapping from flags to config fields.

Each command names the preset sections it may change; a flag changes only the field this table maps it to, in
those sections (so `realm train ict --batch-size` sets the ICT batch and nothing else, and `realm index build
--batch-size` the embedding batch). Nothing here imports torch: `realm --help` stays fast.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import TYPE_CHECKING

from realm.config import PRESETS, Preset, get_preset

if TYPE_CHECKING:  # annotations only: importing them would load torch before --help
    from realm.index.mips import MipsIndex
    from realm.models.retriever import Retriever

# section of the Preset -> {flag dest: field of that section}
RETRIEVERS = ["dense", "bm25", "hybrid"]
FLAG_FIELDS: dict[str, dict[str, str]] = {
    "corpus": {"max_block_tokens": "max_block_tokens"},
    "retriever": {"pooling": "pooling"},
    "embed": {
        "embed_batch_size": "batch_size",
        "dtype": "compute_dtype",
        "storage": "storage_dtype",
        "shard_size": "shard_size",
    },
    "index": {"backend": "backend"},
    "ict": {"steps": "steps", "batch_size": "batch_size", "lr": "lr", "decay_from": "decay_from"},
    "pretrain": {
        field: field
        for field in (
            "steps",
            "batch_size",
            "lr",
            "retriever_lr",
            "doc_tower",
            "retriever_frozen_steps",
            "null_warmup_steps",
            "reader_warmup",
            "reader_warmup_window",
            "reader_loss",
            "num_candidates",
            "masking",
            "salient_spans",
            "refresh_every",
            "builder",
            "checkpoint_every",
            "decay_from",
        )
    },
    "qa": {
        field: field
        for field in (
            "epochs",
            "batch_size",
            "lr",
            "retriever_lr",
            "top_k",
            "beam",
            "retriever",
            "answer_selection",
            "steps",
            "lr_warmup",
            "decay_from",
        )
    },
}
# sections every command may change through the flags it has (the trainers' sections only by their own command)
SHARED_SECTIONS = ("corpus", "retriever", "embed", "index")


def resolve_preset(args: argparse.Namespace, section: str | None = None) -> Preset:
    """The chosen preset with the command's flags applied to the shared sections and to `section`."""
    preset = get_preset(args.preset)
    changes = {}
    for name in (*SHARED_SECTIONS, *([section] if section else [])):
        values = {
            field: getattr(args, dest)
            for dest, field in FLAG_FIELDS[name].items()
            if getattr(args, dest, None) is not None
        }
        if values:
            changes[name] = dataclasses.replace(getattr(preset, name), **values)
    return dataclasses.replace(preset, **changes)


class Parser(argparse.ArgumentParser):
    """argparse, with a usage mistake reported as one `realm: error:` line (exit 2) like every other error."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"realm: error: {self.prog}: {message} (see `{self.prog} --help`)\n")


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} is not a positive integer")
    return value


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text} is not a positive number")
    return value


def positive_ints(text: str) -> list[int]:
    """A comma-separated list of positive integers, e.g. 1,5,20."""
    try:
        values = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError:
        values = []
    if not values or values[0] < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a list of positive integers like 1,5,20")
    return values


def non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text} is negative")
    return value


def common(parser: argparse.ArgumentParser, preset_default: str | None = "cpu", preset_help: str = "cpu") -> None:
    parser.add_argument(
        "--preset", default=preset_default, choices=sorted(PRESETS), help=f"settings preset (default: {preset_help})"
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bars")


def answerer_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="a `train qa` output (or minilm, a `train pretrain` output)")
    parser.add_argument(
        "--index",
        required=True,
        help="index built by the model's document tower "
        "(a version published later, e.g. by `index add`, is picked up by `serve`)",
    )
    parser.add_argument(
        "--retriever",
        choices=RETRIEVERS,
        default="dense",
        help="bm25: same reader, BM25 search; hybrid: dense + w · BM25 over both top lists, w from fine-tuning",
    )
    parser.add_argument("--corpus", help="corpus folder, if it moved since the index was built")
    parser.add_argument("--top-k", type=positive_int, help="blocks given to the reader (default: preset)")
    parser.add_argument(
        "--answer-selection",
        choices=["marginal", "best_span"],
        help="marginal: the string with the largest p(y | x) summed over its spans in the top blocks; best_span: "
        "ORQA's single best (block, span) (default: preset; cpu marginal, paper best_span)",
    )


def embedding_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--pooling", choices=["cls", "pooler", "mean"], help="tower pooling for a warm start (default: preset)"
    )
    parser.add_argument("--backend", choices=["flat", "hnsw", "ivfpq"], help="index type (default: flat, exact)")
    parser.add_argument("--batch-size", dest="embed_batch_size", type=positive_int, help="blocks per embedding batch")
    parser.add_argument("--dtype", choices=["auto", "bf16", "fp32"], help="compute dtype (auto: bf16 where supported)")
    parser.add_argument("--storage", choices=["fp16", "fp32"], help="stored embedding dtype (default fp16)")
    parser.add_argument("--shard-size", type=positive_int, help="blocks per resumable shard")


def load_retriever(spec: str, preset: Preset, index: MipsIndex | None = None) -> Retriever:
    """The model `spec`, with the retriever settings of `index` (pooling, sizes) when one is given."""
    from realm.models.retriever import Retriever

    return Retriever.load(spec, index.retriever_config(preset.retriever) if index is not None else preset.retriever)
