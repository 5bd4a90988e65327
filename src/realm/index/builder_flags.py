"""The index builder's flags, shared by `python -m realm.index.refresh` and `realm index refresh` (argparse only,
so that `realm --help` imports no torch)."""

from __future__ import annotations

import argparse


def builder_arguments(parser: argparse.ArgumentParser) -> None:
    """The builder's flags, the same for `python -m realm.index.refresh` and `realm index refresh`."""
    parser.add_argument("--config", required=True, help="builder.json written by the trainer (BuilderConfig)")
    parser.add_argument("--watch", required=True, help="the trainer's snapshots folder")
    parser.add_argument("--corpus", required=True)
    parser.add_argument("--out", required=True, help="index folder to publish new versions into")
    parser.add_argument("--poll-seconds", type=float, default=2.0)
    parser.add_argument("--max-builds", type=int, help="exit after this many builds")
    parser.add_argument("--threads", type=int, help="torch threads (leave cores to a trainer on the same machine)")
    parser.add_argument("--parent-pid", type=int, help="stop when this process (the trainer that started us) is gone")
    parser.add_argument("--nice", type=int, default=0, help="lower this process's CPU priority by N (0-19)")
    parser.add_argument("--quiet", action="store_true", help="log warnings only")
