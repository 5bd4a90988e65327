"""Seconds a REALM pretraining step of the cpu preset, warm-up and retrieval: this tree against a base revision,
side by side in one run.

The base revision is checked out into a temporary git worktree; each tree trains its own cpu preset from MiniLM for
`--warmup` warm-up steps and `--retrieval` retrieval steps on the same corpus (`PYTHONPATH=<tree>/src`, the same
interpreter and packages), over a copy of one index (`--index`, built by MiniLM's document tower over the corpus, so
that no run embeds), alternating round by round. `--set` runs this tree again with settings changed (e.g.
`reader_warmup_window=0`, to tell a setting's share from the code's). The figure is the mean gap between the logged
steps (metrics.jsonl), the first two of each kind left out.

    python benchmarks/warmup_step.py --base a2f58d1 --corpus runs/default/corpus \\
        --index runs/default/realm/index --set reader_warmup_window=0
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from worktree import ROOT, base_worktree

from realm.config import parse_settings

TRAIN = """
import dataclasses, json, sys
from realm.config import PretrainConfig, get_preset
from realm.recipes.pretrain import train_pretrain
corpus, out, warmup, retrieval, changes = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
preset = get_preset("cpu")
settings = dict(json.loads(changes), null_warmup_steps=warmup, steps=warmup + retrieval, log_every=1,
                checkpoint_every=100_000, refresh_every=0)
known = {f.name for f in dataclasses.fields(PretrainConfig)}
pretrain = dataclasses.replace(preset.pretrain, **{k: v for k, v in settings.items() if k in known})
train_pretrain(corpus, out, "minilm", "minilm", dataclasses.replace(preset, pretrain=pretrain), progress=False)
"""


def step_seconds(run: Path, warmup: int) -> tuple[float, float]:
    """(mean seconds a warm-up step, a retrieval step), each without its kind's first two steps."""
    times = [json.loads(line)["time"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    gaps = [b - a for a, b in zip(times, times[1:])]  # gaps[i]: step i + 2
    warm, retrieval = gaps[1 : warmup - 1], gaps[warmup + 1 :]
    return sum(warm) / len(warm), sum(retrieval) / max(1, len(retrieval))


def train(src: Path, args: argparse.Namespace, changes: dict, out: Path) -> tuple[float, float]:
    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(args.index, out / "index")
    env = {**os.environ, "PYTHONPATH": str(src)}
    command = [sys.executable, "-c", TRAIN, args.corpus, str(out), str(args.warmup), str(args.retrieval)]
    subprocess.run([*command, json.dumps(changes)], env=env, check=True, capture_output=True, text=True)
    return step_seconds(out, args.warmup)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", required=True, help="revision to compare with")
    parser.add_argument("--corpus", required=True)
    parser.add_argument("--index", required=True, help="an index of the corpus built by MiniLM's document tower")
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--retrieval", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--set", nargs="*", default=[], help="a second run of this tree with these settings")
    args = parser.parse_args()
    varied = parse_settings(args.set)
    with tempfile.TemporaryDirectory() as tmp, base_worktree(args.base) as base:
        runs = {f"base {args.base}": (base / "src", {}), "this tree": (ROOT / "src", {})}
        if varied:
            runs[f"this tree, {' '.join(args.set)}"] = (ROOT / "src", varied)
        seconds: dict[str, list[tuple[float, float]]] = {name: [] for name in runs}
        for round_ in range(args.rounds):
            for name, (src, changes) in runs.items():
                seconds[name].append(train(src, args, changes, Path(tmp) / "run"))
                warm, retrieval = seconds[name][-1]
                print(
                    f"round {round_ + 1}/{args.rounds}: {name}: {warm:.3f} s warm-up, {retrieval:.3f} s retrieval",
                    flush=True,
                )
    base_warm, base_retrieval = (min(s[i] for s in seconds[f"base {args.base}"]) for i in (0, 1))
    print("| tree | s a warm-up step (best round) | vs base | s a retrieval step (best round) | vs base |")
    print("|---|---:|---:|---:|---:|")
    for name, results in seconds.items():
        warm, retrieval = (min(s[i] for s in results) for i in (0, 1))
        print(
            f"| {name} | {warm:.3f} | {base_warm / warm:.2f}x | {retrieval:.3f} | {base_retrieval / retrieval:.2f}x |"
        )


if __name__ == "__main__":
    main()
