"""Scale: corpus build, index build and search at 100k, 1M (and more) blocks; time and peak RSS per stage.

Input: the shared corpora's real documents (vital articles and SQuAD paragraphs), copied with new ids until the
corpus reaches the size, each copy with a seeded tenth of its words dropped (so no two blocks embed alike), written
as Parquet in row groups. Tower: random weights, 2 layers x 128 hidden, 128-d projection (the timing of a small
tower; what MiniLM costs a block is measured on real blocks in the same run and used for the projection). Each
stage runs in its own child process; its peak RSS is that process's ru_maxrss, beside the RSS of a child that only
imports the same modules (`import`).

  corpus       realm corpus build (Parquet -> blocks.arrow)
  index        realm index build, flat: embed into shards, merge through a memory map, faiss, publish
  index x2     the same build as a 2-rank torchrun job (smallest size only: this machine has 2 cores)
  publish      index folders over the same (hard-linked) embeddings: flat without a faiss index (what a flat
               index beyond flat_in_memory_rows is), IVF-PQ (every size), HNSW (smallest size), faiss built
               from the memory-mapped fp16 file
  search       1,000 SQuAD questions in batches of 64, each folder opened as a user would (MipsIndex): flat in
               RAM (faiss), flat scanned from the memory map, ivfpq with exact rerank, hnsw; recall@10 against
               exact search in RAM

    python benchmarks/scale.py --sizes 100000,1000000 --work data/scale
    python benchmarks/scale.py --sizes 100000,1000000 --work data/scale --search-only   # the search part again
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
SMALL_TOWER = {"hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 512}
TARGET_13M = 13_300_000
BATCH_QUERIES = 64


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# -- stages (each in a child process) ------------------------------------------------------------------
def stage_docs(work: Path, size: int) -> dict:
    """docs.parquet with about `size` blocks' worth of documents."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    originals = []
    for name in ("wiki_vital.jsonl.gz", "squad_dev_paragraphs.jsonl.gz"):
        with gzip.open(SHARED / "corpus" / name, "rt") as handle:
            originals += [json.loads(line) for line in handle]
    blocks_per_doc = 16_772 / len(originals)  # both files at the cpu preset's 128 wordpieces: 12,911 + 3,861 blocks
    wanted = int(size / blocks_per_doc)
    rng = np.random.default_rng(0)
    writer = None
    for first in range(0, wanted, 50_000):
        rows = []
        for n in range(first, min(first + 50_000, wanted)):
            doc, copy = originals[n % len(originals)], n // len(originals)
            words = doc["text"].split(" ")
            if copy:
                words = [w for w, keep in zip(words, rng.random(len(words)) >= 0.1) if keep] or words
            rows.append({"id": f"{copy}:{doc['id']}", "title": doc["title"], "text": " ".join(words)})
        table = pa.Table.from_pylist(rows)
        writer = writer or pq.ParquetWriter(work / "docs.parquet", table.schema)
        writer.write_table(table, row_group_size=10_000)
    assert writer is not None
    writer.close()
    return {"documents": wanted}


def stage_corpus(work: Path) -> dict:
    from realm.common.tokenization import load_tokenizer, resolve_tokenizer_dir
    from realm.config import get_preset
    from realm.data.blocks import build_corpus

    meta = build_corpus(
        [str(work / "docs.parquet")],
        work / "corpus",
        load_tokenizer(resolve_tokenizer_dir("minilm")),
        get_preset("cpu").corpus,
        progress=False,
    )
    return {"blocks": meta.num_blocks}


def small_retriever():
    from realm.config import EncoderShape, get_preset
    from realm.models.retriever import Retriever

    config = dataclasses.replace(get_preset("cpu").retriever, shape=EncoderShape(**SMALL_TOWER), pooling="mean")
    return Retriever.load("random", config)


def stage_index(work: Path, out: str) -> dict:
    from realm.config import get_preset
    from realm.data.blocks import BlockStore
    from realm.index.build import build_from_retriever
    from realm.training.distributed import setup_distributed

    d = setup_distributed()
    preset = get_preset("cpu")
    embed = dataclasses.replace(preset.embed, shard_size=20_000)
    meta = build_from_retriever(small_retriever(), BlockStore(work / "corpus"), work / out, embed, preset.index, d=d)
    return {"blocks": meta.num_vectors, "embed_s": meta.embed_seconds}


def stage_variant(work: Path, backend: str) -> dict:
    """Publish another index folder over the same (hard-linked) embeddings, as a user's `realm index build
    --backend` would: `ivfpq` or `hnsw` built from the memory-mapped fp16 file chunk by chunk, or `mmap`, a flat
    version without a faiss index (what a flat index beyond flat_in_memory_rows is)."""
    from realm.config import IndexConfig
    from realm.index.backends import build_faiss
    from realm.index.mips import MipsIndex, publish

    flat = MipsIndex(work / "index", device="cpu")
    config = IndexConfig(backend="flat", flat_in_memory_rows=0) if backend == "mmap" else IndexConfig(backend=backend)  # type: ignore[arg-type]
    index, params = build_faiss(flat.embeddings(), config)
    out = work / f"index-{backend}"
    out.mkdir()
    os.link(flat.folder / "embeddings.npy", out / "embeddings.npy")  # publish moves it into the version
    fields = {
        k: v for k, v in dataclasses.asdict(flat.meta).items() if k not in ("format_version", "version", "created")
    }
    publish(
        out, out / "embeddings.npy", flat.block_ids, index, {**fields, "backend": config.backend, "params": params}, 1
    )
    return {"params": params}


def query_vectors() -> np.ndarray:
    import torch

    questions = [json.loads(line)["question"] for line in open(SHARED / "qa" / "squad_open_dev.jsonl")][:1000]
    with torch.inference_mode():
        return small_retriever().embed_queries(questions).numpy()


SEARCHES = {
    "flat": "flat, faiss in RAM",
    "mmap": "flat, memory-mapped scan",
    "ivfpq": "ivfpq + exact rerank",
    "hnsw": "hnsw",
}


def stage_search(work: Path, variant: str) -> dict:
    """Queries/s of one search variant; the top 10 of every query saved for recall."""
    from realm.index.backends import ExactSearch
    from realm.index.mips import MipsIndex

    queries = np.load(work / "queries.npy")
    before = peak_rss_mb()  # the process without the index: python, torch, faiss, the queries
    index = MipsIndex(work / ("index" if variant == "flat" else f"index-{variant}"), device="cpu")
    assert isinstance(index.index, ExactSearch) == (variant == "mmap")
    index.search(queries[:BATCH_QUERIES], 10)  # warm-up
    started = time.perf_counter()
    ids = [index.search(queries[i : i + BATCH_QUERIES], 10)[1] for i in range(0, len(queries), BATCH_QUERIES)]
    seconds = time.perf_counter() - started
    np.save(work / f"top10-{variant}.npy", np.concatenate(ids))
    return {"qps": len(queries) / seconds, "index_mb": peak_rss_mb() - before}


def stage_imports(work: Path) -> dict:
    import faiss  # noqa: F401
    import torch  # noqa: F401

    from realm.index.mips import MipsIndex  # noqa: F401

    return {}


def stage_minilm(work: Path) -> dict:
    """Seconds a block for MiniLM's document tower on 2,000 real blocks of the corpus (cpu preset)."""
    from realm.config import get_preset
    from realm.data.blocks import BlockStore
    from realm.index.embed import BlockEmbedder
    from realm.models.retriever import Retriever

    preset = get_preset("cpu")
    store = BlockStore(work / "corpus")
    retriever = Retriever.load("minilm", preset.retriever)
    embedder = BlockEmbedder(retriever.doc_tower, retriever.tokenizer, store.config, preset.embed)
    titles, bodies = store.slice(0, 2_000)
    embedder.embed(titles[:128], bodies[:128])
    started = time.perf_counter()
    embedder.embed(titles, bodies)
    return {"s_per_block": (time.perf_counter() - started) / len(titles)}


STAGES = {
    "docs": stage_docs,
    "corpus": stage_corpus,
    "index": stage_index,
    "variant": stage_variant,
    "search": stage_search,
    "imports": stage_imports,
    "minilm": stage_minilm,
}


def child(stage: str, work: Path, *extra: str, ranks: int = 1) -> dict:
    """Run one stage in a fresh process (a torchrun job when ranks > 1); its result, seconds and peak RSS."""
    args = [str(Path(__file__).resolve()), "--stage", stage, "--work", str(work), *extra]
    if ranks > 1:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}", *args]
    else:
        cmd = [sys.executable, *args]
    started = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"stage {stage} failed:\n{done.stderr[-3000:]}")
    result = json.loads([line for line in done.stdout.splitlines() if line.startswith("{")][0])
    return {**result, "seconds": time.perf_counter() - started}


def run_stage_here(args: argparse.Namespace) -> None:
    extra = {"size": args.size} if args.stage == "docs" else {}
    extra |= {"out": args.out} if args.stage == "index" else {}
    extra |= {"variant": args.variant} if args.stage == "search" else {}
    extra |= {"backend": args.variant} if args.stage == "variant" else {}
    result = STAGES[args.stage](Path(args.work), **extra)
    if int(os.environ.get("RANK", "0")) == 0:
        print(json.dumps({**result, "rss_mb": peak_rss_mb()}), flush=True)


def recall_at_10(found: np.ndarray, exact: np.ndarray) -> float:
    return float(np.mean([len(set(f) & set(e)) / 10 for f, e in zip(found, exact)]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="100000,1000000")
    parser.add_argument("--work", required=True, help="a folder with room for the corpora and indexes")
    parser.add_argument("--stage", help=argparse.SUPPRESS)
    parser.add_argument("--size", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--out", default="index", help=argparse.SUPPRESS)
    parser.add_argument("--variant", choices=list(SEARCHES), help=argparse.SUPPRESS)
    parser.add_argument(
        "--search-only", action="store_true", help="reuse the corpora and flat indexes of an earlier run in --work"
    )
    args = parser.parse_args()
    if args.stage:
        return run_stage_here(args)

    sizes = [int(s) for s in args.sizes.split(",")]
    rows, cost = [], {}
    base_rss = child("imports", Path(args.work))["rss_mb"]
    print(f"a child that only imports torch, faiss and realm: peak RSS {base_rss:.0f} MB", flush=True)
    for size in sizes:
        work = Path(args.work) / str(size)
        stages = build_stages(work, size, first=size == sizes[0], cost=cost) if not args.search_only else {}
        blocks = json.loads((work / "corpus" / "meta.json").read_text())["num_blocks"]
        variants = ["mmap", "ivfpq"] + (["hnsw"] if size == sizes[0] else [])  # HNSW: too slow to build beyond
        for variant in variants:
            shutil.rmtree(work / f"index-{variant}", ignore_errors=True)
            stages[f"{SEARCHES[variant]}: publish"] = child("variant", work, "--variant", variant)
        np.save(work / "queries.npy", query_vectors())
        searches = {variant: child("search", work, "--variant", variant) for variant in ["flat", *variants]}
        exact = np.load(work / "top10-flat.npy")
        for name, result in stages.items():
            micro = result["seconds"] / blocks * 1e6
            rows.append((blocks, name, f"{result['seconds']:.1f}", f"{micro:.0f}", result["rss_mb"], ""))
        for variant, result in searches.items():
            recall = recall_at_10(np.load(work / f"top10-{variant}.npy"), exact)
            note = f"{result['qps']:.0f} queries/s, recall@10 {recall:.3f}, index +{result['index_mb']:.0f} MB"
            rows.append((blocks, f"search: {SEARCHES[variant]}", "", "", result["rss_mb"], note))
        if not args.search_only:
            index = stages["index build (flat)"]
            cost[size] = {
                "corpus": stages["corpus build"]["seconds"] / blocks,
                "embed": index["embed_s"] / blocks,  # what the ranks share
                "serial": (index["seconds"] - index["embed_s"]) / blocks,  # start-up, merge, faiss, publish: rank 0
                "ivfpq": stages[f"{SEARCHES['ivfpq']}: publish"]["seconds"] / blocks,
            }
        print(f"{blocks:,} blocks; fp32 embeddings: {blocks * 128 * 4 / 2**20:.0f} MB", flush=True)

    print("\n| blocks | stage | seconds | µs a block | peak RSS MB | search |")
    print("|---:|---|---:|---:|---:|---|")
    for blocks, name, seconds, micro, rss, note in rows:
        print(f"| {blocks:,} | {name} | {seconds} | {micro} | {rss:.0f} | {note} |")
    if not args.search_only:
        report_growth(cost, sizes)


def build_stages(work: Path, size: int, first: bool, cost: dict) -> dict:
    """Documents, corpus and the flat index at one size (at the first size also the 2-rank build and MiniLM)."""
    work.mkdir(parents=True, exist_ok=True)
    docs = child("docs", work, "--size", str(size))
    stages = {"corpus build": child("corpus", work), "index build (flat)": child("index", work)}
    blocks = stages["corpus build"]["blocks"]
    print(f"{blocks:,} blocks from {docs['documents']:,} documents", flush=True)
    if first:
        stages["index build, torchrun 2 ranks"] = child("index", work, "--out", "index2", ranks=2)
        one = np.load(work / "index" / "versions" / "v000001" / "embeddings.npy", mmap_mode="r")
        two = np.load(work / "index2" / "versions" / "v000001" / "embeddings.npy", mmap_mode="r")
        gap = np.abs(one.astype(np.float32) - two.astype(np.float32))
        print(
            f"2 ranks (1 thread each) vs 1 process (2 threads) at {blocks:,} blocks: {np.mean(gap > 0):.2%} of "
            f"values differ, by at most {gap.max():.2g} (bf16 rounding across thread counts)",
            flush=True,
        )
        cost["minilm"] = child("minilm", work)["s_per_block"]
    return stages


def report_growth(cost: dict, sizes: list[int]) -> None:
    """How each stage's cost a block grows with size, and the projection to REALM's 13.3M blocks."""
    if len(sizes) > 1:
        small, large = cost[sizes[0]], cost[sizes[-1]]
        print("\ngrowth: cost a block at the largest size / at the smallest (1.00 = linear)")
        for name in ("corpus", "embed", "serial", "ivfpq"):
            print(f"  {name}: {large[name] / small[name]:.2f}")
    largest = cost[sizes[-1]]
    print(
        f"\n13.3M blocks, projected from the cost a block at {sizes[-1]:,} (MiniLM: {cost['minilm'] * 1e3:.2f} ms a block)"
    )
    print("| workers | corpus build (one process) | index build, small tower | index build, MiniLM | + ivfpq |")
    print("|---:|---:|---:|---:|---:|")
    for workers in (1, 8, 64):
        hours = {
            name: (per_block / workers + largest["serial"]) * TARGET_13M / 3600
            for name, per_block in (("small", largest["embed"]), ("minilm", cost["minilm"]))
        }
        print(
            f"| {workers} | {largest['corpus'] * TARGET_13M / 3600:.1f} h | {hours['small']:.2f} h | "
            f"{hours['minilm']:.1f} h | {largest['ivfpq'] * TARGET_13M / 3600:.2f} h |"
        )


if __name__ == "__main__":
    main()
