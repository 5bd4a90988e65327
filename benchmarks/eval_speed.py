"""`realm eval qa` seconds per question: this tree against a base revision, side by side in one run.

The base revision is checked out into a temporary git worktree; both trees run the same command with the same
interpreter and packages (`PYTHONPATH=<tree>/src python -m realm.cli eval qa ...`), alternating round by
round. The figure is the evaluation's own `seconds` (retrieval + reading, model loading excluded) over the
questions asked; the exact match of both must agree (same model, same questions). With `--base-model` the base
tree answers with another model (a recipe's change of the reader: its answer time against the model before it;
the exact match then differs).

    python benchmarks/eval_speed.py --base 9269e25 --index data/load/index \\
        --qa squad-open-dev --limit 200 --rounds 2 [--base-model runs/old/qa/best]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from worktree import ROOT, base_worktree


def evaluate(src: Path, model: str, args: argparse.Namespace, out: Path) -> dict:
    command = [sys.executable, "-m", "realm.cli", "eval", "qa", "--model", model, "--index", args.index]
    command += ["--qa", args.qa, "--limit", str(args.limit), "--out", str(out), "--json", "--quiet"]
    env = {**os.environ, "PYTHONPATH": str(src)}
    done = subprocess.run(command, env=env, check=True, capture_output=True, text=True)
    return json.loads(done.stdout[done.stdout.index("{") :])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", required=True, help="revision to compare with")
    parser.add_argument("--index", required=True)
    parser.add_argument("--qa", required=True)
    parser.add_argument("--model", default="minilm")
    parser.add_argument("--base-model", default=None, help="the base tree's model (default: --model)")
    parser.add_argument("--limit", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, base_worktree(args.base) as base:
        trees = {
            f"base {args.base}": (base / "src", args.base_model or args.model),
            "this tree": (ROOT / "src", args.model),
        }
        runs: dict[str, list[dict]] = {name: [] for name in trees}
        for round_ in range(args.rounds):
            for name, (src, model) in trees.items():
                runs[name].append(evaluate(src, model, args, Path(tmp) / f"{round_}.jsonl"))
                print(f"round {round_ + 1}/{args.rounds}: {name} {runs[name][-1]['seconds']} s", flush=True)
    base_seconds = min(r["seconds"] for r in runs[f"base {args.base}"])
    print("| tree | questions | exact match | s per question (best round) | vs base |")
    print("|---|---:|---:|---:|---:|")
    for name, results in runs.items():
        best = min(r["seconds"] for r in results)
        questions = results[0]["questions"]
        print(
            f"| {name} | {questions} | {results[0]['exact_match']} | {best / questions:.4f} | "
            f"{base_seconds / best:.2f}x |"
        )


if __name__ == "__main__":
    main()
