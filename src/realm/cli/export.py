"""`realm export`: a model's retriever towers as sentence-transformers folders or ONNX graphs (models/export.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

from realm.cli.options import common, load_retriever, positive_int, resolve_preset

FORMATS = ("sentence-transformers", "onnx")  # models/export.py writes each


def cmd_export(args: argparse.Namespace) -> int:
    if args.int8 and args.format != "onnx":
        raise ValueError("--int8 quantizes ONNX graphs: use it with --format onnx")
    preset = resolve_preset(args)
    retriever = load_retriever(args.model, preset).eval()
    out = Path(args.out)
    try:
        if args.format == "onnx":
            from realm.models.export import export_onnx

            export_onnx(retriever, out, preset.corpus.max_block_tokens, args.int8)
        else:
            from realm.models.export import export_sentence_transformers

            export_sentence_transformers(retriever, out, preset.corpus.max_block_tokens)
    except ImportError as err:
        raise ValueError(f"--format {args.format} needs {err.name}: pip install 'realm[export]'") from err
    print(f"{args.model} -> {out}/query and {out}/doc ({args.format}{', with int8 graphs' if args.int8 else ''})")
    return 0


def add_commands(commands) -> None:
    export = commands.add_parser("export", help="the retriever towers as sentence-transformers folders or ONNX graphs")
    export.add_argument("model", help="minilm, a retriever folder, or a `train pretrain` / `train qa` output")
    export.add_argument("--format", choices=FORMATS, required=True)
    export.add_argument("--out", required=True, help="folder for query/ and doc/")
    export.add_argument("--int8", action="store_true", help="also model_int8.onnx (dynamic int8 quantization)")
    export.add_argument("--max-block-tokens", type=positive_int, help="the document tower's input length")
    common(export)
    export.set_defaults(run=cmd_export)
