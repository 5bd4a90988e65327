"""The micro-batcher under the service: batches form from what arrives together, results go to their callers,
and an exception reaches every caller of its batch without stopping the worker."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from realm.serve.batching import MicroBatcher


def test_concurrent_items_are_run_together_and_each_caller_gets_its_own_result():
    release = threading.Event()

    def run(items):
        release.wait(5)  # the first batch holds the worker while the others queue up
        return [item * 10 for item in items]

    batcher = MicroBatcher(run, max_batch=4, wait_s=0.05)
    with ThreadPoolExecutor(9) as pool:
        futures = [pool.submit(batcher.submit, n) for n in range(9)]
        threading.Timer(0.3, release.set).start()
        assert [f.result(timeout=10) for f in futures] == [n * 10 for n in range(9)]
    assert sum(size * count for size, count in batcher.batch_sizes.items()) == 9
    assert max(batcher.batch_sizes) == 4  # never more than max_batch
    batcher.close()


def test_an_exception_reaches_every_caller_of_its_batch_and_the_worker_goes_on():
    def run(items):
        if "bad" in items:
            raise ValueError("no")
        return items

    batcher = MicroBatcher(run, max_batch=8, wait_s=0.2)
    with ThreadPoolExecutor(2) as pool:
        futures = [pool.submit(batcher.submit, item) for item in ("bad", "good")]
        for future in futures:
            with pytest.raises(ValueError, match="no"):
                future.result(timeout=10)
    assert batcher.submit("fine") == "fine"
    batcher.close()


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="max_batch"):
        MicroBatcher(lambda items: items, max_batch=0, wait_s=0.0)
