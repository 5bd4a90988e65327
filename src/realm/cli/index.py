"""`realm index build|refresh|add|remove`: the MIPS index over Embed_doc(z), its builder and live updates."""

from __future__ import annotations

import argparse
from pathlib import Path

from realm.cli.options import common, embedding_options, load_retriever, resolve_preset
from realm.index.builder_flags import builder_arguments


def cmd_index_build(args: argparse.Namespace) -> int:
    """One process, or every rank of a torchrun job embedding its share (rank 0 merges and publishes)."""
    from realm.data.blocks import BlockStore
    from realm.index.build import build_from_retriever
    from realm.training.distributed import setup_distributed

    d = setup_distributed()
    preset = resolve_preset(args)
    retriever = load_retriever(args.model, preset)
    meta = build_from_retriever(
        retriever,
        BlockStore(args.corpus),
        Path(args.out),
        preset.embed,
        preset.index,
        progress=not args.quiet and d.main,
        replace_model=args.replace_model,
        d=d,
    )
    rate = f"{meta.num_vectors / meta.embed_seconds:.1f} blocks/s" if meta.embed_seconds >= 1 else "finished shards"
    if d.main:
        print(
            f"index {args.out} v{meta.version}: {meta.num_vectors} x {meta.dim} ({meta.backend}), "
            f"embedded in {meta.embed_seconds:.0f}s ({rate}{f', {d.world_size} processes' if d.world_size > 1 else ''})"
            f", built in {meta.build_seconds:.0f}s"
        )
    return 0


def cmd_index_refresh(args: argparse.Namespace) -> int:
    """`python -m realm.index.refresh` under the CLI: the same flags, the same loop."""
    from realm.index.refresh import run_builder

    return run_builder(args)


def cmd_index_add(args: argparse.Namespace) -> int:
    """New knowledge without retraining: embed documents with the index's own document tower, publish a version."""
    from realm.index.mips import MipsIndex
    from realm.index.update import add_documents

    preset = resolve_preset(args)
    index = MipsIndex(args.index)
    retriever = load_retriever(args.model, preset, index)
    done = add_documents(
        index,
        args.docs,
        retriever,
        preset.embed,
        preset.index.keep_versions,
        skip_bad=args.skip_bad,
        corpus=args.corpus,
    )
    print(
        f"index {args.index} v{done.version}: added {done.documents} documents ({done.blocks} blocks), "
        f"{done.skipped} bad records skipped; {done.live_blocks} blocks live"
    )
    return 0


def cmd_index_remove(args: argparse.Namespace) -> int:
    from realm.index.mips import MipsIndex
    from realm.index.update import remove_documents

    ids = list(args.ids or [])
    if args.ids_file:
        ids += [line.strip() for line in Path(args.ids_file).read_text(encoding="utf-8").splitlines() if line.strip()]
    if not ids:
        raise ValueError("name the documents to remove with --ids and/or --ids-file")
    done = remove_documents(MipsIndex(args.index), ids, resolve_preset(args).index.keep_versions, corpus=args.corpus)
    print(
        f"index {args.index} v{done.version}: removed {done.documents} documents ({done.blocks} blocks); "
        f"{done.live_blocks} blocks live"
    )
    return 0


def add_commands(commands) -> None:
    index = commands.add_parser("index", help="MIPS index").add_subparsers(dest="action", required=True)
    build = index.add_parser("build", help="embed every block and publish a new index version")
    build.add_argument("--corpus", required=True)
    build.add_argument("--model", required=True, help="'minilm', 'random', or a checkpoint folder")
    build.add_argument("--out", required=True, help="index folder")
    build.add_argument(
        "--replace-model",
        action="store_true",
        help="publish even though the folder's live version was built by another model's document tower",
    )
    embedding_options(build)
    common(build)
    build.set_defaults(run=cmd_index_build)

    refresh = index.add_parser(
        "refresh",
        help="asynchronous index builder: follow a trainer's retriever snapshots (python -m realm.index.refresh)",
    )
    builder_arguments(refresh)
    refresh.set_defaults(run=cmd_index_refresh)

    add = index.add_parser("add", help="add documents to a live index (embedded by the model that built it)")
    add.add_argument("--index", required=True)
    add.add_argument("--docs", required=True, help='JSONL(.gz) of {"id", "title", "text"}')
    add.add_argument("--model", required=True, help="the model that built the index ('minilm' or a checkpoint folder)")
    add.add_argument("--corpus", help="corpus folder, if it moved since the index was built")
    add.add_argument("--skip-bad", action="store_true", help="skip malformed records and count them")
    common(add)
    add.set_defaults(run=cmd_index_add)

    remove = index.add_parser("remove", help="remove documents from a live index")
    remove.add_argument("--index", required=True)
    remove.add_argument("--ids", nargs="+", metavar="ID", help="document ids")
    remove.add_argument("--ids-file", help="file with one document id per line")
    remove.add_argument("--corpus", help="corpus folder, if it moved since the index was built")
    common(remove)
    remove.set_defaults(run=cmd_index_remove)
