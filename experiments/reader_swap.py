"""Fine-tune one more system inside a finished `realm pipeline` run, exactly as its ablation stages are fine-tuned
(the run's own plan: batch, learning rates, retrieval; its steps unless --steps), with a retriever and a reader of
your choice; then score it with dense retrieval on the tuning split of the training questions (whole held-out
articles, `tuning_split`: a choice between readers is a setting, never made on the dev questions a run reports).
It separates what the pipeline's retriever ablation mixes: the ICT-only baseline changes the reader as well.

    python experiments/reader_swap.py --run-dir runs/qa50 --retriever realm --index realm_index/index \
        --reader realm/reader --qa-train squad-open-train \
        --qa-articles src/realm/data/shipped/squad-dev-v1.1.json.zip --steps 300 --out runs/swap/realm_reader
    realm eval compare runs/swap/realm_reader/predictions_dense.jsonl runs/swap/minilm_reader/predictions_dense.jsonl

Resumes after a kill (the trainer continues from its newest checkpoint in --out).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

from realm.common.io import write_json_atomic
from realm.config import QAConfig, RetrieverConfig, get_preset
from realm.data.qa_examples import load_qa, tuning_split
from realm.data.sources import squad_question_titles
from realm.pipeline import work as stage_work


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run-dir", required=True, help="a finished `realm pipeline` run (its plan.json)")
    parser.add_argument("--retriever", required=True, help="stage folder in the run holding retriever/ (e.g. realm)")
    parser.add_argument("--index", required=True, help="index in the run built by that retriever's document tower")
    parser.add_argument("--reader", required=True, help="reader folder in the run (e.g. warm_start/reader)")
    parser.add_argument("--qa-train", required=True)
    parser.add_argument("--qa-articles", help="a SQuAD file naming each training question's article")
    parser.add_argument("--steps", type=int, help="fine-tuning steps (default: the run's plan)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    run = Path(args.run_dir)
    stored = json.loads((run / "plan.json").read_text())["preset"]  # the run's own QA and retriever settings
    preset = dataclasses.replace(
        get_preset(stored["name"]),
        qa=QAConfig(**stored["qa"]),
        retriever=RetrieverConfig.from_dict(stored["retriever"]),
    )
    if args.steps:
        preset = dataclasses.replace(preset, qa=dataclasses.replace(preset.qa, steps=args.steps))
    out = Path(args.out)
    questions = load_qa(args.qa_train, squad_question_titles(args.qa_articles))
    train, held_out = stage_work.split_training_questions(questions)
    tuning = tuning_split(questions)[1]
    print(f"fine-tuning on {len(train):,} questions; scoring on the tuning split's {len(tuning):,}")
    result = stage_work.finetune(
        run / args.retriever,
        run / args.index,
        run / args.reader,
        train,
        held_out,
        preset,
        out,
        resume=out.exists(),
        progress=False,
        evaluated=tuning,
    )
    write_json_atomic(out / "result.json", result)
    dense = result["dense"]
    low, high = dense["exact_match_95ci"]
    print(
        f"{args.retriever} retriever + {args.reader}: exact match {dense['exact_match']:.2f} [{low:.1f}, {high:.1f}], "
        f"recall@1 {dense['recall@1']:.2f}, recall@5 {dense['recall@5']:.2f}, outcomes {dense['outcomes']}"
    )


if __name__ == "__main__":
    main()
