"""Micro-batching: concurrent requests gathered for a few milliseconds and answered by one batched call.

The reader's cost per question falls with the batch (its matmuls are larger, the per-call work is shared), so
eight clients answered eight at a time get several times the throughput of one at a time. One worker thread
runs every batch, so inference is never interleaved; callers block on their own future.

    submit(item) --> queue --> worker: first item, then whatever arrives within `wait_s`, up to `max_batch`
                                       --> run(items) --> each caller gets its own result (or the exception)
"""

from __future__ import annotations

import queue
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Generic, TypeVar

Item = TypeVar("Item")
Result = TypeVar("Result")


class MicroBatcher(Generic[Item, Result]):
    """`run` maps a batch of items to their results, in order. The queue holds at most the requests in flight
    (bounded by the service), so memory stays flat."""

    def __init__(self, run: Callable[[Sequence[Item]], Sequence[Result]], max_batch: int, wait_s: float):
        if max_batch < 1 or wait_s < 0:
            raise ValueError(f"max_batch must be >= 1 and wait_s >= 0, got {max_batch} and {wait_s}")
        self.run = run
        self.max_batch = max_batch
        self.wait_s = wait_s
        self.batch_sizes: Counter[int] = Counter()  # batch size -> batches run (at most max_batch keys)
        self._queue: queue.SimpleQueue[tuple[Item, Future] | None] = queue.SimpleQueue()
        self._worker = threading.Thread(target=self._serve, name="realm-batcher", daemon=True)
        self._worker.start()

    def submit(self, item: Item) -> Result:
        """Blocks until the batch holding `item` has run; raises what `run` raised."""
        future: Future = Future()
        self._queue.put((item, future))
        return future.result()

    def close(self) -> None:
        self._queue.put(None)
        self._worker.join()

    def _gather(self, first: tuple[Item, Future]) -> list[tuple[Item, Future]]:
        batch = [first]
        deadline = time.monotonic() + self.wait_s
        while len(batch) < self.max_batch:
            try:
                entry = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                break
            if entry is None:  # closing: run what was gathered, then stop
                self._queue.put(None)
                break
            batch.append(entry)
        return batch

    def _serve(self) -> None:
        while (first := self._queue.get()) is not None:
            batch = self._gather(first)
            self.batch_sizes[len(batch)] += 1
            try:
                results = self.run([item for item, _ in batch])
            except Exception as err:  # every caller of the batch hears of it; the worker goes on
                for _, future in batch:
                    future.set_exception(err)
                continue
            for (_, future), result in zip(batch, results, strict=True):
                future.set_result(result)
