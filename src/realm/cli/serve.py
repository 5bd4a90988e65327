"""`realm serve`: the HTTP API and web page (answers with their evidence)."""

from __future__ import annotations

import argparse
import os
import sys

from realm.cli.options import answerer_options, common, non_negative_int, positive_int, resolve_preset
from realm.config import SERVE_BATCH_SIZE, SERVE_BATCH_WAIT_MS

API_KEY_VARIABLE = "REALM_API_KEY"
LOOPBACK = ("127.0.0.1", "localhost", "::1")


def cmd_serve(args: argparse.Namespace) -> int:
    """The model loads once; the service follows the index folder's published version."""
    import uvicorn

    from realm.serve.bounds import ServiceLimits, uvicorn_settings
    from realm.serve.service import QAService, create_app

    api_key = args.api_key or os.environ.get(API_KEY_VARIABLE) or None
    if args.host not in LOOPBACK:
        protected = (
            "every request but / and /health needs the API key"
            if api_key
            else f"anyone who reaches it can ask (set --api-key or {API_KEY_VARIABLE})"
        )
        print(
            f"realm: warning: serving on {args.host}: other machines can reach this service; {protected}",
            file=sys.stderr,
        )
    service = QAService.load(
        args.model,
        args.index,
        resolve_preset(args, "qa"),
        args.retriever,
        corpus=args.corpus,
        batch_size=args.batch_size,
        batch_wait_ms=args.batch_wait_ms,
    )
    limits = ServiceLimits()
    uvicorn.run(
        create_app(service, api_key, limits),
        host=args.host,
        port=args.port,
        log_level="warning" if args.quiet else "info",
        **uvicorn_settings(limits),
    )
    return 0


def add_commands(commands) -> None:
    serve = commands.add_parser("serve", help="HTTP API and web page answering questions with their evidence")
    answerer_options(serve)
    serve.add_argument("--host", default="127.0.0.1", help="default: this machine only")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument(
        "--batch-size",
        type=positive_int,
        default=SERVE_BATCH_SIZE,
        help=f"questions read together (default {SERVE_BATCH_SIZE})",
    )
    serve.add_argument(
        "--batch-wait-ms",
        type=non_negative_int,
        default=SERVE_BATCH_WAIT_MS,
        help=f"how long a question waits for others to join its batch (default {SERVE_BATCH_WAIT_MS})",
    )
    serve.add_argument(
        "--api-key",
        help=f"require `Authorization: Bearer KEY` on every request but / and /health (or set {API_KEY_VARIABLE})",
    )
    common(serve)
    serve.set_defaults(run=cmd_serve)
