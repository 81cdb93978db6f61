"""What each handled batch leaves behind besides its records: the worker's metrics, its recent decisions per
service (for ``GET /services/<id>``) and the logs of range changes, dead letters and skipped ticks."""

from __future__ import annotations

import logging
import math
import time
from collections import Counter, OrderedDict, deque
from collections.abc import Callable, Collection, Iterable, Sequence

from faust.types import TP, EventT

from stream.decisions import BadValue, BatchOutcome, Incoming
from stream.intake import Letter
from stream.metrics import WorkerMetrics
from stream.records import Action, ResourceAction

log = logging.getLogger("picrl.worker")

RECENT_DECISIONS = 10  # last decisions kept per service for /services/<id>
RECENT_SERVICES = 10_000  # services whose recent decisions are kept (least recently seen dropped)
MISSED_LOG_EVERY = 60.0  # seconds between two log lines about skipped ticks (the metric counts every one)


class BatchObserver:
    """The metrics (:class:`WorkerMetrics`, of the usage partitions ``held_partitions`` returns; ``capacity_gauge``
    > 0: with each service's decided capacity, for up to that many services) and recent decisions of one worker,
    updated from each batch it has sent."""

    def __init__(self, held_partitions: Callable[[], Collection[int]], capacity_gauge: int = 0) -> None:
        self.metrics = WorkerMetrics(held_partitions, capacity_gauge)
        self.recent: OrderedDict[str, deque[Action | ResourceAction]] = OrderedDict()
        self._missed_services = self._missed_ticks = 0  # skipped since the last line about them
        self._missed_logged_at = -math.inf

    def recent_of(self, service: str) -> Iterable[Action | ResourceAction]:
        """The last decisions for ``service``, oldest first (none when it was not seen lately)."""
        return self.recent.get(service, ())

    def observe(
        self,
        events: Sequence[EventT],
        incoming: list[Incoming | BadValue],
        outcome: BatchOutcome,
        letters: list[Letter],
        services: int,
        highwater: Callable[[TP], int | None],
    ) -> None:
        """Metrics, recent decisions and logs of one handled batch (``services``: how many the worker holds now;
        ``highwater``: a usage partition's end offset, if known)."""
        m = self.metrics
        m.events.inc(len(events))
        m.censored.inc(sum(isinstance(item, Incoming) and item.event.censored for item in incoming))
        m.transitions.inc(len(outcome.transitions))
        m.redelivered.inc(outcome.redelivered)
        m.services.set(services)
        partition_of = {item.service: item.partition for item in incoming}
        for action in outcome.actions:
            m.streaks.update(action.service, partition_of[action.service], action.censor_streak)
            if m.decided is not None:
                m.decided.update(action, partition_of[action.service])
            if action.source_produced_at > 0:
                m.latency.observe(max(0.0, action.decided_at - action.source_produced_at))
            self.remember(action)
        for phase, count in Counter(action.phase for action in outcome.actions).items():
            m.actions.labels(phase).inc(count)
        for event in events[-1:]:
            tp = event.message.tp
            end = highwater(tp)
            if end is not None:
                m.lag.labels(str(tp.partition)).set(max(0, end - event.message.offset - 1))
        for change in outcome.ranges:
            m.range_changes.labels(change.reason).inc()
            log.warning(
                "range of %s moved from [%.6g, %.6g] to [%.6g, %.6g] at tick %d (%s)",
                change.service,
                change.low,
                change.high,
                change.new_low,
                change.new_high,
                change.tick,
                change.reason,
                extra={"service": change.service, "tick": change.tick, "reason": change.reason},
            )
        if outcome.missed:
            self.missed(outcome.missed)
        for letter in letters:
            dead = letter.record
            m.dead_letters.labels(dead.reason).inc()
            context = {"reason": dead.reason, "partition": dead.partition, "offset": dead.offset}
            if letter.service is not None:
                context.update(service=letter.service, tick=letter.tick)
            log.warning(
                "dead letter (%s) from %s[%d]@%d: %s",
                dead.reason,
                dead.topic,
                dead.partition,
                dead.offset,
                dead.detail,
                extra=context,
            )

    def missed(self, missed: dict[str, tuple[int, int]]) -> None:
        """Count the ticks services skipped (``service: (tick expected, tick applied)``), and log them: at once
        the first time, then at most once every :data:`MISSED_LOG_EVERY` seconds, with the counts since."""
        ticks = sum(applied - expected for expected, applied in missed.values())
        self.metrics.missed_ticks.inc(ticks)
        self._missed_services += len(missed)
        self._missed_ticks += ticks
        now = time.monotonic()
        if now - self._missed_logged_at < MISSED_LOG_EVERY:
            return
        service, (expected, applied) = next(iter(missed.items()))
        log.warning(
            "ticks never came: %d service(s) reported a later tick than the one expected, %d tick(s) skipped in all "
            "(%s: tick %d, expected %d); decided on, each service's clock moved over its gap",
            self._missed_services,
            self._missed_ticks,
            service,
            applied,
            expected,
            extra={"service": service, "tick": applied},
        )
        self._missed_services = self._missed_ticks = 0
        self._missed_logged_at = now

    def remember(self, action: Action | ResourceAction) -> None:
        """Keep ``action`` among its service's last :data:`RECENT_DECISIONS`, for up to :data:`RECENT_SERVICES`
        services (the least recently seen dropped)."""
        history = self.recent.get(action.service)
        if history is None:
            history = self.recent[action.service] = deque(maxlen=RECENT_DECISIONS)
            if len(self.recent) > RECENT_SERVICES:
                self.recent.popitem(last=False)
        else:
            self.recent.move_to_end(action.service)
        history.append(action)
