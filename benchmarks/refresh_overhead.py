"""Trainer throughput with the asynchronous index builder running beside it vs with a frozen index.

Both runs start from the same weights on the same corpus and take the same batches; the refreshing run
snapshots every `--refresh-every` steps so the builder is busy for the whole measurement. Steps/s is
measured from the trainer's own metrics log, after `--skip` warm-up steps (the bootstrap index build
happens before step 1 and is not counted). The baseline is the frozen run, measured in the same run.

    python benchmarks/refresh_overhead.py --corpus data/dev/corpus --retriever runs/dev/ict/retriever --steps 30
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
from pathlib import Path

from realm.config import get_preset
from realm.index.mips import MipsIndex
from realm.recipes.pretrain import train_pretrain
from realm.training import read_metrics


def steps_per_second(run: Path, skip: int) -> tuple[float, int]:
    rows = read_metrics(run)
    rows = [r for r in rows if r["step"] > skip]
    versions = {r.get("index_version") for r in rows}
    return (rows[-1]["step"] - rows[0]["step"]) / (rows[-1]["time"] - rows[0]["time"]), len(versions)


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
        for name, every in (
            ("frozen index (baseline)", 0),
            (f"refreshing, snapshot every {args.refresh_every}", args.refresh_every),
        ):
            config = dataclasses.replace(
                preset.pretrain,
                steps=args.steps,
                refresh_every=every,
                log_every=1,
                checkpoint_every=10**9,
                retriever_frozen_steps=0,
            )  # snapshot from the start
            out = Path(tmp) / str(every)
            train_pretrain(
                Path(args.corpus),
                out,
                args.retriever,
                "minilm",
                dataclasses.replace(preset, pretrain=config),
                progress=False,
            )
            rate, versions = steps_per_second(out, args.skip)
            results[name] = (rate, versions, MipsIndex(out / "index").version)
    base = next(iter(results.values()))[0]
    print("\n| trainer | steps/s | vs frozen | index versions used while measuring | versions published |")
    print("|---|---:|---:|---:|---:|")
    for name, (rate, versions, published) in results.items():
        print(f"| {name} | {rate:.3f} | {rate / base:.2f}x | {versions} | {published} |")


if __name__ == "__main__":
    main()
