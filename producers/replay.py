"""Open-loop telemetry replay: usage events as a cluster running on static allocations would send them.

Service ``j`` runs on a fixed capacity of ``capacity_headroom`` times its peak demand; each tick it
reports ``min(d, capacity)`` and whether demand exceeded it (below 1.0 the peaks are censored).
Events go out tick by tick, all services per tick, paced to ``rate`` events per second.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import numpy as np
from aiokafka import AIOKafkaProducer

from producers.workload import Workload
from stream.records import UsageEvent
from stream.topics import TopicNames


async def replay_usage(
    bootstrap: str,
    topics: TopicNames,
    workload: Workload,
    *,
    rate: float,
    capacity_headroom: float = 1.0,
    start_tick: int = 0,
    on_tick: Callable[[int], None] | None = None,
) -> int:
    """Send every tick of ``workload`` to the usage topic; returns the number of events sent."""
    if rate <= 0:
        raise ValueError(f"--rate must be > 0 events per second; got {rate}")
    if capacity_headroom <= 0:
        raise ValueError(f"capacity headroom must be > 0; got {capacity_headroom}")
    capacity = workload.demand.max(axis=0) * capacity_headroom
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=True, linger_ms=5)
    await producer.start()
    sent = 0
    started = time.monotonic()
    try:
        for t in range(workload.ticks):
            demand = workload.demand[t]
            usage, censored = np.minimum(demand, capacity), demand > capacity
            now = time.time()
            for j, service in enumerate(workload.services):
                context = (
                    None
                    if workload.context is None
                    else dict(zip(workload.context_names, workload.context[t, j].tolist()))
                )
                event = UsageEvent(
                    service, start_tick + t, float(usage[j]), bool(censored[j]), float(capacity[j]), context, now
                )
                await producer.send(topics.usage, event.to_bytes(), key=service.encode())
                sent += 1
                ahead = sent / rate - (time.monotonic() - started)
                if ahead > 0.01:
                    await asyncio.sleep(ahead)
            if on_tick is not None:
                on_tick(t)
        await producer.flush()
    finally:
        await producer.stop()
    return sent
