"""`realm` command line: parser wiring only; each command group lives in its own module of this package.

No command module imports torch, transformers or faiss at import time, so `realm --help` answers at once.
"""

from __future__ import annotations

import argparse
import logging
import sys

from realm.cli import corpus, evaluate, export, index, pipeline, serve, train
from realm.cli.options import Parser


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="realm", description="REALM: retrieval-augmented language models")
    commands = parser.add_subparsers(dest="command", required=True)
    for group in (corpus, index, train, evaluate, serve, export, pipeline):
        group.add_commands(commands)
    return parser


def _user_errors() -> tuple[type[BaseException], ...]:
    """Errors that mean bad input (a file, a flag, a folder), reported as one line; anything else is a bug."""
    from realm.data.sources import CorpusError
    from realm.index.mips import MipsIndexError

    return CorpusError, MipsIndexError, FileNotFoundError, FileExistsError, ValueError


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.argv = sys.argv[1:] if argv is None else argv
    logging.basicConfig(
        level=logging.WARNING if args.quiet else logging.INFO, format="%(levelname)s %(name)s: %(message)s"
    )
    try:
        return args.run(args)
    except KeyboardInterrupt:
        print("realm: interrupted; completed shards are kept and the next run resumes", file=sys.stderr)
        return 130
    except Exception as err:
        if isinstance(err, _user_errors()):
            print(f"realm: error: {err}", file=sys.stderr)
            return 2
        raise


if __name__ == "__main__":
    sys.exit(main())
