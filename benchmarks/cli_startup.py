"""`realm --help` start-up time: this tree against a base revision, measured side by side in one run.

The base revision is checked out into a temporary git worktree and both run with the same interpreter and
packages (`PYTHONPATH=<tree>/src python -m realm.cli --help`), alternating, so machine noise hits both alike.

    python benchmarks/cli_startup.py [--base 87c2b0c] [--runs 7]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from worktree import ROOT, base_worktree


def seconds(src: Path) -> float:
    started = time.perf_counter()
    env = {**os.environ, "PYTHONPATH": str(src)}
    subprocess.run([sys.executable, "-m", "realm.cli", "--help"], env=env, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", default="87c2b0c", help="revision to compare with (default: before the layout)")
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    with base_worktree(args.base) as base:
        trees = {f"base {args.base}": base / "src", "this tree": ROOT / "src"}
        for src in trees.values():  # warm the file cache once
            seconds(src)
        times: dict[str, list[float]] = {name: [] for name in trees}
        for _ in range(args.runs):
            for name, src in trees.items():
                times[name].append(seconds(src))
    baseline = statistics.median(times[f"base {args.base}"])
    for name, runs in times.items():
        median = statistics.median(runs)
        print(f"{name:>16}: median {median:.2f} s (min {min(runs):.2f}, max {max(runs):.2f}), {baseline / median:.1f}x")


if __name__ == "__main__":
    main()
