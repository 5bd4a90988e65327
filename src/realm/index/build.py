"""Building an index version: embed every block, merge, build the search backend, publish.

One process by default; under torchrun (any number of ranks, on one machine or several sharing the filesystem)
every rank embeds its share of the shards and rank 0 merges them and publishes:

    torchrun --nproc_per_node=4 -m realm.cli index build --corpus corpus/ --model runs/ict/retriever --out index/

    rank r:  building/shard_{r}, shard_{r+W}, ...   (resumable: a finished shard is never embedded twice)
    rank 0:  building/embeddings.npy <- the shards in block order, through a memory map
             faiss over it, chunk by chunk -> versions/v000008/ -> CURRENT

A shard holds the same rows whatever the number of ranks, so the published version does not depend on it.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

import numpy as np

from realm.config import EmbedConfig, IndexConfig, RetrieverConfig
from realm.data.blocks import BlockStore
from realm.index.backends import MipsIndexError, build_faiss
from realm.index.embed import BlockEmbedder, embed_shards, merge_shards
from realm.index.mips import (
    BUILDING,
    CURRENT,
    VERSIONS,
    IndexMeta,
    current_version,
    publish,
    read_meta,
    version_dir,
)
from realm.models.retriever import Retriever
from realm.training.distributed import ONE_PROCESS, Dist, broadcast


def build_index(
    store: BlockStore,
    embedder: BlockEmbedder,
    doc_fingerprint: str,
    index_dir: Path,
    embed_config: EmbedConfig,
    index_config: IndexConfig,
    retriever_config: RetrieverConfig,
    progress: bool = True,
    checkpoint_step: int | None = None,
    checkpoint_time: float | None = None,
    replace_model: bool = False,
    reuse: Sequence[Path] = (),
    d: Dist = ONE_PROCESS,
) -> IndexMeta:
    """Embed every block of `store` and publish a new index version at `index_dir`; every rank returns its meta.
    A folder whose live version was built by another document tower is refused unless `replace_model` (its users'
    query towers would no longer match it); the trainer's builder, whose towers change by design, passes True.
    `reuse`: index folders whose live version, if built by this document tower over this corpus with the same
    settings, gives its embeddings instead (a pipeline builds the same tower's index several times)."""
    index_dir = Path(index_dir)
    live = current_version(index_dir) if (index_dir / CURRENT).exists() else None
    if live is not None and not replace_model:
        built_by = read_meta(index_dir, live).doc_tower_fingerprint
        if built_by != doc_fingerprint:
            raise MipsIndexError(
                f"{index_dir}: its live version v{live} was built by document tower {built_by}, this model's is "
                f"{doc_fingerprint}; publishing would break every user of the folder (their query tower no longer "
                "matches). Build into another folder, or pass --replace-model to replace the index's model"
            )
    if (
        index_dir.exists()
        and any(index_dir.iterdir())
        and not (index_dir / VERSIONS).exists()
        and not (index_dir / BUILDING).exists()
    ):
        raise FileExistsError(f"{index_dir} exists and is not an index folder; refusing to write into it")
    started = time.monotonic()
    retriever_fields = {k: v for k, v in asdict(retriever_config).items() if k != "shape"}
    source = same_embeddings(reuse, doc_fingerprint, store, embed_config, retriever_fields)
    if source is None:
        shards = embed_shards(store, embedder, doc_fingerprint, index_dir / BUILDING, embed_config, progress, d)
    embed_seconds = time.monotonic() - started
    meta = None
    if d.main:
        merged = index_dir / BUILDING / "embeddings.npy"
        if source is None:
            embeddings = merge_shards(shards, merged)
        else:
            merged.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source / "embeddings.npy", merged)  # publish moves it in: the source keeps its own
            embeddings = np.load(merged, mmap_mode="r")
        index, params = build_faiss(embeddings, index_config)
        try:
            corpus_path = os.path.relpath(store.folder.resolve(), index_dir.resolve())
        except ValueError:  # different drives on Windows
            corpus_path = str(store.folder.resolve())
        meta = publish(
            index_dir,
            index_dir / BUILDING / "embeddings.npy",
            np.arange(len(store), dtype=np.int64),
            index,
            dict(
                doc_tower_fingerprint=doc_fingerprint,
                corpus_fingerprint=store.fingerprint,
                corpus_path=corpus_path,
                num_vectors=len(store),
                dim=int(embeddings.shape[1]),
                backend=index_config.backend,
                params=params,
                retriever=retriever_fields,
                storage_dtype=embed_config.storage_dtype,
                embed=asdict(embed_config),
                embed_seconds=round(embed_seconds, 1),
                build_seconds=round(time.monotonic() - started, 1),
                checkpoint_step=checkpoint_step,
                checkpoint_time=checkpoint_time,
                reused_from=None if source is None else str(source.resolve()),
            ),
            index_config.keep_versions,
        )
        shutil.rmtree(index_dir / BUILDING, ignore_errors=True)
    return broadcast(meta, d)


def same_embeddings(
    folders: Sequence[Path], doc_fingerprint: str, store: BlockStore, embed_config: EmbedConfig, retriever: dict
) -> Path | None:
    """The first live version among `folders` built by this document tower over exactly this corpus (no blocks
    added since) with the same embedding settings: its embeddings are the ones a build would compute."""
    for folder in folders:
        live = current_version(Path(folder))
        if live is None:
            continue
        meta = read_meta(folder, live)
        if (
            meta.doc_tower_fingerprint == doc_fingerprint
            and meta.corpus_fingerprint == store.fingerprint
            and not meta.added
            and meta.num_vectors == len(store)
            and meta.embed == asdict(embed_config)
            and meta.retriever == retriever
        ):
            return version_dir(folder, live)
    return None


def build_from_retriever(
    retriever: Retriever,
    store: BlockStore,
    index_dir: Path,
    embed: EmbedConfig,
    index: IndexConfig,
    step: int | None = None,
    snapshot_time: float | None = None,
    progress: bool = False,
    replace_model: bool = False,
    reuse: Sequence[Path] = (),
    d: Dist = ONE_PROCESS,
) -> IndexMeta:
    """Embed every block with the retriever's document tower and publish a version: the one build path of
    `realm index build`, the trainer's first index and the builder's rebuilds. `step`/`snapshot_time`: the
    trainer snapshot it comes from (None outside training); `reuse`: see `build_index`."""
    embedder = BlockEmbedder(retriever.doc_tower, retriever.tokenizer, store.config, embed)
    return build_index(
        store,
        embedder,
        retriever.doc_fingerprint(),
        index_dir,
        embed,
        index,
        retriever.config,
        progress=progress,
        checkpoint_step=step,
        checkpoint_time=snapshot_time,
        replace_model=replace_model,
        reuse=reuse,
        d=d,
    )
