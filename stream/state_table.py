"""The worker's service-state table: a Faust table whose changelog writes a batch can wait for."""
from __future__ import annotations

import asyncio
from typing import Any

import faust
from faust.types import FutureMessage
from faust.types.codecs import CodecArg


class ServiceStateTable(faust.Table):
    """A :class:`faust.Table` that keeps the futures of its changelog writes until
    :meth:`changelog_written` is awaited.

    Faust hands table writes to a producer buffer that a background task drains. Under exactly_once a
    commit does not drain that buffer first, so a transaction could commit a batch's input offsets while
    some of the batch's changelog records still waited there; they went into the next transaction,
    which a stop or a crash never committed. A worker taking over then restored rows without those
    events and, their offsets being committed, never saw them again (its decisions drifted from an
    uninterrupted run's; tests/stream/test_reliability.py). Waiting for the writes before a batch is
    acknowledged puts them in the transaction that commits its offsets."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._unwritten: list[FutureMessage] = []

    def send_changelog(self, partition: int | None, key: Any, value: Any, key_serializer: CodecArg = None,
                       value_serializer: CodecArg = None) -> FutureMessage:
        future = super().send_changelog(partition, key, value, key_serializer, value_serializer)
        self._unwritten.append(future)
        return future

    async def changelog_written(self) -> None:
        """Wait until every row set since the last call is delivered to its changelog partition."""
        unwritten, self._unwritten = self._unwritten, []
        await asyncio.gather(*unwritten)
