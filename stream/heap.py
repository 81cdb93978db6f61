"""Python's full garbage collections, kept off what a worker holds for its life."""

from __future__ import annotations

import gc


async def freeze_heap(*_: object, **__: object) -> None:
    """Take what the worker holds after a rebalance out of Python's full garbage collections (connected to the
    app's ``on_rebalance_complete``).

    A full collection walks every container object the process holds: here some 235,000 (Faust, aiokafka,
    torch, the model), all alive for as long as the worker runs, and it took 120-160 ms, during which
    nothing is decided (the p99 latency was these stalls). Frozen (``gc.freeze``), they are left out of
    every later collection, which then walks what the decisions create (~6 ms). Each rebalance first
    thaws and collects everything once, so cyclic garbage among what was frozen before is freed, not kept."""
    gc.unfreeze()
    gc.collect()
    gc.freeze()
