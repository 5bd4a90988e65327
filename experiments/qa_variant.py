"""QA fine-tuning with the cpu preset's settings, some changed: what a setting does to the fine-tuned query tower.

Fine-tunes `--model` (default MiniLM) on `--train-limit` training questions (a seeded sample across all articles)
over a frozen index, then scores the dense retriever on the tuning split of the training file (whole articles that
fine-tuning never sees, `tuning_split`; a choice between settings never reads the dev questions a run reports):
recall@1/5/20 of the warm start's query tower, of each `--compare` output (earlier variants) and of this one, each recall@5 paired against the warm start's,
and against the first `--compare` output, with 95% intervals over questions (the document tower and the index never
change in QA fine-tuning, so the rows differ only in the query tower).

    python experiments/qa_variant.py --index runs/qa/baseline_index/index \
        --train squad-open-train --qa-articles src/realm/data/shipped/squad-dev-v1.1.json.zip \
        --train-limit 2400 --out runs/qa_rlr1e-4 --set retriever_lr=1e-4 --compare runs/qa_rlr1e-5

Resumable: run it again (a finished output is read back, not trained again).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

import numpy as np
from pretrain_eval import hits_at

from realm.common.weights import MINILM
from realm.config import QAConfig, get_preset, parse_settings
from realm.data.qa_examples import load_qa, tuning_split
from realm.data.sources import squad_question_titles
from realm.eval.intervals import bootstrap_interval, paired_difference
from realm.recipes.finetune_qa import BEST, train_qa


def paired(hits: np.ndarray, base: np.ndarray) -> str:
    """recall@5 of `hits` minus `base`'s, paired over questions, with its 95% interval."""
    diff, (low, high) = paired_difference(100 * hits[:, 1], 100 * base[:, 1])
    return f"{diff:+.2f} [{low:+.2f}, {high:+.2f}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--index", required=True, type=Path, help="index built by the model's document tower")
    parser.add_argument("--train", required=True)
    parser.add_argument("--qa-articles", help="a SQuAD file naming each training question's article")
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--model", default=MINILM, help="warm start: minilm or a `train pretrain` output")
    parser.add_argument("--train-limit", type=int, help="fine-tune on a seeded sample of N")
    parser.add_argument("--set", nargs="+", default=[], help="QA settings to change, e.g. retriever_lr=1e-4")
    parser.add_argument("--compare", nargs="*", default=[], type=Path, help="earlier outputs of this script")
    parser.add_argument("--preset", default="cpu")
    args = parser.parse_args()

    preset = get_preset(args.preset)
    preset = dataclasses.replace(preset, qa=dataclasses.replace(preset.qa, **parse_settings(args.set, QAConfig)))
    titles = squad_question_titles(args.qa_articles)
    train, dev = tuning_split(load_qa(args.train, titles))
    if args.train_limit:  # the questions come article by article: sample across all of them
        train = [train[i] for i in sorted(np.random.default_rng(0).permutation(len(train))[: args.train_limit])]
    if not (args.out / BEST / "dev.json").is_file():
        train_qa(args.model, args.index, train, dev, args.out, preset, resume=True, progress=False)
    print(f"{args.out}: {', '.join(args.set) or 'no change'}, {len(train)} training questions from {args.model}")

    base = hits_at(args.model, str(args.index), dev, preset)  # Retriever.load finds a run's retriever/ itself
    rows = [
        (str(folder), json.loads((folder / BEST / "dev.json").read_text())["exact_match"],
         hits_at(str(folder / BEST), str(args.index), dev, preset))
        for folder in [*args.compare, args.out]
    ]  # fmt: skip
    print(f"\n{len(dev)} questions of the tuning split of {args.train}, the dense retriever alone")
    print("| query tower | exact match (hybrid, tuning subset) | recall@1 | recall@5 [95%] | recall@20 "
          "| recall@5 minus the warm start [95%] | minus the first compared [95%] |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, em, hits in [("warm start", "", base), *rows]:
        low, high = bootstrap_interval(100 * hits[:, 1])
        against_first = paired(hits, rows[0][2]) if len(rows) > 1 and name != "warm start" else ""
        print(
            f"| {name} | {em} | {100 * hits[:, 0].mean():.2f} | {100 * hits[:, 1].mean():.2f} [{low:.1f}, {high:.1f}] "
            f"| {100 * hits[:, 2].mean():.2f} | {paired(hits, base)} | {against_first} |"
        )


if __name__ == "__main__":
    main()
