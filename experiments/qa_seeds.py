"""How far apart does QA fine-tuning land on its own? Seed replicates of a pipeline's QA stages.

The ablation table's intervals resample questions, not training: two fine-tunings that differ only in their seed
(data order, dropout, the span head's initial weights) can differ by more than the ablation they compare. This
re-runs the QA stages of a `realm pipeline --ablations` run with other seeds, everything else as the stage ran it
(its config.json: model, reader, index, every QA setting), scores each on all dev questions with the dense retriever
as the pipeline's ablation rows do, and prints:
    - each stage's dense exact match per seed (seed 0: the pipeline's own run), their mean and spread;
    - for each pair A:B (the report's ablation rows by default), per seed, the paired difference A - B with its 95%
      interval over questions, and the mean of those differences over seeds;
    - per stage, each seed against seed 0 (same stage, same data): the training noise itself, paired.

    python experiments/qa_seeds.py --run runs/abl120c --pairs qa:qa_ict qa_trained:qa_frozen --seeds 1 --out runs/abl120c_seeds

Run it from the folder the pipeline ran in: the stages' config.json hold paths relative to it. Each replicate is a
folder under --out (resumable; a finished one is read back, not rerun).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
from pathlib import Path

from realm.common.io import write_json_atomic
from realm.config import QAConfig, RetrieverConfig, get_preset, read_run_config
from realm.data.qa_examples import load_qa
from realm.data.sources import squad_question_titles
from realm.eval.qa import compare_predictions
from realm.pipeline.ablations import predictions as pipeline_predictions
from realm.pipeline.stage_table import MAIN_QA
from realm.pipeline.work import finetune, split_training_questions
from realm.training.checkpoints import latest_checkpoint

RESULT = "replicate.json"
# the ablation table's rows (pipeline/ablations.py): the main run against each ablated one
ABLATION_PAIRS = ["qa:qa_ict", "qa:qa_uniform", "qa:qa_trained", "qa_trained:qa_frozen"]


def stage_predictions(run: Path, stage: str) -> Path:
    """The dense predictions the pipeline wrote for a QA stage: the main one's in eval/, an ablation's in arms_eval/."""
    return pipeline_predictions(run, MAIN_QA if stage == "qa" else stage)


def stage_config(run: Path, stage: str) -> dict:
    """A pipeline stage's config.json: {"config", "command", ...}."""
    saved = read_run_config(run / stage)
    if saved is None:
        raise SystemExit(f"{run / stage}: no config.json: not a QA stage of a pipeline run")
    return saved


def replicate(run: Path, stage: str, seed: int, out: Path, command: list[str]) -> Path:
    """Fine-tune and score `stage` again with `seed`; returns the dense predictions file."""
    folder = out / f"{stage}_seed{seed}"
    if (folder / RESULT).is_file():
        return folder / "predictions_dense.jsonl"
    config = stage_config(run, stage)["config"]
    preset = get_preset("cpu")
    preset = dataclasses.replace(
        preset,
        qa=dataclasses.replace(QAConfig(**config["qa"]), seed=seed),
        retriever=RetrieverConfig(**config["retriever"]),
    )
    train_path, dev_path = command[command.index("--qa-train") + 1], command[command.index("--qa-dev") + 1]
    articles = (
        squad_question_titles(Path(command[command.index("--qa-articles") + 1])) if "--qa-articles" in command else None
    )
    train, held_out = split_training_questions(load_qa(train_path, articles))  # as the pipeline split them
    result = finetune(
        Path(config["model"]),
        Path(config["index"]),
        Path(config["reader"]) if config.get("reader") else None,
        train,
        held_out,
        preset,
        folder,
        resume=latest_checkpoint(folder) is not None,
        progress=False,
        evaluated=load_qa(dev_path),
    )
    write_json_atomic(folder / RESULT, {"stage": stage, "seed": seed, **result})
    return folder / "predictions_dense.jsonl"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", required=True, type=Path, help="a `realm pipeline --ablations` run directory")
    parser.add_argument("--pairs", nargs="+", default=ABLATION_PAIRS, help="A:B, two QA stages compared (A - B)")
    parser.add_argument("--seeds", nargs="+", type=int, default=[1, 2], help="seeds besides the pipeline's (0)")
    parser.add_argument("--out", required=True, type=Path)
    args = parser.parse_args()

    pairs = [tuple(pair.split(":")) for pair in args.pairs]
    if any(len(pair) != 2 for pair in pairs):
        parser.error(f"--pairs: each is STAGE_A:STAGE_B, got {args.pairs}")
    stages = list(dict.fromkeys(stage for pair in pairs for stage in pair))
    command = stage_config(args.run, stages[0])["command"]
    predictions = {stage: {0: stage_predictions(args.run, stage)} for stage in stages}
    for seed in args.seeds:
        for stage in stages:
            predictions[stage][seed] = replicate(args.run, stage, seed, args.out, command)
            print(f"{stage} seed {seed}: done", flush=True)

    seeds = [0, *args.seeds]
    print(f"\ndense exact match on {command[command.index('--qa-dev') + 1]}, by seed (0: the pipeline's run)")
    for stage in stages:
        ems = [compare_predictions(predictions[stage][s], predictions[stage][s])["exact_match_a"] for s in seeds]
        spread = statistics.stdev(ems) if len(ems) > 1 else 0.0
        shown = "  ".join(f"{s}: {em:.2f}" for s, em in zip(seeds, ems))
        print(f"  {stage:<12} {shown}   mean {statistics.mean(ems):.2f}, sd {spread:.2f}")
    for a, b in pairs:
        print(f"\n{a} - {b}, paired over questions, by seed")
        differences = []
        for s in seeds:
            paired = compare_predictions(predictions[a][s], predictions[b][s])
            differences.append(paired["difference"])
            low, high = paired["difference_95ci"]
            print(f"  seed {s}: {paired['difference']:+.2f} [{low:+.2f}, {high:+.2f}]")
        print(
            f"  mean over seeds {statistics.mean(differences):+.2f}, range [{min(differences):+.2f}, {max(differences):+.2f}]"
        )
    print("\nthe same stage, seed s - seed 0 (training noise alone), paired over questions")
    for stage in stages:
        for s in args.seeds:
            paired = compare_predictions(predictions[stage][s], predictions[stage][0])
            low, high = paired["difference_95ci"]
            print(f"  {stage:<12} seed {s} - seed 0: {paired['difference']:+.2f} [{low:+.2f}, {high:+.2f}]")


if __name__ == "__main__":
    main()
