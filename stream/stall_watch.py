"""Stalled usage partitions: records waiting and nothing committed for a while.

A healthy worker commits its usage partitions every ``commit_interval`` while they have records to decide. A
partition assigned to it (and not held for missing state) whose end offset stays beyond the offset its group
committed, the committed offset unmoved for ``timeout`` seconds outside rebalances, has stalled: whatever
stopped it (a partition left paused, records the fetcher skipped so that Faust never commits the partition
again, a stream not resumed after a recovery), the worker rejoins its group, and the rebalance starts the
partition again from its committed offset: Faust seeks there, the restored rows are checked against it, and
the records are decided again (``RebalanceGuard.watch_partitions``)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field


@dataclass
class StallWatch:
    """Remembers, per usage partition with records waiting, the committed offset and when it was first seen
    there; :meth:`stalled` names the partitions that have stayed there ``timeout`` seconds."""

    timeout: float
    _since: dict[int, tuple[int, float]] = field(default_factory=dict)

    def stalled(
        self, watched: Iterable[int], committed: Mapping[int, int], ends: Mapping[int, int], now: float
    ) -> list[int]:
        """The partitions among ``watched`` whose committed offset has stayed below their end offset, unmoved,
        for ``timeout`` seconds up to ``now`` (``committed`` and ``ends`` by partition; none committed: 0)."""
        since: dict[int, tuple[int, float]] = {}
        for p in sorted(watched):
            done = committed.get(p, 0)
            if ends.get(p, 0) <= done:
                continue  # nothing waiting
            previous = self._since.get(p)
            since[p] = previous if previous is not None and previous[0] == done else (done, now)
        self._since = since
        return [p for p, (_, first) in since.items() if now - first >= self.timeout]

    def reset(self) -> None:
        """Forget every partition (a rebalance is under way or was just asked for)."""
        self._since = {}
