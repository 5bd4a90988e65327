"""The order a trainer reads its examples in, reproducible from a position alone (so a resumed run sees exactly the
batches an uninterrupted one would), and batches built ahead of the step in a background thread."""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Generic, TypeVar

import numpy as np
import torch

from realm.training.distributed import Dist


@dataclass
class DataPosition:
    epoch: int = 0
    offset: int = 0


class DataOrder:
    """Epoch-wise permutations of n examples, seeded by (seed, epoch): reproducible from a position alone."""

    def __init__(self, n: int, seed: int):
        if n == 0:
            raise ValueError("no training examples")
        self.n, self.seed = n, seed
        self._cache: tuple[int, np.ndarray] | None = None

    def _perm(self, epoch: int) -> np.ndarray:
        if self._cache is None or self._cache[0] != epoch:
            self._cache = (epoch, np.random.default_rng([self.seed, epoch]).permutation(self.n))
        return self._cache[1]

    def take(self, position: DataPosition, size: int) -> tuple[np.ndarray, DataPosition]:
        """The next `size` example indices (crossing epochs as needed) and the position after them."""
        out: list[int] = []
        epoch, offset = position.epoch, position.offset
        while len(out) < size:
            perm = self._perm(epoch)
            chunk = perm[offset : offset + size - len(out)]
            out.extend(chunk.tolist())
            offset += len(chunk)
            if offset >= self.n:
                epoch, offset = epoch + 1, 0
        return np.array(out, dtype=np.int64), DataPosition(epoch, offset)

    def batches(self, position: DataPosition, size: int, d: Dist) -> Iterator[tuple[DataPosition, int, np.ndarray]]:
        """Endless batches from `position` on: the position after each, its epoch and this rank's share of it."""
        while True:
            epoch = position.epoch
            indices, position = self.take(position, size)
            yield position, epoch, indices[d.rank :: d.world_size]


def example_rng(seed: int, epoch: int, index: int) -> np.random.Generator:
    """Randomness of one example in one epoch (masks, ICT sentence choice): independent of batching and ranks."""
    return np.random.default_rng([seed, epoch, index])


PREFETCH_ENV = "REALM_PREFETCH"  # batches built ahead of the step (0: none); default `prefetch_depth`
T = TypeVar("T")


def prefetch_depth(device: torch.device) -> int:
    """How many batches (their model-independent part) are built ahead of the step, in a background thread:
    $REALM_PREFETCH, else 2 on a GPU, whose steps would otherwise wait on the host, and 1 on a CPU (measured on 2 cores:
    docs/log/2026-11-28-benchmarks-batches-built-ahead-issue-61.md)."""
    value = os.environ.get(PREFETCH_ENV, "").strip()
    if not value:
        return 2 if device.type == "cuda" else 1
    if not value.isdigit():
        raise ValueError(f"${PREFETCH_ENV} must be a whole number of batches (0: none), not {value!r}")
    return int(value)


class _Failed:
    def __init__(self, error: BaseException):
        self.error = error


_END = object()


class Prefetched(Generic[T]):
    """The items of `items`, in their order, each built up to `depth` ahead in a background thread (0: built when
    asked, in the caller's thread). The items must not depend on what the caller does between them (the model's
    weights): then the sequence is the same at any depth, and a resumed run that restarts `items` from its
    checkpoint's data position sees what an uninterrupted one would. What the thread uses (a tokenizer: Hugging
    Face's fast tokenizers are not safe to share between threads) must be its own. An error in the thread is
    raised in the caller at the item it stopped; `close` (or leaving the `with`) stops the thread."""

    def __init__(self, items: Iterator[T], depth: int):
        self.items, self.depth = items, depth
        self.stopping = threading.Event()
        self.built: queue.Queue = queue.Queue(maxsize=max(1, depth))
        self.thread: threading.Thread | None = None
        if depth > 0:
            self.thread = threading.Thread(target=self._build, name="realm-prefetch", daemon=True)
            self.thread.start()

    def _put(self, item: object) -> bool:
        while not self.stopping.is_set():
            try:
                self.built.put(item, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def _build(self) -> None:
        try:
            for item in self.items:
                if not self._put(item):
                    return
            self._put(_END)
        except BaseException as error:  # handed to the caller, who raises it
            self._put(_Failed(error))

    def __iter__(self) -> Prefetched[T]:
        return self

    def __next__(self) -> T:
        if self.thread is None:
            return next(self.items)
        item = self.built.get()
        if isinstance(item, _Failed):
            raise item.error
        if item is _END:
            self.built.put(_END)  # every later call ends too
            raise StopIteration
        return item

    def close(self) -> None:
        self.stopping.set()
        if self.thread is not None:
            self.thread.join()

    def __enter__(self) -> Prefetched[T]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
