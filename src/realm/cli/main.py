"""`realm` command line: parser wiring only; each command group lives in its own module of this package.

No command module imports torch, transformers or faiss at import time, so `realm --help` answers at once.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

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
        code = args.run(args)
        sys.stdout.flush()  # a closed pipe is met here, not in Python's exit
        return code
    except KeyboardInterrupt:
        print("realm: interrupted; completed shards are kept and the next run resumes", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `realm search ... | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nothing more for Python's exit to flush
        return 141  # what a shell reports for a command ended by SIGPIPE
    except Exception as err:
        if isinstance(err, _user_errors()):
            print(f"realm: error: {err}", file=sys.stderr)
            return 2
        if isinstance(err, OSError):  # a full disk, a permission, a failing device: the writers' data holds
            print(f"realm: error: {_os_error_line(err)}", file=sys.stderr)
            return 1
        raise


def _os_error_line(err: OSError) -> str:
    """`<file>: <reason>`, with the free bytes for a full disk."""
    from realm.common.io import NoSpaceError, free_bytes, is_disk_full

    if isinstance(err, NoSpaceError) or err.strerror is None:
        return str(err)
    line = f"{err.filename}: {err.strerror}" if err.filename else err.strerror
    if is_disk_full(err):
        where = Path(err.filename).parent if err.filename else Path.cwd()
        line += f" ({free_bytes(where):,} bytes free in {where})"
    return line


if __name__ == "__main__":
    sys.exit(main())
