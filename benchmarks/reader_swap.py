"""Fine-tune one more system inside a finished `realm pipeline` run, exactly as its ablation stages are fine-tuned
(the run's own plan: steps, batch, learning rates, retrieval), with a retriever and a reader of your choice; then
score it with dense retrieval on all dev questions. It separates what the pipeline's retriever ablation mixes: the
ICT-only baseline changes the reader as well as the retriever.

    python benchmarks/reader_swap.py --run-dir runs/abl120 --retriever realm --index realm_index/index \
        --reader warm_start/reader --qa-train ../shared/data/qa/squad_open_train.jsonl \
        --qa-dev ../shared/data/qa/squad_open_dev.jsonl --out runs/abl120_x/qa_realm_retriever_minilm_reader
    realm eval compare runs/abl120_x/qa_realm_retriever_minilm_reader/predictions_dense.jsonl \
        runs/abl120/qa_ict/predictions_dense.jsonl

Resumes after a kill (the trainer continues from its newest checkpoint in --out).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from realm.common.io import write_json_atomic
from realm.config import get_preset
from realm.data.qa_examples import load_qa
from realm.pipeline import work as stage_work
from realm.pipeline.plan import Workload, costed_for, plan_pipeline


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run-dir", required=True, help="a finished `realm pipeline` run (its plan.json)")
    parser.add_argument("--retriever", required=True, help="stage folder in the run holding retriever/ (e.g. realm)")
    parser.add_argument("--index", required=True, help="index in the run built by that retriever's document tower")
    parser.add_argument("--reader", required=True, help="reader folder in the run (e.g. warm_start/reader)")
    parser.add_argument("--qa-train", required=True)
    parser.add_argument("--qa-dev", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    run = Path(args.run_dir)
    stored = json.loads((run / "plan.json").read_text())
    basis = stored["basis"]
    dtype = getattr(torch, stored["compute_dtype"])
    plan = plan_pipeline(
        costed_for(get_preset(basis["preset"]), dtype), Workload(**basis["workload"]), basis["budget_minutes"],
        stored["scale"], sized=Workload(**stored.get("work", basis["workload"])),
    )  # fmt: skip
    if plan.preset.to_dict() != stored["preset"]:
        raise SystemExit(f"realm: error: {run / 'plan.json'}: this version plans another preset than the run used")
    out = Path(args.out)
    train, held_out = stage_work.split_training_questions(load_qa(args.qa_train))
    dev = load_qa(args.qa_dev)
    result = stage_work.finetune(
        run / args.retriever,
        run / args.index,
        run / args.reader,
        train,
        held_out,
        dev,
        plan.preset,
        out,
        resume=out.exists(),
        progress=False,
        evaluated=dev,
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
