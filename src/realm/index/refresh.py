"""Asynchronous MIPS refresh, as in the paper: the trainer publishes retriever snapshots, an index builder
(another process, possibly another machine on a shared filesystem) re-embeds the corpus with the newest
one and publishes a new index version; the trainer switches to it between steps without pausing.

    trainer                                  builder (`python -m realm.index.refresh --config builder.json ...`)
    every N steps: snapshots/step-000500/ -> sees a snapshot newer than its index, embeds, publishes v7
    between steps: CURRENT says v7        <- (atomic CURRENT switch)

The builder receives the trainer's exact embed/index settings as JSON (`BuilderConfig`, saved as
`<run>/builder.json`), so every version in the index folder is built the way the first one was.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from realm.common.io import write_json_atomic
from realm.config import EmbedConfig, IndexConfig, RetrieverConfig
from realm.data.blocks import BlockStore
from realm.index.build import build_from_retriever
from realm.index.builder_flags import builder_arguments
from realm.index.mips import BUILDING, current_version, read_meta
from realm.models.retriever import Retriever
from realm.training.distributed import ONE_PROCESS, Dist, broadcast, on_every_rank, setup_distributed

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


@dataclass(frozen=True)
class BuilderConfig:
    """Everything the index builder needs, as the trainer resolved it: how to embed, which index to build,
    the retriever settings, and how often the trainer snapshots (0: never rebuild)."""

    embed: EmbedConfig
    index: IndexConfig
    retriever: RetrieverConfig
    refresh_every: int

    def save(self, path: Path) -> None:
        write_json_atomic(Path(path), asdict(self))

    @classmethod
    def load(cls, path: Path) -> BuilderConfig:
        data = json.loads(Path(path).read_text())
        return cls(
            EmbedConfig(**data["embed"]),
            IndexConfig(**data["index"]),
            RetrieverConfig.from_dict(data["retriever"]),
            data["refresh_every"],
        )


TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT")


def start_builder(run_dir: Path, corpus: Path, nice: int = 0) -> subprocess.Popen:
    """The builder as its own process, on one core, following `run_dir/snapshots` into `run_dir/index` with
    run_dir/builder.json; it logs to run_dir/builder.log and exits with the process that started it."""
    cmd = [sys.executable, "-m", "realm.index.refresh", "--config", str(run_dir / "builder.json")]
    cmd += ["--watch", str(run_dir / "snapshots"), "--corpus", str(corpus), "--out", str(run_dir / "index")]
    cmd += ["--threads", "1", "--parent-pid", str(os.getpid()), "--nice", str(nice)]
    env = {k: v for k, v in os.environ.items() if k not in TORCHRUN_ENV}  # one process, not a rank of the trainer's
    with open(run_dir / "builder.log", "a") as handle:
        return subprocess.Popen(cmd, stdout=handle, stderr=subprocess.STDOUT, env=env)


class IndexBuilder:
    """The trainer's side of the builder: started beside it (`local`: its own process, logging to
    run_dir/builder.log, exiting with the trainer) or left to the user (`external`: run_dir/builder.json is what
    `realm index refresh --config` reads), watched while training runs, told to stop when it ends."""

    def __init__(self, run_dir: Path, corpus: Path, config: BuilderConfig, where: str = "local", nice: int = 0):
        self.run_dir, self.corpus, self.config, self.where, self.nice = run_dir, corpus, config, where, nice
        self.process: subprocess.Popen | None = None
        self.started, self.warned = False, False
        self.threads = 0  # the trainer's torch threads, given back when the builder stops
        (run_dir / "snapshots" / STOP_FILE).unlink(missing_ok=True)  # left by an earlier run's clean exit

    def start(self) -> None:
        self.started, self.threads = True, torch.get_num_threads()
        self.config.save(self.run_dir / "builder.json")
        if self.where == "local":
            self.process = start_builder(self.run_dir, self.corpus, self.nice)
        else:
            log.info("external builder: start `realm index refresh --config %s/builder.json ...`", self.run_dir)

    def alive(self, index_version: int | None) -> bool:
        """Whether the local builder still runs (an external one: assumed); warns once when it has exited."""
        if self.process is None or self.process.poll() is None:
            return True
        if not self.warned:
            log.warning(
                "index builder exited (code %s); training continues on index v%s, see %s",
                self.process.returncode,
                index_version,
                self.run_dir / "builder.log",
            )
            self.warned = True
        return False

    def share_cores(self, device: torch.device) -> None:
        """Between steps, on a CPU: a core for the local builder while it re-embeds the corpus (share_cores)."""
        if self.process is not None and device.type == "cpu":
            share_cores(self.run_dir / "index", self.threads)

    def stop(self, finished: bool) -> None:
        """Training is over (`finished`) or interrupted: a local builder stops with it; an external one is told to
        stop (the STOP file) only when training finished, a resumed trainer may still need it otherwise."""
        if not self.started or (self.process is None and not finished):
            return
        if self.process is not None:
            torch.set_num_threads(self.threads)
        (self.run_dir / "snapshots").mkdir(parents=True, exist_ok=True)
        (self.run_dir / "snapshots" / STOP_FILE).touch()
        if self.process is not None:
            self.process.terminate()
            self.process.wait(timeout=30)


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
    return read_meta(index_dir, version).checkpoint_step


def _due(watch: Path, index_dir: Path, policy: RefreshPolicy, parent_pid: int | None) -> tuple[str, dict]:
    """What the builder should do now: ("stop", {}), ("wait", {}) or ("build", the newest snapshot's info + path)."""
    if (Path(watch) / STOP_FILE).exists():
        return "stop", {}
    if parent_pid is not None and os.getppid() != parent_pid:
        log.info("the trainer exited; the index builder stops too")
        return "stop", {}
    snapshots = list_snapshots(watch)
    if not snapshots:
        return "wait", {}
    info = snapshot_info(snapshots[-1])
    if not policy.should_rebuild(info["step"], index_source_step(index_dir)):
        return "wait", {}
    return "build", {**info, "path": str(snapshots[-1])}


def refresh_loop(
    watch: Path,
    corpus: Path,
    index_dir: Path,
    config: BuilderConfig,
    poll_seconds: float = 2.0,
    max_builds: int | None = None,
    parent_pid: int | None = None,
    d: Dist = ONE_PROCESS,
) -> int:
    """Rebuild the index whenever a newer snapshot appears; stop when `watch/STOP` exists, or when process
    `parent_pid` (the trainer that started us) is no longer our parent: it was killed, even by kill -9. The pid
    is given, not read at start: the trainer may die while we still import torch. Under torchrun rank 0 decides
    and every rank embeds its share of each build. Returns builds done."""
    store = BlockStore(corpus)
    policy = RefreshPolicy(config.refresh_every)
    builds = 0
    while max_builds is None or builds < max_builds:
        action, snapshot = broadcast(_due(watch, index_dir, policy, parent_pid) if d.main else None, d)
        if action == "stop":
            break
        if action == "wait":
            time.sleep(poll_seconds)
            continue
        started = time.monotonic()
        try:
            retriever = Retriever.load(snapshot["path"], config.retriever)
            loaded = True
        except (FileNotFoundError, OSError, ValueError) as err:  # pruned by the trainer while we read it
            log.warning("snapshot %s vanished while loading (%s); retrying", snapshot["path"], err)
            loaded = False
        if not on_every_rank(loaded, d):
            continue
        meta = build_from_retriever(
            retriever,
            store,
            index_dir,
            config.embed,
            config.index,
            snapshot["step"],
            snapshot["time"],
            replace_model=True,  # the towers of a training run change by design
            d=d,
        )
        builds += 1
        log.info(
            "published index v%d from snapshot step %d in %.0fs",
            meta.version,
            snapshot["step"],
            time.monotonic() - started,
        )
    return builds


def share_cores(index_dir: Path, threads: int) -> None:
    """While the local builder re-embeds the corpus (index/building/ exists), the trainer leaves it a core. On 2
    cores, trainer and builder threads contending for both ran the trainer at 0.35x of its frozen-index speed,
    one core each at 0.58x (benchmarks/refresh_overhead.py); between rebuilds the trainer has every core."""
    wanted = max(1, threads - 1) if (index_dir / BUILDING).exists() else threads
    if torch.get_num_threads() != wanted:
        torch.set_num_threads(wanted)


def run_builder(args: argparse.Namespace) -> int:
    """The builder loop, as one process or as a torchrun job whose ranks share each build."""
    d = setup_distributed()
    if args.threads:
        torch.set_num_threads(args.threads)
    os.nice(args.nice)
    builds = refresh_loop(
        Path(args.watch),
        Path(args.corpus),
        Path(args.out),
        BuilderConfig.load(Path(args.config)),
        args.poll_seconds,
        args.max_builds,
        args.parent_pid,
        d,
    )
    if d.main:
        print(f"index refresh: {builds} versions published to {args.out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """`python -m realm.index.refresh`: the builder alone (started by the trainer, or on another machine)."""
    parser = argparse.ArgumentParser(prog="python -m realm.index.refresh", description=__doc__.split("\n")[0])
    builder_arguments(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.WARNING if args.quiet else logging.INFO, format="%(levelname)s %(name)s: %(message)s"
    )
    return run_builder(args)


if __name__ == "__main__":
    sys.exit(main())
