"""`realm serve`: the HTTP API and web page (answers with their evidence)."""

from __future__ import annotations

import argparse

from realm.cli.options import answerer_options, common, resolve_preset


def cmd_serve(args: argparse.Namespace) -> int:
    """The model loads once; the service follows the index folder's published version."""
    import uvicorn

    from realm.serve.service import QAService, create_app

    service = QAService.load(args.model, args.index, resolve_preset(args, "qa"), args.retriever, corpus=args.corpus)
    uvicorn.run(create_app(service), host=args.host, port=args.port, log_level="warning" if args.quiet else "info")
    return 0


def add_commands(commands) -> None:
    serve = commands.add_parser("serve", help="HTTP API and web page answering questions with their evidence")
    answerer_options(serve)
    serve.add_argument("--host", default="127.0.0.1", help="default: this machine only")
    serve.add_argument("--port", type=int, default=8000)
    common(serve)
    serve.set_defaults(run=cmd_serve)
