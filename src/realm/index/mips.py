"""The MIPS index over Embed_doc(z) for every block z, versioned and published atomically.

Layout of an index folder:
    CURRENT                   name of the live version, replaced atomically (the commit point)
    versions/v000007/         one complete, immutable version
        meta.json             fingerprints (document tower, corpus), dims, count, backend, parameters
        embeddings.npy        (N, D) fp16 by default: what a refresh or a new backend reuses
        block_ids.npy         (N,) int64: row -> block id
        index.faiss           the faiss index (faiss' own format; no pickle); a flat version has none where
                              faiss is not installed or beyond IndexConfig.flat_in_memory_rows: exact search
                              then scans the memory-mapped embeddings
    building/                 resumable shards of a build in progress, one per `shard_size` blocks, and their
                              merge (index/build.py); deleted once published
    added/                    blocks added by `realm index add` (Arrow, like the corpus), append-only: each
                              version's meta.json lists the files it layers over the base corpus

A version is written under a temporary name and renamed when complete; CURRENT is switched only
afterwards. A reader follows CURRENT, so it never sees a half-written index, and an interrupted
build leaves the previous version live.

Search runs on the backends of index/backends.py: faiss on a CPU, exact search in torch on a GPU.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import logging
import os
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from realm.common.io import check_room, clean_partials, fsync_dir, reported_disk_full, write_atomic
from realm.config import Backend, RetrieverConfig
from realm.data.blocks import BlockStore
from realm.index.backends import ExactSearch, MipsIndexError, configure_search, faiss_file_bytes, faiss_module
from realm.index.knowledge import LayeredStore

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
CURRENT = "CURRENT"
VERSIONS = "versions"
BUILDING = "building"
ADDED = "added"


@dataclass(frozen=True)
class IndexMeta:
    format_version: int
    version: int
    doc_tower_fingerprint: str
    corpus_fingerprint: str
    corpus_path: str  # relative to the index folder when possible, so both can move together
    num_vectors: int
    dim: int
    backend: Backend
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
    embed: dict = field(
        default_factory=dict
    )  # the EmbedConfig of the build ({} in versions written before it was kept)
    # the version whose embeddings this one copied (same document tower, corpus and settings) instead of embedding
    reused_from: str | None = None


# -- publishing -----------------------------------------------------------------------------------
def version_name(version: int) -> str:
    return f"v{version:06d}"


def version_dir(index_dir: str | Path, version: int) -> Path:
    """The folder of one published version (the only place that spells its name)."""
    return Path(index_dir) / VERSIONS / version_name(version)


def read_meta(index_dir: str | Path, version: int) -> IndexMeta:
    """The metadata of one published version, without loading the version."""
    return IndexMeta(**json.loads((version_dir(index_dir, version) / "meta.json").read_text()))


def _versions(index_dir: Path) -> list[int]:
    folder = index_dir / VERSIONS
    if not folder.is_dir():
        return []
    return sorted(int(p.name[1:]) for p in folder.iterdir() if p.name.startswith("v") and p.name[1:].isdigit())


def current_version(index_dir: Path) -> int | None:
    pointer = Path(index_dir) / CURRENT
    if not pointer.exists():
        return None
    text = pointer.read_text(errors="replace").strip()
    if not (text.startswith("v") and text[1:].isdigit()):
        raise MipsIndexError(f"{pointer}: {text[:40]!r} is not a version name (like v000003); the file is damaged")
    return int(text[1:])


def publish(
    index_dir: Path,
    embeddings: np.ndarray | Path,
    block_ids: np.ndarray,
    index,
    meta_fields: dict,
    keep_versions: int,
) -> IndexMeta:
    """Write a complete new version, then switch CURRENT to it; prune versions beyond `keep_versions`.
    `embeddings`: the (N, D) array, or an .npy file of it in the index folder (moved in, not copied: at scale it is
    gigabytes). `index` is the faiss index, or None for a flat version searched without one. Without room for the
    whole version nothing is written (NoSpaceError); a disk that fills anyway leaves the live version as it was."""
    versions_dir = index_dir / VERSIONS
    versions_dir.mkdir(parents=True, exist_ok=True)
    for folder in (index_dir, versions_dir, index_dir / ADDED):  # what writers killed mid-write left behind
        for path in clean_partials(folder):
            log.info("removed %s, left by a writer that was killed", path)
    moved_in = 0 if isinstance(embeddings, Path) else embeddings.nbytes
    needed = moved_in + 8 * len(block_ids) + faiss_file_bytes(index) + (1 << 16)  # + meta.json, CURRENT
    check_room(index_dir, needed, f"a new version of {len(block_ids):,} vectors")
    with reported_disk_full(index_dir, f"a new version ({needed:,} bytes)"):
        tmp = versions_dir / f".partial-{os.getpid()}-{time.monotonic_ns()}"
        tmp.mkdir()
        try:
            if isinstance(embeddings, Path):
                os.replace(embeddings, tmp / "embeddings.npy")
            else:
                np.save(tmp / "embeddings.npy", embeddings)
            np.save(tmp / "block_ids.npy", block_ids.astype(np.int64))
            if index is not None:
                _write_faiss(index, tmp / "index.faiss")
            while True:  # claim the next version number; rename fails if another writer took it
                version = max(_versions(index_dir), default=0) + 1
                meta = IndexMeta(format_version=FORMAT_VERSION, version=version, created=time.time(), **meta_fields)
                (tmp / "meta.json").write_text(json.dumps(asdict(meta), indent=2) + "\n")
                for name in os.listdir(tmp):
                    with open(tmp / name, "rb") as handle:
                        os.fsync(handle.fileno())
                try:
                    os.rename(tmp, version_dir(index_dir, version))
                    break
                except OSError as err:  # another writer took the number; anything else is not a race
                    if err.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                        raise
            fsync_dir(versions_dir)
            write_atomic(index_dir / CURRENT, lambda p: p.write_text(version_name(version) + "\n"))
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    for old in _versions(index_dir)[:-keep_versions]:
        if old != version:
            shutil.rmtree(version_dir(index_dir, old), ignore_errors=True)
    return meta


def _write_faiss(index, path: Path) -> None:
    """Through a Python file: faiss' own file writer meets a full disk in its last buffer only on closing, prints
    "close error" and raises nothing (a truncated index.faiss would be published); Python's file raises OSError."""
    faiss = faiss_module()
    with open(path, "wb") as handle:
        faiss.write_index(index, faiss.PyCallbackIOWriter(handle.write))


# -- reading --------------------------------------------------------------------------------------
class MipsIndex:
    """One published version of an index, loaded in memory. `device` ("cpu", "cuda"; None: a GPU if there is
    one) says where a flat index is searched: on a GPU by `ExactSearch`, on the CPU by faiss (or by
    `ExactSearch` where faiss is not installed)."""

    def __init__(self, index_dir: str | Path, version: int | None = None, device: str | None = None):
        self.index_dir = Path(index_dir)
        version = version if version is not None else current_version(self.index_dir)
        if version is None:
            raise MipsIndexError(
                f"{self.index_dir}: no published index (no {CURRENT}); build one with `realm index build`"
            )
        folder = version_dir(self.index_dir, version)
        self.folder = folder
        part = folder / "meta.json"  # named in the error: the file that could not be read
        try:
            self.meta = read_meta(self.index_dir, version)
            part = folder / "block_ids.npy"
            self.block_ids = np.load(part)
            part = folder / ("index.faiss" if (folder / "index.faiss").exists() else "embeddings.npy")
            self.index = self._open_search(folder, device)
        except (FileNotFoundError, json.JSONDecodeError, TypeError, RuntimeError, ValueError, EOFError) as err:
            raise MipsIndexError(f"{part}: unreadable ({err}); this index version is damaged") from err
        if self.index.ntotal != self.meta.num_vectors or len(self.block_ids) != self.meta.num_vectors:
            raise MipsIndexError(f"{folder}: {self.index.ntotal} vectors, metadata says {self.meta.num_vectors}")

    def _open_search(self, folder: Path, device: str | None):
        """ExactSearch for a flat index on a GPU or without faiss (or without index.faiss); else faiss."""
        faiss = faiss_module()
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
            raise MipsIndexError(
                f"corpus {path} has fingerprint {store.fingerprint} but index {self.index_dir} was "
                f"built from {self.meta.corpus_fingerprint}; rebuild the index"
            )
        return LayeredStore(store, [self.index_dir / entry["file"] for entry in self.meta.added], self.block_ids)

    def retriever_config(self, base: RetrieverConfig) -> RetrieverConfig:
        """`base` with the retriever settings this index was built with (pooling, sizes): what a model must use
        to search it."""
        return dataclasses.replace(base, **self.meta.retriever)

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
            _, candidates = self.index.search(queries, min(k * rerank, self.meta.num_vectors))
            scores, rows = self._rerank(queries, candidates, k)
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

    def _rerank(self, queries: np.ndarray, rows: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Exact inner products for the approximate candidates, read from the memory-mapped embeddings."""
        stored = self.embeddings()
        safe = np.clip(rows, 0, None)
        vectors = stored[safe.ravel()].astype(np.float32).reshape(*rows.shape, -1)  # (Q, C, D)
        exact = np.einsum("qcd,qd->qc", vectors, queries)
        exact[rows < 0] = -np.inf
        order = np.argsort(-exact, axis=1, kind="stable")[:, :k]
        return np.take_along_axis(exact, order, 1), np.take_along_axis(rows, order, 1)
