"""Swap the knowledge of a live index without retraining: add documents, embedded by the frozen document
tower that built the index, or remove them; each change is published as a new version.

Block ids stay stable. The base corpus is never modified (other indexes may share it); added blocks get the
ids after the version's last one and are stored under `index_dir/added/`, append-only, so an older version
still resolves its own blocks. Removing a document drops its rows from the new version only. A full rebuild
(`realm index build`, `index refresh`) starts again from the corpus alone.

The faiss index is rebuilt from the new version's stored embeddings with the backend and parameters the
index was built with: a copy for flat, seconds for HNSW or IVF-PQ at our scale (faiss' HNSW cannot delete,
and one rebuild path serves every backend and both operations). A crash before `publish` switches CURRENT
leaves the previous version live; at worst an unreferenced file is left in `added/`.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from transformers import PreTrainedTokenizerBase

from realm.common.io import check_room, reported_disk_full, write_atomic
from realm.common.tokenization import tokenizer_fingerprint
from realm.config import EmbedConfig
from realm.data.blocks import (
    Block,
    BlockSplitter,
    BlockStore,
    Fingerprint,
    split_documents,
    write_blocks,
)
from realm.data.sources import BadRecords, CorpusError, read_all
from realm.index.backends import MipsIndexError, build_faiss, config_of
from realm.index.embed import BlockEmbedder
from realm.index.mips import ADDED, IndexMeta, MipsIndex, current_version, publish, version_dir
from realm.models.retriever import Retriever


@dataclass(frozen=True)
class Update:
    """What a change did, for the report."""

    version: int
    documents: int
    blocks: int
    live_blocks: int
    skipped: int = 0


def add_documents(
    index: MipsIndex,
    docs_path: str,
    retriever: Retriever,
    embed_config: EmbedConfig,
    keep_versions: int,
    skip_bad: bool = False,
    corpus: str | Path | None = None,
) -> Update:
    """Split the documents of a JSONL file with the corpus's own settings, embed them with `retriever`'s document
    tower (the one that built `index`) and publish a version with their blocks added."""
    started = time.monotonic()
    index.check_doc_tower(retriever.doc_fingerprint())
    store = index.corpus(corpus)
    _check_tokenizer(store, retriever.tokenizer)
    bad = BadRecords()
    docs = list(read_all([docs_path], skip_bad, bad))
    present = _present([doc.id for doc in docs], _row_doc_ids(index, store))
    if present:
        raise CorpusError(
            f"{docs_path}: document id(s) already in index {index.index_dir} v{index.version}: "
            f"{_listing(present)}; remove them first with `realm index remove`"
        )
    per_doc = list(split_documents(docs, BlockSplitter(retriever.tokenizer, store.config), skip_bad, bad))
    blocks = [block for doc_blocks in per_doc for block in doc_blocks]
    if not blocks:
        raise CorpusError(f"{docs_path}: no documents to add ({bad.count} bad records skipped)")
    first_id = len(store)
    _check_room_to_add(index, blocks)
    with reported_disk_full(index.index_dir, f"{len(blocks):,} added blocks"):
        entry = _write_added(index.index_dir, blocks, first_id, store)
    embedder = BlockEmbedder(retriever.doc_tower, retriever.tokenizer, store.config, embed_config)
    stored = index.embeddings()
    embedding = time.monotonic()
    vectors = embedder.embed([b.title for b in blocks], [b.body for b in blocks]).astype(stored.dtype)
    embed_seconds = time.monotonic() - embedding
    meta = _publish_update(
        index,
        np.concatenate([stored, vectors]),
        np.concatenate([index.block_ids, np.arange(first_id, first_id + len(blocks))]),
        [*index.meta.added, entry],
        keep_versions,
        started,
        embed_seconds,
    )
    return Update(meta.version, len(per_doc), len(blocks), meta.num_vectors, bad.count)


def remove_documents(
    index: MipsIndex, doc_ids: list[str], keep_versions: int, corpus: str | Path | None = None
) -> Update:
    """Publish a version without any block of `doc_ids`; unknown ids are an error and publish nothing."""
    started = time.monotonic()
    wanted = list(dict.fromkeys(doc_ids))
    row_docs = _row_doc_ids(index, index.corpus(corpus))
    known = set(_present(wanted, row_docs))
    unknown = [doc_id for doc_id in wanted if doc_id not in known]
    if unknown:
        raise MipsIndexError(
            f"document id(s) not in index {index.index_dir} v{index.version}: {_listing(unknown)}; nothing was removed"
        )
    keep = ~pc.is_in(row_docs, value_set=pa.array(wanted, pa.string())).to_numpy(zero_copy_only=False)
    if not keep.any():
        raise MipsIndexError(f"removing {len(wanted)} document(s) would leave index {index.index_dir} empty")
    meta = _publish_update(
        index,
        np.asarray(index.embeddings())[keep],
        index.block_ids[keep],
        index.meta.added,
        keep_versions,
        started,
        embed_seconds=0.0,
    )
    return Update(meta.version, len(wanted), int((~keep).sum()), meta.num_vectors)


def _check_tokenizer(store: BlockStore, tokenizer: PreTrainedTokenizerBase) -> None:
    """New blocks must be cut by the tokenizer that split the corpus, or their budgets would mean other things."""
    if tokenizer_fingerprint(tokenizer) != store.meta.tokenizer_fingerprint:
        raise MipsIndexError(
            f"the model's tokenizer ({tokenizer_fingerprint(tokenizer)}) is not the one corpus "
            f"{store.folder} was split with ({store.meta.tokenizer_fingerprint})"
        )


def _row_doc_ids(index: MipsIndex, store: BlockStore) -> pa.ChunkedArray:
    """The document id of each vector of the version (Arrow: cheap for millions of blocks)."""
    return store.table.column("doc_id").take(pa.array(index.block_ids))


def _present(wanted: list[str], row_docs: pa.ChunkedArray) -> list[str]:
    """Those of `wanted` that own at least one vector."""
    hits = pc.is_in(pa.array(wanted, pa.string()), value_set=pc.unique(row_docs)).to_pylist()
    return [doc_id for doc_id, hit in zip(wanted, hits) if hit]


def _listing(ids: list[str], most: int = 20) -> str:
    shown = ", ".join(repr(i) for i in ids[:most])
    return shown + (f" and {len(ids) - most} more" if len(ids) > most else "")


def _check_room_to_add(index: MipsIndex, blocks: list[Block]) -> None:
    """Before embedding anything: room for the blocks' text and a version that many rows larger (the live one's
    files, scaled by rows: the same backend and parameters)."""
    on_disk = sum(f.stat().st_size for f in version_dir(index.index_dir, index.version).iterdir() if f.is_file())
    rows = max(1, index.meta.num_vectors)
    text = sum(len(b.title.encode()) + len(b.body.encode()) + 64 for b in blocks)
    needed = on_disk * (rows + len(blocks)) // rows + text
    check_room(index.index_dir, needed, f"adding {len(blocks):,} blocks (their text and a new version)")


def _write_added(index_dir: Path, blocks: list[Block], first_id: int, store: BlockStore) -> dict:
    """Store new blocks in the index folder, named by their first id and content (a retry rewrites the same file)."""
    fingerprint = Fingerprint(store.config, store.meta.tokenizer_fingerprint)
    for block in blocks:
        fingerprint.update(block)
    name = f"{ADDED}/blocks-{first_id}-{fingerprint.hexdigest()}.arrow"
    write_atomic(index_dir / name, lambda tmp: write_blocks(tmp, blocks, first_id))
    return {"file": name, "first_id": first_id, "num_blocks": len(blocks)}


def _publish_update(
    index: MipsIndex,
    embeddings: np.ndarray,
    block_ids: np.ndarray,
    added: list[dict],
    keep_versions: int,
    started: float,
    embed_seconds: float,
) -> IndexMeta:
    """Rebuild faiss over the new rows with the version's own backend and publish, unless another writer
    published since `index` was loaded (its change would be lost)."""
    faiss_index, params = build_faiss(embeddings.astype(np.float32), config_of(index.meta.backend, index.meta.params))
    live = current_version(index.index_dir)
    if live != index.version:
        raise MipsIndexError(
            f"index {index.index_dir} moved from v{index.version} to v{live} during the update; "
            "nothing was published: run the command again"
        )
    fields = {k: v for k, v in asdict(index.meta).items() if k not in ("format_version", "version", "created")}
    fields.update(
        num_vectors=len(block_ids),
        params=params,
        added=added,
        embed_seconds=round(embed_seconds, 1),
        build_seconds=round(time.monotonic() - started, 1),
    )
    return publish(index.index_dir, embeddings, block_ids, faiss_index, fields, keep_versions)
