"""The weight a of the retrieval score at answer time, a · f(x, z) + S(s) (ORQA's joint softmax: a = 1, as trained):
exact match on the tuning split of the training file for each weight, paired with a = 1, the reader's reads shared.

    python experiments/retrieval_weight.py --model runs/default/qa/best --index runs/default/baseline_index/index \
        --train squad-open-train --weights 0 0.5 1 2
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from realm.common.device import default_device
from realm.config import get_preset
from realm.data.qa_examples import load_qa
from realm.eval.answerer import Answerer
from realm.eval.intervals import bootstrap_interval, paired_difference
from realm.eval.qa import answer_questions
from realm.index.mips import MipsIndex
from realm.index.search import open_searcher
from realm.models.orqa import QAModel
from realm.pipeline.work import split_training_questions


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="a fine-tuned QA model (retriever/ and reader/)")
    parser.add_argument("--index", required=True, type=Path)
    parser.add_argument("--train", required=True, help="training questions: their tuning split is answered")
    parser.add_argument("--retriever", default="hybrid", choices=("dense", "hybrid"))
    parser.add_argument("--weights", nargs="+", type=float, default=[0.0, 0.5, 1.0, 2.0])
    args = parser.parse_args()

    preset = get_preset("cpu")
    _, tuning = split_training_questions(load_qa(args.train))
    index = MipsIndex(args.index)
    model = QAModel.load(args.model, index.retriever_config(preset.retriever)).eval()
    searcher = open_searcher(index, args.retriever, model.retriever, model.fusion_weight)
    dtype, rows = preset.compute_dtype(default_device()), {}
    correct = {}
    for weight in args.weights:
        max_tokens = index.corpus().config.max_block_tokens
        answerer = Answerer(model, searcher, 5, max_tokens, dtype=dtype, read_rows=rows, retrieval_weight=weight)
        answered = answer_questions(answerer, tuning, 5)
        correct[weight] = 100.0 * np.array([a.outcome == "exact_match" for a in answered], dtype=float)
    for weight, scores in correct.items():
        low, high = bootstrap_interval(scores)
        line = f"a = {weight:g}: EM {scores.mean():.2f} [{low:.2f}, {high:.2f}] on {len(scores)}"
        if weight != 1.0 and 1.0 in correct:
            diff, (dlow, dhigh) = paired_difference(scores, correct[1.0])
            line += f"; minus a = 1: {diff:+.2f} [{dlow:+.2f}, {dhigh:+.2f}]"
        print(line)


if __name__ == "__main__":
    main()
