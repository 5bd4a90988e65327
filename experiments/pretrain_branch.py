"""A paired comparison of pretraining settings: branch a REALM pretraining run at one of its checkpoints and
train on from there with settings changed.

Two pipeline runs of the same recipe differ by more than a setting does (the budget's calibration draws other step
counts, and every step after a change of schedule sees other data): docs/log, "The README main command with
no ICT". A branch shares everything up to its checkpoint (the warm-up, the towers, the index, the optimizer and the
random state) and, after it, the data order and the step count; only the settings named with --set differ. Score the
two with `experiments/pretrain_eval.py --every-span` on the same masks.

    python experiments/pretrain_branch.py --run runs/cand45/realm --checkpoint saved/step-00001620 \
        --set reader_loss=marginal --out runs/ctl45

--checkpoint is a checkpoint folder of --run, copied while it trained (a finished run keeps its last one only).
Run it from the folder the run was trained in: its config.json holds paths relative to it. Resumable: run it again.
"""

from __future__ import annotations

import argparse
import dataclasses
import shutil
from pathlib import Path

from realm.config import (
    EmbedConfig,
    IndexConfig,
    PretrainConfig,
    RetrieverConfig,
    get_preset,
    parse_settings,
    read_run_config,
)
from realm.recipes.pretrain import train_pretrain
from realm.training.checkpoints import CHECKPOINTS, latest_checkpoint


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", required=True, type=Path, help="a `realm train pretrain` output (or a pipeline's)")
    parser.add_argument("--checkpoint", required=True, type=Path, help="one of the run's checkpoint folders")
    parser.add_argument("--set", nargs="+", default=[], help="pretrain settings to change, e.g. reader_loss=marginal")
    parser.add_argument("--out", required=True, type=Path)
    args = parser.parse_args()

    saved = read_run_config(args.run)
    if saved is None:
        raise SystemExit(f"{args.run}: no config.json: not a `realm train pretrain` output")
    config = saved["config"]
    preset = dataclasses.replace(
        get_preset("cpu"),
        pretrain=dataclasses.replace(PretrainConfig(**config["pretrain"]), **parse_settings(args.set)),  # type: ignore[arg-type]
        retriever=RetrieverConfig.from_dict(config["retriever"]),
        embed=EmbedConfig(**config["embed"]),
        index=IndexConfig(**config["index"]),
    )
    if latest_checkpoint(args.out) is None:
        (args.out / CHECKPOINTS).mkdir(parents=True, exist_ok=True)
        shutil.copytree(args.checkpoint, args.out / CHECKPOINTS / args.checkpoint.name)
    train_pretrain(
        Path(config["corpus"]),
        args.out,
        config["retriever_model"],
        config["reader_model"],
        preset,
        resume=True,
        progress=False,
        reuse_indexes=[args.run / "index"],
    )
    print(f"{args.out}: {', '.join(args.set) or 'no change'} from {args.checkpoint.name} of {args.run}")


if __name__ == "__main__":
    main()
