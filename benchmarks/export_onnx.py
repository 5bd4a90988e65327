"""ONNX exports of the retriever (models/export.py) against the torch path, at equal threads, in one run:

- speed: questions a second through the query tower and blocks a second through the document tower, for the torch
  path (`Retriever.embed_queries`, `BlockEmbedder`, fp32), the fp32 ONNX graph and the int8 one (onnxruntime,
  intra-op threads = torch's), best of 3 passes over the same inputs;
- quality: recall@5 of answer-bearing blocks on the QA questions over the whole corpus, each system embedding both
  the questions and the blocks itself (exact inner-product search), and the paired difference of int8 and fp32
  ONNX against the torch path, with its 95% interval.

    python benchmarks/export_onnx.py --corpus runs/corpus --qa squad-open-dev [--model minilm]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from realm.config import get_preset
from realm.data.blocks import BlockStore
from realm.data.qa_examples import has_answer, load_qa
from realm.eval.intervals import bootstrap_interval, paired_difference
from realm.index.embed import BlockEmbedder
from realm.models.export import ONNX_INPUTS, export_onnx
from realm.models.retriever import Retriever

BATCH = 32
SPEED_ROWS = 256


def onnx_embedder(folder: Path, graph: str, threads: int):
    """texts (or title/body pairs) -> (N, D) float32 through one exported tower."""
    import onnxruntime
    from transformers import AutoTokenizer

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    session = onnxruntime.InferenceSession(str(folder / graph), options, providers=["CPUExecutionProvider"])
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    length = json.loads((folder / "realm_onnx.json").read_text())["max_length"]

    def embed(texts: list[str], pairs: list[str] | None = None) -> np.ndarray:
        parts = []
        for start in range(0, len(texts), BATCH):
            second = pairs[start : start + BATCH] if pairs is not None else None
            inputs = tokenizer(
                texts[start : start + BATCH],
                second,
                padding=True,
                truncation=True,
                max_length=length,
                return_tensors="np",
            )
            parts.append(session.run(None, {key: inputs[key].astype(np.int64) for key in ONNX_INPUTS})[0])
        return np.concatenate(parts)

    return embed


def best_seconds(fn, repeats: int = 3) -> float:
    fn()
    return min(_timed(fn) for _ in range(repeats))


def _timed(fn) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", required=True, help="a built corpus folder")
    parser.add_argument("--qa", required=True, help="JSONL of {question, answer: [...]}")
    parser.add_argument("--model", default="minilm")
    parser.add_argument("--preset", default="cpu")
    args = parser.parse_args()

    preset = get_preset(args.preset)
    threads = torch.get_num_threads()
    retriever = Retriever.load(args.model, preset.retriever).eval()
    embedder = BlockEmbedder(retriever.doc_tower, retriever.tokenizer, preset.corpus, preset.embed)
    store = BlockStore(args.corpus)
    titles, bodies = store.slice(0, len(store))
    examples = load_qa(args.qa)
    with tempfile.TemporaryDirectory(prefix="realm-onnx-") as tmp:  # about 0.5 GB of graphs, removed at the end
        compare(retriever, embedder, titles, bodies, examples, args.qa, preset, Path(tmp), threads)


def compare(retriever, embedder, titles, bodies, examples, qa_path: str, preset, out: Path, threads: int) -> None:
    """Export both towers to `out`, then time and score torch, ONNX fp32 and ONNX int8 side by side."""
    questions = [e.question for e in examples]
    started = time.perf_counter()
    export_onnx(retriever, out, preset.corpus.max_block_tokens, int8=True)
    print(f"export (fp32 and int8, both towers): {time.perf_counter() - started:.0f} s; threads {threads}")

    systems = {"torch (fp32)": (lambda q: retriever.embed_queries(q).numpy(), lambda t, b: embedder.embed(t, b))}
    for name, graph in (("onnx fp32", "model.onnx"), ("onnx int8", "model_int8.onnx")):
        systems[name] = (onnx_embedder(out / "query", graph, threads), onnx_embedder(out / "doc", graph, threads))

    print(f"\nspeed, {SPEED_ROWS} rows sorted by length, batch {BATCH} (best of 3)")
    rows = sorted(range(SPEED_ROWS), key=lambda i: len(bodies[i]))  # as BlockEmbedder batches them
    speed_titles, speed_bodies = [titles[i] for i in rows], [bodies[i] for i in rows]
    speed_questions = sorted(questions[:SPEED_ROWS], key=len)
    rates = {}
    for name, (embed_queries, embed_docs) in systems.items():
        query_s = best_seconds(lambda f=embed_queries: f(speed_questions))
        doc_s = best_seconds(lambda f=embed_docs: f(speed_titles, speed_bodies))
        rates[name] = (SPEED_ROWS / query_s, SPEED_ROWS / doc_s)
    base = rates["torch (fp32)"]
    for name, (query_rate, doc_rate) in rates.items():
        print(
            f"  {name:<13} questions/s {query_rate:7.1f} (x{query_rate / base[0]:.2f})   "
            f"blocks/s {doc_rate:6.1f} (x{doc_rate / base[1]:.2f})"
        )

    print(f"\nrecall@5 on {len(examples)} questions of {qa_path}, {len(titles)} blocks")
    found = {}
    for name, (embed_queries, embed_docs) in systems.items():
        blocks, queries = embed_docs(titles, bodies), embed_queries(questions)  # (N, D), (Q, D)
        top = np.argsort(-(queries @ blocks.T), axis=1, kind="stable")[:, :5]  # (Q, 5)
        found[name] = np.array(
            [any(has_answer(bodies[z], example) for z in row) for row, example in zip(top, examples)], dtype=float
        )
        low, high = bootstrap_interval(100 * found[name])
        print(f"  {name:<13} {100 * found[name].mean():.2f} [{low:.2f}, {high:.2f}]")
    for name in ("onnx fp32", "onnx int8"):
        difference, (low, high) = paired_difference(100 * found[name], 100 * found["torch (fp32)"])
        print(f"  {name} - torch: {difference:+.2f} [{low:+.2f}, {high:+.2f}] (paired)")


if __name__ == "__main__":
    main()
