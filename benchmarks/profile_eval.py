"""Where `realm eval qa`'s time goes: retrieval, then `Answerer.read` over the questions in batches of 8 under
`torch.profiler` (the op table, by self time) and cProfile (the Python side: tokenising blocks, composing
answers).

    python benchmarks/profile_eval.py --index data/load/index --qa squad-open-dev --limit 80
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time

from torch.profiler import ProfilerActivity, profile

from realm.config import get_preset
from realm.data.qa_examples import load_qa
from realm.eval.answerer import load_answerer
from realm.index.search import search_all


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--index", required=True)
    parser.add_argument("--qa", required=True)
    parser.add_argument("--model", default="minilm")
    parser.add_argument("--limit", type=int, default=80)
    args = parser.parse_args()
    answerer = load_answerer(args.model, args.index, get_preset("cpu"))
    questions = [e.question for e in load_qa(args.qa)[: args.limit]]
    started = time.perf_counter()
    hits = search_all(answerer.searcher, questions, answerer.k, batch_size=answerer.batch_size)
    print(f"retrieval: {time.perf_counter() - started:.2f} s for {len(questions)} questions")
    answerer.read(questions[:8], hits[:8])  # warm-up

    def read_all() -> None:
        for start in range(0, len(questions), answerer.batch_size):
            answerer.read(questions[start : start + 8], hits[start : start + 8])

    started = time.perf_counter()
    read_all()
    print(f"reading: {time.perf_counter() - started:.2f} s for {len(questions)} questions")
    with profile(activities=[ProfilerActivity.CPU]) as trace:
        read_all()
    print(trace.key_averages().table(sort_by="self_cpu_time_total", row_limit=15))
    python_side = cProfile.Profile()
    python_side.runcall(read_all)
    pstats.Stats(python_side).sort_stats("cumulative").print_stats(25)


if __name__ == "__main__":
    main()
