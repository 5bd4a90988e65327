"""QA's beam labels from the answer index (`AnswerBlocks`) against `has_answer` on every block: that they agree on
every (question, block) pair, and what each costs, measured in the same run.

    python benchmarks/answer_blocks.py --corpus runs/main50/corpus --qa squad-open-dev \
        --questions 60
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from realm.data.blocks import BlockStore
from realm.data.qa_examples import AnswerBlocks, has_answer, load_qa


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", required=True)
    parser.add_argument("--qa", required=True, help="questions (JSONL); regex answers are left out (tested per block)")
    parser.add_argument("--questions", type=int, default=60, help="the first N questions")
    args = parser.parse_args()
    bodies = BlockStore(args.corpus).column("body")
    questions = [q for q in load_qa(args.qa) if not q.regex][: args.questions]
    started = time.perf_counter()
    index = AnswerBlocks(bodies)
    built = time.perf_counter() - started
    started = time.perf_counter()
    found = [index.holding(q) for q in questions]
    lookup = (time.perf_counter() - started) / len(questions)
    started = time.perf_counter()
    truth = [np.array([b for b, body in enumerate(bodies) if has_answer(body, q)]) for q in questions]
    per_block = (time.perf_counter() - started) / (len(questions) * len(bodies))
    mismatches = sum(not np.array_equal(a, b) for a, b in zip(found, truth))
    print(f"{len(bodies):,} blocks, {len(index.blocks):,} postings; index built in {built:.2f} s")
    print(f"{len(questions)} questions: {mismatches} whose answer blocks differ from has_answer on every block")
    print(f"lookup {1000 * lookup:.2f} ms a question; has_answer {1e6 * per_block:.1f} us a block")
    print(f"a beam of 5,000 blocks tested one by one: {5000 * per_block * 1000:.1f} ms a question")


if __name__ == "__main__":
    main()
