"""Trainer throughput with the asynchronous index builder running beside it vs with a frozen index.

Every run starts from the same weights on the same corpus and takes the same batches; the refreshing runs
snapshot every `--refresh-every` steps so the builder is busy for the whole measurement. Steps/s is
measured from the trainer's own metrics log, after `--skip` warm-up steps (the bootstrap index build
happens before step 1 and is not counted). The baseline is the frozen run, measured in the same run.
Schedules of the builder beside the trainer: the default (the trainer leaves the builder a core while it
rebuilds, `share_cores`), both contending for every core (share_cores disabled), and the builder at nice 19
while contending.

    python benchmarks/refresh_overhead.py --corpus data/dev/corpus --retriever runs/dev/ict/retriever --steps 30
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
from pathlib import Path

import realm.index.refresh as refresh
import realm.recipes.pretrain as recipe
from realm.config import get_preset
from realm.index.mips import MipsIndex
from realm.training.metrics import read_metrics


def measure(run: Path, skip: int) -> dict:
    """Steps/s, index versions used and the mean staleness of the index each step searched (steps and seconds
    since the snapshot it was built from), after `skip` warm-up steps."""
    rows = [r for r in read_metrics(run) if r["step"] > skip]
    return {
        "rate": (rows[-1]["step"] - rows[0]["step"]) / (rows[-1]["time"] - rows[0]["time"]),
        "versions": len({r.get("index_version") for r in rows}),
        "stale_steps": sum(r["staleness_steps"] for r in rows) / len(rows),
        "stale_seconds": sum(r["staleness_seconds"] for r in rows) / len(rows),
        "published": MipsIndex(run / "index").version,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", required=True)
    parser.add_argument("--retriever", default="minilm")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--refresh-every", type=int, default=5)
    parser.add_argument("--skip", type=int, default=3)
    args = parser.parse_args()
    preset = get_preset("cpu")
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        yields = refresh.share_cores
        for name, every, nice, share in (
            ("frozen index (baseline)", 0, 0, True),
            (
                "builder beside it, the trainer leaves it a core while it rebuilds (default)",
                args.refresh_every,
                0,
                True,
            ),
            ("builder beside it, both contending for every core", args.refresh_every, 0, False),
            ("builder beside it at nice 19, both contending", args.refresh_every, 19, False),
        ):
            refresh.share_cores = yields if share else lambda index_dir, threads: None
            config = dataclasses.replace(
                preset.pretrain,
                steps=args.steps,
                refresh_every=every,
                builder_nice=nice,
                log_every=1,
                checkpoint_every=10**9,
                retriever_frozen_steps=0,
            )  # snapshot from the start
            out = Path(tmp) / f"every{every}-nice{nice}-share{share}"
            recipe.train_pretrain(
                Path(args.corpus),
                out,
                args.retriever,
                "minilm",
                dataclasses.replace(preset, pretrain=config),
                progress=False,
            )
            results[name] = measure(out, args.skip)
    base = next(iter(results.values()))["rate"]
    print("\n| trainer | steps/s | vs frozen | index versions used | versions published | mean staleness |")
    print("|---|---:|---:|---:|---:|---|")
    for name, r in results.items():
        print(
            f"| {name} | {r['rate']:.3f} | {r['rate'] / base:.2f}x | {r['versions']} | {r['published']} | "
            f"{r['stale_steps']:.1f} steps, {r['stale_seconds']:.0f} s |"
        )


if __name__ == "__main__":
    main()
