"""The reading stage (recipes/reading.py) on its own, then optionally ORQA's fine-tuning: exact match on the tuning
split, paired with earlier outputs of this script.

Trains the reader of `--model` (default MiniLM; its retriever stays fixed) for `--read-minutes` on the training
questions' answer-bearing blocks (`--set` changes reading settings, e.g. negatives=0), then QA fine-tuning for
`--qa-minutes` from that reader (0: none), and answers the tuning split of the training file (whole articles neither
stage sees; a choice between settings never reads the dev questions a run reports) with hybrid retrieval, as `ask`
does. Prints EM with its 95% interval and, for each `--compare` output, the paired difference.

    python experiments/reading_stage.py --index runs/default/baseline_index/index --train squad-open-train \
        --read-minutes 6 --out runs/read6 --compare runs/qa6

Each output is kept: run it again to re-score (a finished stage is read back, not trained again).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

import numpy as np

from realm.common.deadline import Deadline
from realm.common.device import default_device
from realm.common.weights import MINILM
from realm.config import QAConfig, ReadingConfig, get_preset, parse_settings
from realm.data.qa_examples import load_qa
from realm.eval.answerer import Answerer
from realm.eval.intervals import paired_difference
from realm.eval.qa import answer_questions, summarise
from realm.index.search import open_searcher
from realm.models.orqa import QAModel
from realm.pipeline.work import split_training_questions
from realm.recipes.finetune_qa import BEST, train_qa
from realm.recipes.reading import train_reading
from realm.training.schedule import TimedSteps


def deadline(minutes: float, step_seconds: float) -> TimedSteps:
    return TimedSteps(Deadline(time.time() + 60 * minutes), step_seconds=step_seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--index", required=True, type=Path, help="index built by the model's document tower")
    parser.add_argument("--train", required=True, help="training questions (a file or a named set)")
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--model", default=MINILM)
    parser.add_argument("--read-minutes", type=float, default=6.0, help="0: no reading stage")
    parser.add_argument("--qa-minutes", type=float, default=0.0, help="0: no QA fine-tuning after it")
    parser.add_argument("--set", nargs="+", default=[], help="reading settings to change, e.g. negatives=0")
    parser.add_argument(
        "--qa-set",
        nargs="+",
        default=[],
        help="QA settings to change, e.g. lr=3e-4 (span_head: the reading stage's too)",
    )
    parser.add_argument("--questions", type=int, default=600, help="tuning-split questions answered (seeded)")
    parser.add_argument("--compare", nargs="*", default=[], type=Path, help="earlier outputs of this script")
    args = parser.parse_args()

    preset = get_preset("cpu")
    reading = dataclasses.replace(preset.reading, epochs=100.0, **parse_settings(args.set, ReadingConfig))
    qa = dataclasses.replace(preset.qa, **parse_settings(args.qa_set, QAConfig))  # e.g. span_head: both stages'
    preset = dataclasses.replace(preset, reading=reading, qa=qa)
    train, tuning = split_training_questions(load_qa(args.train))
    tuning = [tuning[i] for i in sorted(np.random.default_rng(0).permutation(len(tuning))[: args.questions])]
    reader = None
    if args.read_minutes:
        reader = train_reading(
            args.model, args.index, train, args.out / "read", preset, resume=True,
            timed=deadline(args.read_minutes, preset.costs.read_step),
        )  # fmt: skip
    model_spec = args.model
    if args.qa_minutes:
        best = args.out / "qa" / BEST
        if not best.is_dir():
            qa = dataclasses.replace(preset.qa, epochs=100)
            tuned = dataclasses.replace(preset, qa=qa)
            until = deadline(args.qa_minutes, preset.costs.qa_step)
            train_qa(args.model, args.index, train, tuning[:100], args.out / "qa", tuned, True, True,
                     str(reader) if reader else None, timed=until)  # fmt: skip
        model_spec, reader = str(best), None
    dtype = preset.compute_dtype(default_device())
    model = QAModel.load(model_spec, preset.retriever, reader=str(reader) if reader else None).eval()
    from realm.index.mips import MipsIndex

    index = MipsIndex(args.index)
    searcher = open_searcher(index, "hybrid", model.retriever, model.fusion_weight)
    answerer = Answerer(model, searcher, 5, index.corpus().config.max_block_tokens, dtype=dtype, selection="marginal")
    answered = answer_questions(answerer, tuning, 5)
    summary = summarise(answered, (5,), 5, "orqa", 0.0)
    correct = [int(a.outcome == "exact_match") for a in answered]
    (args.out / "tuning.json").write_text(json.dumps({"summary": summary, "correct": correct}) + "\n")
    print(f"{args.out}: EM {summary['exact_match']} {summary['exact_match_95ci']} on {len(tuning)}; {summary}")
    for other in args.compare:
        theirs = json.loads((other / "tuning.json").read_text())["correct"]
        diff, (low, high) = paired_difference(100.0 * np.array(correct), 100.0 * np.array(theirs))
        print(f"  minus {other}: {diff:+.2f} [{low:+.2f}, {high:+.2f}]")


if __name__ == "__main__":
    main()
