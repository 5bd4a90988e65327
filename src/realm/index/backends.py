"""Search backends of the MIPS index: faiss (flat, HNSW, IVF-PQ) on a CPU, and exact search in torch.

Exact (`flat`) search runs on faiss' IndexFlatIP on a CPU, and as a brute-force matmul + top-k in torch
(`ExactSearch`) on a GPU or where faiss is not installed, as the original REALM and Hugging Face code do:
the same scores, ranked the same way. `hnsw` and `ivfpq` need faiss, which is imported only when used.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from realm.config import Backend, IndexConfig


class MipsIndexError(RuntimeError):
    """A missing, corrupt or mismatched index."""


def faiss_module():
    """The faiss module, or None where it is not installed (e.g. a GPU image without faiss)."""
    try:
        import faiss
    except ImportError:
        return None
    return faiss


ADD_CHUNK_ROWS = 1 << 16  # vectors converted to fp32 and added to faiss at a time


def faiss_file_bytes(index) -> int:
    """About what `faiss.write_index` writes for one of build_faiss' indexes (0 for None): to check for room first."""
    if index is None:
        return 0
    if hasattr(index, "hnsw"):  # its flat storage and the graph's links
        graph = index.hnsw
        links = 4 * graph.neighbors.size() + 4 * graph.levels.size() + 8 * graph.offsets.size()
        return links + index.ntotal * faiss_module().downcast_index(index.storage).code_size
    if hasattr(index, "nlist"):  # a code and an id per vector, the coarse centroids and the PQ codebooks
        return index.ntotal * (index.code_size + 8) + index.nlist * index.d * 4 + index.d * index.pq.ksub * 4
    return index.ntotal * index.code_size


def build_faiss(vectors: np.ndarray, config: IndexConfig):
    """Build the chosen backend over (N, D) vectors (any float dtype, e.g. a memory-mapped fp16 file, read chunk by
    chunk); returns the faiss index and its parameters. A flat version has no faiss index (None) without faiss or
    beyond `flat_in_memory_rows`: exact search then scans the stored embeddings."""
    n, dim = vectors.shape
    faiss = faiss_module()
    if config.backend == "flat" and n > config.flat_in_memory_rows:
        return None, {}
    if faiss is None:
        if config.backend != "flat":
            raise MipsIndexError(
                f"the {config.backend} backend needs faiss (pip install faiss-cpu); "
                "flat (exact) search works without it"
            )
        return None, {}
    if config.backend == "flat":
        index = faiss.IndexFlatIP(dim)
        params: dict = {}
    elif config.backend == "hnsw":
        index = faiss.IndexHNSWFlat(dim, config.hnsw_m, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = config.hnsw_ef_construction
        params = {
            "m": config.hnsw_m,
            "ef_construction": config.hnsw_ef_construction,
            "ef_search": config.hnsw_ef_search,
        }
    elif config.backend == "ivfpq":
        pq_m = max(m for m in range(1, config.pq_m + 1) if dim % m == 0)  # sub-quantisers must divide dim
        nlist = config.ivf_nlist or max(1, min(int(4 * math.sqrt(n)), n // 39))
        nbits = max(1, min(8, int(math.log2(max(2, n // 4)))))  # PQ needs >= 2**nbits training points
        index = faiss.IndexIVFPQ(faiss.IndexFlatIP(dim), dim, nlist, pq_m, nbits, faiss.METRIC_INNER_PRODUCT)
        sample = np.arange(n)
        if n > 256 * nlist:
            sample = np.sort(np.random.default_rng(0).choice(n, 256 * nlist, replace=False))
        index.train(np.ascontiguousarray(vectors[sample], dtype=np.float32))
        params = {
            "nlist": nlist,
            "nprobe": min(config.ivf_nprobe, nlist),
            "pq_m": pq_m,
            "nbits": nbits,
            "rerank": config.ivf_rerank,
        }
    else:
        raise ValueError(f"unknown index backend {config.backend!r}; choose flat, hnsw or ivfpq")
    for start in range(0, n, ADD_CHUNK_ROWS):
        index.add(np.ascontiguousarray(vectors[start : start + ADD_CHUNK_ROWS], dtype=np.float32))
    return index, params


def config_of(backend: Backend, params: dict) -> IndexConfig:
    """The IndexConfig that rebuilds a backend with its recorded parameters (the inverse of build_faiss)."""
    by_backend: dict[str, dict[str, Any]] = {
        "flat": {},
        "hnsw": {
            "hnsw_m": params.get("m"),
            "hnsw_ef_construction": params.get("ef_construction"),
            "hnsw_ef_search": params.get("ef_search"),
        },
        "ivfpq": {
            "ivf_nlist": params.get("nlist"),
            "ivf_nprobe": params.get("nprobe"),
            "pq_m": params.get("pq_m"),
            "ivf_rerank": params.get("rerank"),
        },
    }
    return IndexConfig(backend=backend, **by_backend[backend])


def configure_search(index, backend: str, params: dict) -> None:
    if backend == "hnsw":
        index.hnsw.efSearch = params["ef_search"]
    elif backend == "ivfpq":
        index.nprobe = params["nprobe"]


class ExactSearch:
    """Exact MIPS as a brute-force matmul + top-k in torch (fp32), on any device: the search of a flat index on
    a GPU, where faiss is absent, and of a flat index too large to hold in RAM. The stored vectors are scanned in
    chunks, so the (Q, N) score matrix never exists in full. On a GPU they are copied to its memory once; on a CPU
    they stay where they are (a memory-mapped fp16 file: RAM holds one chunk in fp32 and the pages read)."""

    def __init__(self, vectors: np.ndarray, device: str | None = None, chunk_rows: int = 1 << 16):
        import torch

        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.vectors: Any = vectors  # (N, D), scanned in place on a CPU
        if self.device.type != "cpu":
            self.vectors = torch.from_numpy(np.array(vectors, dtype=np.float32)).to(self.device)
        self.chunk_rows = chunk_rows

    @property
    def ntotal(self) -> int:
        return self.vectors.shape[0]

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """(Q, D) float32 -> scores (Q, k) float32 and rows (Q, k) int64, best first (k <= N)."""
        import torch

        q = torch.from_numpy(np.ascontiguousarray(queries, dtype=np.float32)).to(self.device)  # (Q, D)
        best_scores = torch.empty(len(q), 0, device=self.device)
        best_rows = torch.empty(len(q), 0, dtype=torch.long, device=self.device)
        with torch.inference_mode():
            for start in range(0, self.ntotal, self.chunk_rows):
                chunk = self.vectors[start : start + self.chunk_rows]  # (C, D)
                if not isinstance(chunk, torch.Tensor):  # rows of a read-only memory map: copied, then widened
                    chunk = torch.from_numpy(np.array(chunk)).float()
                scores, rows = torch.topk(q @ chunk.T, min(k, len(chunk)), dim=1)  # (Q, k) f(x, z) = q · z
                scores, rows = torch.cat([best_scores, scores], 1), torch.cat([best_rows, rows + start], 1)
                best_scores, order = torch.topk(scores, min(k, scores.shape[1]), dim=1)  # merge with earlier chunks
                best_rows = torch.gather(rows, 1, order)
        return best_scores.cpu().numpy(), best_rows.cpu().numpy()
