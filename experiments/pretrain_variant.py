"""REALM pretraining from the warm start with the cpu preset's settings, some changed: one variant of the recipe,
for sweeps of settings `realm train pretrain` has no flag for (e.g. the warm-up's learning rates or its window).

Score variants with `experiments/pretrain_eval.py --every-span` on the same masks; several variants may train at once
on one GPU (each is a separate process).

    python experiments/pretrain_variant.py --corpus runs/default/corpus --out runs/lr3e-4 \
        --set lr=3e-4 null_warmup_steps=500 steps=501

--reuse-index: index folders (e.g. a pipeline run's baseline_index/index) whose embeddings the first index copies
where the same document tower built them over this corpus, instead of embedding it again.

Resumable: run it again.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from realm.common.weights import MINILM
from realm.config import get_preset, parse_settings
from realm.recipes.pretrain import train_pretrain


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", required=True, type=Path)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--warm-start", default=MINILM, help="both towers and the reader (default: MiniLM)")
    parser.add_argument("--set", nargs="+", default=[], help="pretrain settings to change, e.g. lr=3e-4")
    parser.add_argument(
        "--reuse-index", nargs="*", type=Path, default=[], help="index folders the first index may copy (same tower)"
    )
    parser.add_argument("--preset", default="cpu")
    parser.add_argument("--dtype", choices=["auto", "bf16", "fp32"], help="compute precision (default: preset's)")
    args = parser.parse_args()

    preset = get_preset(args.preset)
    pretrain = dataclasses.replace(preset.pretrain, **parse_settings(args.set))  # type: ignore[arg-type]
    embed = dataclasses.replace(preset.embed, compute_dtype=args.dtype or preset.embed.compute_dtype)
    preset = dataclasses.replace(preset, pretrain=pretrain, embed=embed)
    train_pretrain(
        args.corpus,
        args.out,
        args.warm_start,
        args.warm_start,
        preset,
        resume=True,
        progress=False,
        reuse_indexes=args.reuse_index,
    )
    print(f"{args.out}: {', '.join(args.set) or 'no change'} from {args.warm_start} ({args.preset} preset)")


if __name__ == "__main__":
    main()
