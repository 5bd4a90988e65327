"""The pipeline's evaluation of dense, BM25 and hybrid retrieval with one fine-tuned reader: each system reading its
own blocks against the three sharing what the reader read (`load_answerers`), side by side in one process,
alternating round by round. Prints seconds, the rows the reader read, and each system's exact match (which must
agree: sharing changes what is read, not what is answered).

    python benchmarks/eval_shared_reads.py --model runs/qa50/qa/best --index runs/qa50/realm_index/index \\
        --qa squad-open-dev --limit 300 --rounds 2
"""

from __future__ import annotations

import argparse
import time

from realm.config import get_preset
from realm.data.qa_examples import load_qa
from realm.eval.answerer import Answerer, load_answerers
from realm.eval.qa import evaluate_qa
from realm.pipeline.work import SYSTEMS


def timed_evaluation(answerers: dict[str, Answerer], questions: list) -> tuple[float, dict[str, float]]:
    """Seconds to evaluate every system on `questions`, and each system's exact match."""
    began = time.perf_counter()
    exact = {kind: evaluate_qa(answerers[kind], questions, (5,))["exact_match"] for kind in SYSTEMS}
    return time.perf_counter() - began, exact


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="a fine-tuned QA model folder")
    parser.add_argument("--index", required=True, help="the index of its retriever's document tower")
    parser.add_argument("--qa", required=True)
    parser.add_argument("--limit", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    preset = get_preset("cpu")
    questions = load_qa(args.qa)[: args.limit]
    seconds: dict[str, list[float]] = {"each alone": [], "sharing reads": []}
    exact: dict[str, dict[str, float]] = {}
    rows: dict[str, int] = {}
    for round_ in range(args.rounds):
        for name in seconds:
            if name == "each alone":
                answerers = {kind: load_answerers(args.model, args.index, preset, [kind])[kind] for kind in SYSTEMS}
                for answerer in answerers.values():
                    answerer.read_rows = {}  # its own: counts its rows, shares nothing
            else:
                answerers = load_answerers(args.model, args.index, preset, SYSTEMS)
            took, exact[name] = timed_evaluation(answerers, questions)
            seconds[name].append(took)
            kept = {id(a.read_rows): a.read_rows for a in answerers.values()}.values()  # one dict if shared
            rows[name] = sum(len(r or {}) for r in kept)
            print(f"round {round_ + 1}/{args.rounds}: {name} {took:.1f} s", flush=True)
    if exact["each alone"] != exact["sharing reads"]:
        raise SystemExit(f"exact match differs: {exact}")
    base = min(seconds["each alone"])
    print(f"{len(questions)} questions; exact match " + ", ".join(f"{k} {v}" for k, v in exact["each alone"].items()))
    print("| evaluation of 3 systems | rows read | seconds (best round) | s per question | speed-up |")
    print("|---|---:|---:|---:|---:|")
    for name, took in seconds.items():
        best = min(took)
        print(f"| {name} | {rows[name]} | {best:.1f} | {best / len(questions):.3f} | {base / best:.2f}x |")


if __name__ == "__main__":
    main()
