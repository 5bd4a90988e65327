"""The MIPS index over Embed_doc(z) for every block z, versioned and published atomically.

Layout of an index folder:
    CURRENT                   name of the live version, replaced atomically (the commit point)
    versions/v000007/         one complete, immutable version
        meta.json             fingerprints (document tower, corpus), dims, count, backend, parameters
        embeddings.npy        (N, D) fp16 by default: what a refresh or a new backend reuses
        block_ids.npy         (N,) int64: row -> block id
        index.faiss           the faiss index (faiss' own format; no pickle); a flat version published
                              where faiss is not installed has none: exact search needs only the embeddings
    building/                 resumable shards of a build in progress (deleted once published)
    added/                    blocks added by `realm index add` (Arrow, like the corpus), append-only: each
                              version's meta.json lists the files it layers over the base corpus

A version is written under a temporary name and renamed when complete; CURRENT is switched only
afterwards. A reader follows CURRENT, so it never sees a half-written index, and an interrupted
build leaves the previous version live.

Exact (`flat`) search runs on faiss' IndexFlatIP on a CPU, and as a brute-force matmul + top-k in torch
(`ExactSearch`) on a GPU or where faiss is not installed, as the original REALM and Hugging Face code do:
the same scores, ranked the same way. `hnsw` and `ivfpq` need faiss.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
from tqdm import tqdm

from realm.common.io import fsync_dir, save_npy_atomic, write_atomic, write_json_atomic
from realm.config import EmbedConfig, IndexConfig, RetrieverConfig
from realm.data.blocks import BlockStore, read_blocks
from realm.index.embed import BlockEmbedder

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
CURRENT = "CURRENT"
VERSIONS = "versions"
BUILDING = "building"
ADDED = "added"


class MipsIndexError(RuntimeError):
    """A missing, corrupt or mismatched index."""


@dataclass(frozen=True)
class IndexMeta:
    format_version: int
    version: int
    doc_tower_fingerprint: str
    corpus_fingerprint: str
    corpus_path: str  # relative to the index folder when possible, so both can move together
    num_vectors: int
    dim: int
    backend: str
    params: dict
    retriever: dict  # the RetrieverConfig of the model that built it (pooling, sizes)
    storage_dtype: str
    embed_seconds: float
    build_seconds: float
    created: float
    # Trainer step and wall time of the retriever snapshot the index was built from (asynchronous refresh);
    # None for an index built from a model outside training.
    checkpoint_step: int | None = None
    checkpoint_time: float | None = None
    # Blocks added since the build, layered over the corpus in id order: {"file", "first_id", "num_blocks"}.
    added: list[dict] = field(default_factory=list)


# -- faiss ----------------------------------------------------------------------------------------
def _faiss():
    """The faiss module, or None where it is not installed (e.g. a GPU image without faiss)."""
    try:
        import faiss
    except ImportError:
        return None
    return faiss


def build_faiss(vectors: np.ndarray, config: IndexConfig):
    """Build the chosen backend over (N, D) float32 vectors; returns the faiss index and its parameters.
    Without faiss a flat version has no faiss index (None): exact search reads the embeddings."""
    n, dim = vectors.shape
    vectors = np.ascontiguousarray(vectors, dtype=np.float32)
    faiss = _faiss()
    if faiss is None:
        if config.backend != "flat":
            raise MipsIndexError(f"the {config.backend} backend needs faiss (pip install faiss-cpu); "
                                 "flat (exact) search works without it")
        return None, {}
    if config.backend == "flat":
        index = faiss.IndexFlatIP(dim)
        params: dict = {}
    elif config.backend == "hnsw":
        index = faiss.IndexHNSWFlat(dim, config.hnsw_m, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = config.hnsw_ef_construction
        params = {"m": config.hnsw_m, "ef_construction": config.hnsw_ef_construction, "ef_search": config.hnsw_ef_search}
    elif config.backend == "ivfpq":
        pq_m = max(m for m in range(1, config.pq_m + 1) if dim % m == 0)  # sub-quantisers must divide dim
        nlist = config.ivf_nlist or max(1, min(int(4 * math.sqrt(n)), n // 39))
        nbits = max(1, min(8, int(math.log2(max(2, n // 4)))))  # PQ needs >= 2**nbits training points
        index = faiss.IndexIVFPQ(faiss.IndexFlatIP(dim), dim, nlist, pq_m, nbits, faiss.METRIC_INNER_PRODUCT)
        sample = vectors
        if n > 256 * nlist:
            sample = vectors[np.random.default_rng(0).choice(n, 256 * nlist, replace=False)]
        index.train(sample)
        params = {"nlist": nlist, "nprobe": min(config.ivf_nprobe, nlist), "pq_m": pq_m, "nbits": nbits,
                  "rerank": config.ivf_rerank}
    else:
        raise ValueError(f"unknown index backend {config.backend!r}; choose flat, hnsw or ivfpq")
    index.add(vectors)
    return index, params


def config_of(meta: IndexMeta) -> IndexConfig:
    """The IndexConfig that rebuilds `meta`'s backend with its recorded parameters (the inverse of build_faiss)."""
    params = meta.params
    by_backend = {
        "flat": {},
        "hnsw": {"hnsw_m": params.get("m"), "hnsw_ef_construction": params.get("ef_construction"),
                 "hnsw_ef_search": params.get("ef_search")},
        "ivfpq": {"ivf_nlist": params.get("nlist"), "ivf_nprobe": params.get("nprobe"), "pq_m": params.get("pq_m"),
                  "ivf_rerank": params.get("rerank")},
    }
    return IndexConfig(backend=meta.backend, **by_backend[meta.backend])


def configure_search(index, backend: str, params: dict) -> None:
    if backend == "hnsw":
        index.hnsw.efSearch = params["ef_search"]
    elif backend == "ivfpq":
        index.nprobe = params["nprobe"]


# -- embedding the corpus, resumably --------------------------------------------------------------
def embed_corpus(store: BlockStore, embedder: BlockEmbedder, doc_fingerprint: str, work_dir: Path,
                 embed_config: EmbedConfig, progress: bool = True) -> np.ndarray:
    """(N, D) float32 embeddings of every block, saved shard by shard under `work_dir` so that an
    interrupted build resumes where it stopped (only with the same tower, corpus and dtypes)."""
    manifest = {"doc_tower_fingerprint": doc_fingerprint, "corpus_fingerprint": store.fingerprint,
                "shard_size": embed_config.shard_size, "storage_dtype": embed_config.storage_dtype,
                "compute_dtype": str(embedder.dtype)}
    manifest_path = work_dir / "manifest.json"
    if manifest_path.exists() and json.loads(manifest_path.read_text()) != manifest:
        log.info("discarding shards of an earlier build with other settings in %s", work_dir)
        shutil.rmtree(work_dir)
    work_dir.mkdir(parents=True, exist_ok=True)
    write_json_atomic(manifest_path, manifest)

    n, size = len(store), embed_config.shard_size
    storage = np.float16 if embed_config.storage_dtype == "fp16" else np.float32
    shards = []
    with tqdm(total=n, desc="embedding blocks", unit="block", disable=not progress, smoothing=0.05) as bar:
        for number, start in enumerate(range(0, n, size)):
            path = work_dir / f"shard_{number:05d}.npy"
            stop = min(start + size, n)
            if path.exists():
                shard = np.load(path)
                if shard.shape[0] != stop - start:
                    raise MipsIndexError(f"{path}: {shard.shape[0]} rows, expected {stop - start}; delete {work_dir}")
                bar.update(stop - start)
            else:
                titles, bodies = store.slice(start, stop)
                shard = embedder.embed(titles, bodies, on_batch=bar.update).astype(storage)
                save_npy_atomic(path, shard)
            shards.append(shard)
    return np.concatenate(shards).astype(np.float32)


# -- publishing -----------------------------------------------------------------------------------
def _versions(index_dir: Path) -> list[int]:
    folder = index_dir / VERSIONS
    if not folder.is_dir():
        return []
    return sorted(int(p.name[1:]) for p in folder.iterdir() if p.name.startswith("v") and p.name[1:].isdigit())


def current_version(index_dir: Path) -> int | None:
    pointer = Path(index_dir) / CURRENT
    if not pointer.exists():
        return None
    return int(pointer.read_text().strip().lstrip("v"))


def publish(index_dir: Path, embeddings: np.ndarray, block_ids: np.ndarray, index, meta_fields: dict,
            keep_versions: int) -> IndexMeta:
    """Write a complete new version, then switch CURRENT to it; prune versions beyond `keep_versions`.
    `index` is the faiss index, or None for a flat version built without faiss."""
    versions_dir = index_dir / VERSIONS
    versions_dir.mkdir(parents=True, exist_ok=True)
    tmp = versions_dir / f".partial-{os.getpid()}-{time.monotonic_ns()}"
    tmp.mkdir()
    try:
        np.save(tmp / "embeddings.npy", embeddings)
        np.save(tmp / "block_ids.npy", block_ids.astype(np.int64))
        if index is not None:
            _faiss().write_index(index, str(tmp / "index.faiss"))
        while True:  # claim the next version number; rename fails if another writer took it
            version = max(_versions(index_dir), default=0) + 1
            meta = IndexMeta(format_version=FORMAT_VERSION, version=version, created=time.time(), **meta_fields)
            (tmp / "meta.json").write_text(json.dumps(asdict(meta), indent=2) + "\n")
            for name in os.listdir(tmp):
                with open(tmp / name, "rb") as handle:
                    os.fsync(handle.fileno())
            try:
                os.rename(tmp, versions_dir / f"v{version:06d}")
                break
            except OSError:
                continue
        fsync_dir(versions_dir)
        write_atomic(index_dir / CURRENT, lambda p: p.write_text(f"v{version:06d}\n"))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    for old in _versions(index_dir)[:-keep_versions]:
        if old != version:
            shutil.rmtree(versions_dir / f"v{old:06d}", ignore_errors=True)
    return meta


def build_index(store: BlockStore, embedder: BlockEmbedder, doc_fingerprint: str, index_dir: Path,
                embed_config: EmbedConfig, index_config: IndexConfig, retriever_config: RetrieverConfig,
                progress: bool = True, checkpoint_step: int | None = None,
                checkpoint_time: float | None = None) -> IndexMeta:
    """Embed every block of `store` and publish a new index version at `index_dir`."""
    index_dir = Path(index_dir)
    if index_dir.exists() and any(index_dir.iterdir()) and not (index_dir / VERSIONS).exists() \
            and not (index_dir / BUILDING).exists():
        raise FileExistsError(f"{index_dir} exists and is not an index folder; refusing to write into it")
    index_dir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    embeddings = embed_corpus(store, embedder, doc_fingerprint, index_dir / BUILDING, embed_config, progress)
    embed_seconds = time.monotonic() - started
    index, params = build_faiss(embeddings, index_config)
    storage = np.float16 if embed_config.storage_dtype == "fp16" else np.float32
    try:
        corpus_path = os.path.relpath(store.folder.resolve(), index_dir.resolve())
    except ValueError:  # different drives on Windows
        corpus_path = str(store.folder.resolve())
    meta = publish(
        index_dir, embeddings.astype(storage), np.arange(len(store), dtype=np.int64), index,
        dict(doc_tower_fingerprint=doc_fingerprint, corpus_fingerprint=store.fingerprint, corpus_path=corpus_path,
             num_vectors=len(store), dim=int(embeddings.shape[1]), backend=index_config.backend, params=params,
             retriever={k: v for k, v in asdict(retriever_config).items() if k != "shape"},
             storage_dtype=embed_config.storage_dtype, embed_seconds=round(embed_seconds, 1),
             build_seconds=round(time.monotonic() - started, 1), checkpoint_step=checkpoint_step,
             checkpoint_time=checkpoint_time),
        index_config.keep_versions,
    )
    shutil.rmtree(index_dir / BUILDING, ignore_errors=True)
    return meta


# -- reading --------------------------------------------------------------------------------------
class LayeredStore(BlockStore):
    """The knowledge of one index version, with BlockStore's interface: the base corpus, then the blocks added to
    the index (their ids continue after the corpus, so row = block id still holds), and the version's live ids.
    Blocks of removed documents keep their rows, so an id means the same block in every file of the folder."""

    def __init__(self, base: BlockStore, added: list[Path], live_ids: np.ndarray):
        # No BlockStore.__init__: the base corpus is already read and checked.
        self.folder, self.meta = base.folder, base.meta
        tables = [base.table]
        for path in added:
            table, expected = read_blocks(path), sum(t.num_rows for t in tables)
            first = table.column("block_id")[0].as_py() if table.num_rows else None
            if first != expected:
                raise MipsIndexError(f"{path}: added blocks start at id {first}, expected {expected}")
            tables.append(table)
        self.table = pa.concat_tables(tables)
        self._added = [path.name for path in added]
        self._live = np.sort(live_ids)

    @property
    def live_ids(self) -> np.ndarray:
        return self._live

    @property
    def fingerprint(self) -> str:
        """The base corpus's while nothing was added or removed; else a hash of it, the added files and the live ids."""
        if not self._added and len(self._live) == len(self):
            return self.meta.fingerprint
        digest = hashlib.sha256(json.dumps([self.meta.fingerprint, self._added]).encode())
        digest.update(self._live.tobytes())
        return digest.hexdigest()[:16]


class ExactSearch:
    """Exact MIPS as a brute-force matmul + top-k in torch (fp32), on any device: the search of a flat index on
    a GPU, or wherever faiss is absent. The stored vectors are scanned in chunks, so the (Q, N) score matrix
    never exists in full (a 13M-block index is searched in slices of `chunk_rows`)."""

    def __init__(self, vectors: np.ndarray, device: str | None = None, chunk_rows: int = 1 << 20):
        import torch

        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.vectors = torch.from_numpy(np.array(vectors, dtype=np.float32)).to(self.device)  # (N, D), a copy in memory
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
                scores, rows = torch.topk(q @ chunk.T, min(k, len(chunk)), dim=1)  # (Q, k) f(x, z) = q · z
                scores, rows = torch.cat([best_scores, scores], 1), torch.cat([best_rows, rows + start], 1)
                best_scores, order = torch.topk(scores, min(k, scores.shape[1]), dim=1)  # merge with earlier chunks
                best_rows = torch.gather(rows, 1, order)
        return best_scores.cpu().numpy(), best_rows.cpu().numpy()


class MipsIndex:
    """One published version of an index, loaded in memory. `device` ("cpu", "cuda"; None: a GPU if there is
    one) says where a flat index is searched: on a GPU by `ExactSearch`, on the CPU by faiss (or by
    `ExactSearch` where faiss is not installed)."""

    def __init__(self, index_dir: str | Path, version: int | None = None, device: str | None = None):
        self.index_dir = Path(index_dir)
        version = version if version is not None else current_version(self.index_dir)
        if version is None:
            raise MipsIndexError(f"{self.index_dir}: no published index (no {CURRENT}); build one with `realm index build`")
        folder = self.index_dir / VERSIONS / f"v{version:06d}"
        self.folder = folder
        try:
            self.meta = IndexMeta(**json.loads((folder / "meta.json").read_text()))
            self.block_ids = np.load(folder / "block_ids.npy")
            self.index = self._open_search(folder, device)
        except (FileNotFoundError, json.JSONDecodeError, TypeError, RuntimeError, ValueError) as err:
            raise MipsIndexError(f"{folder}: unreadable index version: {err}") from err
        if self.index.ntotal != self.meta.num_vectors or len(self.block_ids) != self.meta.num_vectors:
            raise MipsIndexError(f"{folder}: {self.index.ntotal} vectors, metadata says {self.meta.num_vectors}")

    def _open_search(self, folder: Path, device: str | None):
        """ExactSearch for a flat index on a GPU or without faiss (or without index.faiss); else faiss."""
        faiss = _faiss()
        if self.meta.backend == "flat":
            if device is None:
                import torch

                device = "cuda" if torch.cuda.is_available() else "cpu"
            if device != "cpu" or faiss is None or not (folder / "index.faiss").exists():
                return ExactSearch(self.embeddings(), device)
        if faiss is None:
            raise MipsIndexError(f"the {self.meta.backend} backend needs faiss (pip install faiss-cpu)")
        index = faiss.read_index(str(folder / "index.faiss"))
        configure_search(index, self.meta.backend, self.meta.params)
        return index

    @property
    def version(self) -> int:
        return self.meta.version

    def embeddings(self) -> np.ndarray:
        return np.load(self.folder / "embeddings.npy", mmap_mode="r")

    def corpus(self, override: str | Path | None = None) -> LayeredStore:
        """This version's knowledge: the corpus the index was built from (or `override`), checked against the
        recorded fingerprint, with the blocks added since layered over it."""
        path = Path(override) if override else self.index_dir / self.meta.corpus_path
        store = BlockStore(path)
        if store.fingerprint != self.meta.corpus_fingerprint:
            raise MipsIndexError(f"corpus {path} has fingerprint {store.fingerprint} but index {self.index_dir} was "
                              f"built from {self.meta.corpus_fingerprint}; rebuild the index")
        return LayeredStore(store, [self.index_dir / entry["file"] for entry in self.meta.added], self.block_ids)

    def check_doc_tower(self, fingerprint: str) -> None:
        """Refuse another model's document tower: its query scores and added vectors would be meaningless here."""
        if fingerprint != self.meta.doc_tower_fingerprint:
            raise MipsIndexError(
                f"the model's document tower (fingerprint {fingerprint}) is not the one that built index "
                f"{self.index_dir} ({self.meta.doc_tower_fingerprint}): its scores would be meaningless. "
                "Use the model that built the index, or rebuild the index with this model."
            )

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """(Q, D) float32 -> scores (Q, k) and block ids (Q, k), best first; -1 ids pad short results."""
        queries = np.ascontiguousarray(queries, dtype=np.float32)
        k = min(k, self.meta.num_vectors)
        rerank = self.meta.params.get("rerank", 0)
        if rerank:
            scores, rows = self._rerank(queries, *self.index.search(queries, min(k * rerank, self.meta.num_vectors)), k)
        else:
            scores, rows = self.index.search(queries, k)
        ids = np.where(rows >= 0, self.block_ids[np.clip(rows, 0, None)], -1)
        return scores, ids

    def stored_vectors(self, block_ids: np.ndarray) -> np.ndarray:
        """Embed_doc of the given blocks as stored in this version: (..., D) float32."""
        rows = np.clip(np.searchsorted(self.block_ids, block_ids), 0, len(self.block_ids) - 1)
        if not np.array_equal(self.block_ids[rows], block_ids):
            raise KeyError("block ids missing from the index")
        return np.asarray(self.embeddings()[rows.ravel()], dtype=np.float32).reshape(*block_ids.shape, -1)

    def _rerank(self, queries: np.ndarray, _: np.ndarray, rows: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Exact inner products for the approximate candidates, read from the memory-mapped embeddings."""
        stored = self.embeddings()
        safe = np.clip(rows, 0, None)
        vectors = stored[safe.ravel()].astype(np.float32).reshape(*rows.shape, -1)  # (Q, C, D)
        exact = np.einsum("qcd,qd->qc", vectors, queries)
        exact[rows < 0] = -np.inf
        order = np.argsort(-exact, axis=1, kind="stable")[:, :k]
        return np.take_along_axis(exact, order, 1), np.take_along_axis(rows, order, 1)
