"""Where the reader loses answers: exact match on the tuning split with the gold paragraph alone (SQuAD's closed
reading, no retrieval) beside the open answer (hybrid top 5) of the same model, so the loss splits into reading
itself and reading among retrieved blocks.

For each tuning question with its paragraph and answer offset, the reader reads a block-sized window of the gold
paragraph around the answer (the reading stage's window, seeded) and its best span is the prediction. Also prints
the share of answers no span of at most `max_span_width` wordpieces can read (a ceiling of any reader of this width).

    python experiments/reader_ceiling.py --index I --train squad-open-train --model runs/qa/best --questions 500 \
        [--reader runs/read/read/reader] [--open runs/read/tuning.json]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

from realm.common.device import autocast, default_device
from realm.common.weights import MINILM
from realm.config import get_preset
from realm.data.qa_examples import is_exact_match, load_qa
from realm.eval.intervals import bootstrap_interval, paired_difference
from realm.index.mips import MipsIndex
from realm.models.orqa import QAModel
from realm.pipeline.work import split_training_questions
from realm.recipes.reading import Found, _gold_window


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--index", required=True, type=Path)
    parser.add_argument("--train", required=True)
    parser.add_argument("--model", default=MINILM)
    parser.add_argument("--reader", default=None)
    parser.add_argument("--questions", type=int, default=500)
    parser.add_argument("--open", type=Path, default=None, help="the same model's tuning.json (reading_stage.py)")
    parser.add_argument("--out", type=Path, default=None, help="where to keep this model's per-question results")
    parser.add_argument("--compare", nargs="*", default=[], type=Path, help="earlier --out files: paired differences")
    args = parser.parse_args()

    preset = get_preset("cpu")
    _, tuning = split_training_questions(load_qa(args.train))
    tuning = [tuning[i] for i in sorted(np.random.default_rng(0).permutation(len(tuning))[: args.questions])]
    device = default_device()
    dtype = preset.compute_dtype(device)
    model = QAModel.load(args.model, preset.retriever, reader=args.reader).eval().to(device)
    max_tokens = MipsIndex(args.index).corpus().config.max_block_tokens
    width = model.reader.max_span_width
    found, correct, readable = Found(), [], 0
    for i, example in enumerate(tuning):
        window = _gold_window(example, i, model.reader.tokenizer, max_tokens, width, 0, found)
        if window is None:  # no span of the reader's width reads the answer in its paragraph
            correct.append(0)
            continue
        readable += 1
        batch, ((spans,),) = model.reader_inputs([example.question], [[window[0]]], max_tokens)
        with torch.inference_mode(), autocast(dtype, device):
            scores = model.span_scores(batch.to(device))[0, : len(spans.spans)].float().cpu()
        best = spans.spans[int(scores.argmax())]
        correct.append(int(is_exact_match(spans.text(window[0], best), example)))
    em = 100.0 * np.mean(correct)
    low, high = bootstrap_interval(100.0 * np.array(correct))
    print(f"gold paragraph alone: EM {em:.1f} [{low:.1f}, {high:.1f}] on {len(tuning)} tuning questions; "
          f"{100.0 * readable / len(tuning):.1f}% have a span of <= {width} wordpieces that reads the answer")  # fmt: skip
    if args.out:
        args.out.write_text(json.dumps({"gold_em": em, "interval": [low, high], "correct": correct}) + "\n")
    for other in args.compare:
        theirs = json.loads(other.read_text())["correct"]
        diff, (lo, hi) = paired_difference(100.0 * np.array(correct), 100.0 * np.array(theirs))
        print(f"  gold paragraph alone, minus {other}: {diff:+.2f} [{lo:+.2f}, {hi:+.2f}]")
    if args.open:
        opened = json.loads(args.open.read_text())
        print(f"open (hybrid top 5): EM {opened['summary']['exact_match']}, {opened['summary']['outcomes']}")
        both = np.array(opened["correct"])
        print(f"  right with the gold paragraph, wrong in the open: {100.0 * np.mean((np.array(correct) == 1) & (both == 0)):.1f}%;"
              f" wrong with it, right in the open: {100.0 * np.mean((np.array(correct) == 0) & (both == 1)):.1f}%")  # fmt: skip


if __name__ == "__main__":
    main()
