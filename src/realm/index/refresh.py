"""Asynchronous MIPS refresh, as in the paper: the trainer publishes retriever snapshots, an index builder
(another process, possibly another machine on a shared filesystem) re-embeds the corpus with the newest
one and publishes a new index version; the trainer switches to it between steps without pausing.

    trainer                                  builder (`realm index refresh --watch SNAPSHOTS ...`)
    every N steps: snapshots/step-000500/ -> sees a snapshot newer than its index, embeds, publishes v7
    between steps: CURRENT says v7        <- (atomic CURRENT switch)
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from realm.config import EmbedConfig, IndexConfig, RetrieverConfig
from realm.data.blocks import BlockStore
from realm.index.embed import BlockEmbedder
from realm.index.mips import IndexMeta, build_index, current_version
from realm.models.retriever import Retriever

log = logging.getLogger(__name__)

SNAPSHOT_INFO = "snapshot.json"
STOP_FILE = "STOP"


@dataclass(frozen=True)
class RefreshPolicy:
    """When the trainer snapshots, when the builder rebuilds, when the trainer reloads. every_steps=0: frozen.
    No snapshots up to `start_step` (the retriever is not training yet, so the index would not change)."""

    every_steps: int
    start_step: int = 0

    @property
    def frozen(self) -> bool:
        return self.every_steps <= 0

    def should_snapshot(self, step: int) -> bool:
        return not self.frozen and step > self.start_step and step % self.every_steps == 0

    def should_rebuild(self, newest_snapshot_step: int | None, index_step: int | None) -> bool:
        """Rebuild when a snapshot newer than the one behind the current index exists."""
        if self.frozen or newest_snapshot_step is None:
            return False
        return index_step is None or newest_snapshot_step > index_step

    def should_reload(self, loaded_version: int | None, published_version: int | None) -> bool:
        return published_version is not None and published_version != loaded_version


def save_snapshot(retriever: Retriever, snapshots_dir: Path, step: int, keep: int = 2) -> Path:
    """Publish the retriever at `step` (complete folders only: Retriever.save swaps them in atomically)."""
    folder = Path(snapshots_dir) / f"step-{step:08d}"
    retriever.save(folder)
    (folder / SNAPSHOT_INFO).write_text(json.dumps({"step": step, "time": time.time()}) + "\n")
    for old in list_snapshots(snapshots_dir)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return folder


def list_snapshots(snapshots_dir: Path) -> list[Path]:
    """Complete snapshots, oldest first (a snapshot is complete once its snapshot.json exists)."""
    folder = Path(snapshots_dir)
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.glob("step-*") if p.is_dir() and (p / SNAPSHOT_INFO).exists())


def snapshot_info(folder: Path) -> dict:
    return json.loads((folder / SNAPSHOT_INFO).read_text())


def index_source_step(index_dir: Path) -> int | None:
    """Training step of the snapshot behind the live index (None: no index or not built from a snapshot)."""
    version = current_version(index_dir)
    if version is None:
        return None
    meta = json.loads((Path(index_dir) / "versions" / f"v{version:06d}" / "meta.json").read_text())
    return meta.get("checkpoint_step")


def build_from_retriever(retriever: Retriever, store: BlockStore, index_dir: Path, embed: EmbedConfig,
                         index: IndexConfig, step: int, snapshot_time: float, progress: bool = False) -> IndexMeta:
    embedder = BlockEmbedder(retriever.doc_tower, retriever.tokenizer, store.config, embed)
    return build_index(store, embedder, retriever.doc_fingerprint(), index_dir, embed, index, retriever.config,
                       progress=progress, checkpoint_step=step, checkpoint_time=snapshot_time)


def refresh_loop(watch: Path, corpus: Path, index_dir: Path, embed: EmbedConfig, index: IndexConfig,
                 retriever_config: RetrieverConfig, policy: RefreshPolicy, poll_seconds: float = 2.0,
                 max_builds: int | None = None, exit_with_parent: bool = False) -> int:
    """Rebuild the index whenever a newer snapshot appears; stop when `watch/STOP` exists (or, with
    `exit_with_parent`, when the trainer that started us is gone, even after a kill -9). Returns builds done."""
    store = BlockStore(corpus)
    builds = 0
    parent = os.getppid()
    while not (Path(watch) / STOP_FILE).exists() and (max_builds is None or builds < max_builds):
        if exit_with_parent and os.getppid() != parent:
            log.info("the trainer exited; the index builder stops too")
            break
        snapshots = list_snapshots(watch)
        newest = snapshots[-1] if snapshots else None
        newest_step = snapshot_info(newest)["step"] if newest else None
        if not policy.should_rebuild(newest_step, index_source_step(index_dir)):
            time.sleep(poll_seconds)
            continue
        started = time.monotonic()
        try:
            retriever = Retriever.load(str(newest), retriever_config)
        except (FileNotFoundError, OSError, ValueError) as err:  # pruned by the trainer while we read it
            log.warning("snapshot %s vanished while loading (%s); retrying", newest, err)
            continue
        meta = build_from_retriever(retriever, store, index_dir, embed, index, newest_step,
                                    snapshot_info(newest)["time"])
        builds += 1
        log.info("published index v%d from snapshot step %d in %.0fs", meta.version, newest_step,
                 time.monotonic() - started)
    return builds
