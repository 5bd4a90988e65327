"""Exact and approximate MIPS: faiss backends vs numpy brute force, same vectors, same run.

Without faiss (a GPU image), `flat` is the torch brute force (`ExactSearch`) on the default device.
Random Gaussian 128-d vectors (the hardest case for approximate search: no cluster structure) at
100k and 1M, 1,000 queries. Reports queries/s of exact faiss `flat` against a numpy matmul + argpartition
brute force (the baseline), and build time, queries/s and recall@10 (against exact) of `hnsw` and
`ivfpq` (+ exact rerank of 4x candidates from the stored embeddings), with the library's default settings.
With --index DIR it also measures the backends on that index's real embeddings (queries: held-out blocks).

    python benchmarks/search_speed.py [--sizes 100000,1000000] [--approx-sizes 100000] [--index DIR]
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
import time
from pathlib import Path

import numpy as np

from realm.config import IndexConfig
from realm.index.backends import build_faiss
from realm.index.mips import MipsIndex, publish

K = 10


def numpy_exact(base: np.ndarray, queries: np.ndarray, k: int, chunk: int = 100) -> np.ndarray:
    out = []
    for i in range(0, len(queries), chunk):
        scores = queries[i : i + chunk] @ base.T  # (q, N)
        top = np.argpartition(-scores, k, axis=1)[:, :k]
        order = np.argsort(-np.take_along_axis(scores, top, 1), axis=1)
        out.append(np.take_along_axis(top, order, 1))
    return np.concatenate(out)


def recall(found: np.ndarray, exact: np.ndarray) -> float:
    return float(np.mean([len(set(f) & set(e)) / exact.shape[1] for f, e in zip(found, exact)]))


def run(label: str, base: np.ndarray, queries: np.ndarray, backends: tuple[str, ...]) -> list[tuple]:
    rows = []
    start = time.perf_counter()
    exact = numpy_exact(base, queries, K)
    numpy_qps = len(queries) / (time.perf_counter() - start)
    rows.append((label, "numpy brute force (baseline)", "-", numpy_qps, 1.0, 1.0))
    meta = dict(
        doc_tower_fingerprint="-",
        corpus_fingerprint="-",
        corpus_path="-",
        num_vectors=len(base),
        dim=base.shape[1],
        retriever={},
        storage_dtype="fp16",
        embed_seconds=0,
        build_seconds=0,
    )
    for backend in backends:
        start = time.perf_counter()
        index, params = build_faiss(base, dataclasses.replace(IndexConfig(), backend=backend))
        build = time.perf_counter() - start
        with tempfile.TemporaryDirectory() as folder:
            publish(
                Path(folder),
                base.astype(np.float16),
                np.arange(len(base)),
                index,
                {**meta, "backend": backend, "params": params},
                keep_versions=1,
            )
            mips = MipsIndex(folder)
            method = (
                f"faiss {backend} {params or ''}".strip() if index is not None else f"torch exact ({mips.index.device})"
            )
            mips.search(queries[:10], K)  # warm up
            start = time.perf_counter()
            _, found = mips.search(queries, K)
            qps = len(queries) / (time.perf_counter() - start)
        rows.append(
            (
                label,
                method,
                f"{build:.1f}",
                qps,
                qps / numpy_qps,
                recall(found, exact),
            )
        )
        print(rows[-1], flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="100000,1000000")
    parser.add_argument("--queries", type=int, default=1000)
    parser.add_argument(
        "--approx-sizes",
        default="100000,1000000",
        help="sizes at which hnsw and ivfpq are built too (hnsw at 1M takes ~25 min on 2 cores)",
    )
    parser.add_argument("--approx", default="hnsw,ivfpq", help="approximate backends to measure")
    parser.add_argument("--index", help="also benchmark on this realm index's real embeddings")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    rows = []
    approx_sizes = {int(s) for s in args.approx_sizes.split(",") if s}
    approx = tuple(b for b in args.approx.split(",") if b)
    for n in (int(s) for s in args.sizes.split(",")):
        base = rng.standard_normal((n, 128), dtype=np.float32)
        queries = rng.standard_normal((args.queries, 128), dtype=np.float32)
        rows += run(f"random {n:,}", base, queries, ("flat",) + (approx if n in approx_sizes else ()))
    if args.index:
        vectors = np.asarray(MipsIndex(args.index).embeddings(), dtype=np.float32)
        held_out = np.zeros(len(vectors), dtype=bool)
        held_out[rng.choice(len(vectors), min(args.queries, len(vectors) // 2), replace=False)] = True
        base = np.ascontiguousarray(vectors[~held_out])
        rows += run(f"real {len(base):,} ({Path(args.index).name})", base, vectors[held_out], ("flat",) + approx)
    print("\n| vectors | method | build s | queries/s | vs numpy | recall@10 |\n|---|---|---:|---:|---:|---:|")
    for label, method, build, qps, ratio, rec in rows:
        print(f"| {label} | {method} | {build} | {qps:,.0f} | {ratio:.2f}x | {rec:.3f} |")


if __name__ == "__main__":
    main()
