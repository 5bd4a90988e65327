"""Batches built ahead of the step (training.Prefetched): the same items in the same order at any depth."""

from __future__ import annotations

import itertools
import threading

import pytest
import torch

from realm.training.data import PREFETCH_ENV, Prefetched, prefetch_depth


def _numbers(stop: int | None = None, fail_at: int | None = None):
    for n in itertools.count() if stop is None else range(stop):
        if n == fail_at:
            raise RuntimeError(f"broken item {n}")
        yield n


@pytest.mark.parametrize("depth", [0, 1, 3])
def test_every_item_comes_once_in_order_at_any_depth(depth):
    with Prefetched(_numbers(10), depth) as items:
        assert list(items) == list(range(10))
        with pytest.raises(StopIteration):  # an ended sequence stays ended
            next(items)


@pytest.mark.parametrize("depth", [0, 2])
def test_an_error_while_building_is_raised_at_the_item_it_stopped(depth):
    with Prefetched(_numbers(fail_at=4), depth) as items:
        assert [next(items) for _ in range(4)] == [0, 1, 2, 3]
        with pytest.raises(RuntimeError, match="broken item 4"):
            next(items)


def test_closing_stops_a_thread_waiting_on_a_full_queue():
    items = Prefetched(_numbers(), 2)  # endless: the thread fills the queue and waits
    assert next(items) == 0
    items.close()
    assert items.thread is not None and not items.thread.is_alive()
    assert not [t for t in threading.enumerate() if t.name == "realm-prefetch"]


def test_the_depth_comes_from_the_environment_or_the_device(monkeypatch):
    monkeypatch.delenv(PREFETCH_ENV, raising=False)
    assert prefetch_depth(torch.device("cuda")) == 2
    assert prefetch_depth(torch.device("cpu")) >= 0
    monkeypatch.setenv(PREFETCH_ENV, "0")
    assert prefetch_depth(torch.device("cuda")) == 0
    monkeypatch.setenv(PREFETCH_ENV, "two")
    with pytest.raises(ValueError, match="REALM_PREFETCH must be a whole number"):
        prefetch_depth(torch.device("cpu"))
