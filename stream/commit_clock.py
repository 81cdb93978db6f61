"""The worker's commits: between batches, never within one, each as soon as the previous one has ended.

Faust commits on a timer of its own, and under exactly_once a commit ends the open transaction: one landing
mid-batch would commit part of the batch's actions and rows with the previous batch's offsets, and a crash
before the next commit would decide the rest again on rows that already hold some of it. So Faust's timer is
off (``stream.worker.FAUST_COMMITS_OFF``), a batch is sent under :attr:`CommitClock.batch` and each commit
takes that lock too. (Faust still commits itself on rebalance and shutdown, after the streams have acked their
events.)

Self-clocked rather than on a timer: a commit takes longer the busier the worker is (its round trips to the
transaction coordinator wait for the batches decided meanwhile: 0.3-1.5 s on a loaded host), and a timer with a
send queue of 4 batches capped the events per commit at 4 batches, so a backlog, once formed, stayed (1.1 s
behind at 30% of the raw pipe's events/s, docs/performance.md). Here what was decided during one commit goes
into the next.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable


class CommitClock:
    """Runs ``commit`` once events were acknowledged (:meth:`handled`) since the last commit began, at most once
    per ``interval`` seconds, and never while a batch holds :attr:`batch`."""

    def __init__(self, commit: Callable[[], Awaitable[object]], interval: float) -> None:
        self._commit = commit
        self.interval = interval
        self.batch = asyncio.Lock()  # held while a batch is sent, and while offsets commit
        self._handled = asyncio.Event()  # set when events were acknowledged since the last commit began

    def handled(self) -> None:
        """Events were acknowledged: the next commit covers them."""
        self._handled.set()

    async def run(self) -> None:
        """Commit the offsets of the batches handled so far, for as long as the worker runs."""
        loop = asyncio.get_running_loop()
        while True:
            await self._handled.wait()
            self._handled.clear()
            began = loop.time()
            async with self.batch:
                await self._commit()  # a failed transaction rejoins the group (HoldingConsumer)
            await asyncio.sleep(self.interval - (loop.time() - began))
