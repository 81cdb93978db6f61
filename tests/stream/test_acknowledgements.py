"""Under at_least_once a batch's events are acknowledged once its records are delivered, in batch order."""

from __future__ import annotations

import asyncio

from picrl_core.artifact import ModelArtifact
from stream.worker import StreamWorker, WorkerSettings


class _Event:
    """What acknowledging touches of a Faust event: ``ack()``."""

    def __init__(self, name: str, acked: list[str]) -> None:
        self.name, self.acked = name, acked

    def ack(self) -> bool:
        self.acked.append(self.name)
        return True


def test_a_batch_delivered_first_waits_for_the_batch_before_it(tiny_artifact: ModelArtifact) -> None:
    worker = StreamWorker(
        WorkerSettings(bootstrap="127.0.0.1:9", app_id="ack-worker", guarantee="at_least_once"), tiny_artifact
    )

    async def run() -> list[str]:
        acked: list[str] = []
        loop = asyncio.get_running_loop()
        first, second = loop.create_future(), loop.create_future()
        a = asyncio.ensure_future(
            worker._acknowledge_delivered([_Event("a1", acked), _Event("a2", acked)], [first], None)
        )
        b = asyncio.ensure_future(worker._acknowledge_delivered([_Event("b1", acked)], [second], a))
        second.set_result(None)  # the later batch is delivered first...
        await asyncio.sleep(0.01)
        assert acked == []  # ...and waits: Faust would commit past the earlier batch's unacknowledged offset
        first.set_result(None)
        await asyncio.gather(a, b)
        return acked

    assert asyncio.run(run()) == ["a1", "a2", "b1"]
