"""How the worker batches (issue 17): a lone event is decided at once, not held for a batch window."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from stream.records import UsageEvent, decode_action
from stream.topics import TopicNames, ensure_topics, topic_specs
from tests.stream.conftest import WINDOW
from tests.support.kafka import unique
from tests.support.processes import picrl_process, tail, worker_args

BATCH_WITHIN = 5.0  # seconds; take_events would hold each lone event until its timer fired (2.5 s on average)


async def _lone_events(bootstrap: str, names: TopicNames, lone: int) -> list[tuple[float, float]]:
    """Warm one service up, then send ``lone`` events one at a time, each once the previous one's action is
    visible to a read_committed consumer; (decided - produced, visible - produced) seconds of each."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    consumer = AIOKafkaConsumer(
        names.actions,
        bootstrap_servers=bootstrap,
        isolation_level="read_committed",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    await producer.start()
    await consumer.start()
    seen: list[tuple[float, float]] = []
    try:

        async def send(tick: int) -> None:
            event = UsageEvent("svc", tick, 30.0 + tick % 5, False, 60.0, None, time.time())
            await producer.send_and_wait(names.usage, event.to_bytes(), key=b"svc")

        async def action_for(tick: int) -> tuple[float, float]:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                for messages in (await consumer.getmany(timeout_ms=200)).values():
                    for message in messages:
                        action = decode_action(message.value)
                        if action.tick == tick + 1:
                            return (
                                action.decided_at - action.source_produced_at,
                                time.time() - action.source_produced_at,
                            )
            raise TimeoutError(f"no action for tick {tick}")

        for tick in range(WINDOW):
            await send(tick)
        await action_for(WINDOW - 1)
        for tick in range(WINDOW, WINDOW + lone):
            await send(tick)
            seen.append(await action_for(tick))
    finally:
        await consumer.stop()
        await producer.stop()
    return seen


def test_a_lone_event_is_decided_without_waiting_for_a_batch_window(
    kafka_bootstrap: str, tiny_model_dir: Path, tmp_path: Path
) -> None:
    prefix = unique("lone")
    names = TopicNames(prefix)
    asyncio.run(ensure_topics(kafka_bootstrap, topic_specs(prefix, 2)))
    log = tmp_path / "worker.log"
    args = worker_args(tiny_model_dir, kafka_bootstrap, prefix, "--batch-within", str(BATCH_WITHIN), partitions=2)
    with picrl_process(args, log) as worker:
        seen = asyncio.run(_lone_events(kafka_bootstrap, names, 5))
        assert worker.poll() is None, f"the worker exited:\n{tail(log)}"
    decided = [d for d, _ in seen]
    visible = [v for _, v in seen]
    # each lone event is decided as soon as it is fetched; generous bounds for a loaded 2-core machine
    assert max(decided) < 1.0, (decided, tail(log))
    assert max(visible) < 2.0, (visible, tail(log))
