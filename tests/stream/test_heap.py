"""After a rebalance the worker's long-lived objects are out of Python's full garbage collections."""

from __future__ import annotations

import asyncio
import gc
import weakref

from picrl_core.artifact import ModelArtifact
from stream.heap import freeze_heap
from stream.worker import StreamWorker, WorkerSettings


class _Node:
    def __init__(self) -> None:
        self.me = self  # a reference cycle: only the garbage collector frees it


def test_a_rebalance_freezes_what_the_worker_holds_and_frees_cycles_frozen_before(tiny_artifact: ModelArtifact) -> None:
    worker = StreamWorker(WorkerSettings(bootstrap="127.0.0.1:9", app_id="heap-worker"), tiny_artifact)
    node = _Node()
    alive = weakref.ref(node)
    try:
        asyncio.run(freeze_heap(worker.app))
        assert gc.get_freeze_count() > 10_000  # the worker's modules, app and model
        del node  # garbage now, but frozen: no collection frees it...
        gc.collect()
        assert alive() is not None
        asyncio.run(freeze_heap(worker.app))  # ...until the next rebalance thaws and collects
        assert alive() is None
    finally:
        gc.unfreeze()
