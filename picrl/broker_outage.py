"""A few clear log lines for a Kafka broker outage instead of aiokafka's flood.

While a broker is away, every aiokafka client of a process (a worker has a dozen: consumer, producers per
partition, admin) logs each failed connect, metadata refresh, fetch and coordinator lookup: thousands of
lines a minute (5,000 in a 22 s outage in the chaos test), burying everything else. This filter, on the log
handler, lets the first such error through as "broker X unreachable since T", then only a count every
:data:`SUMMARY_EVERY` seconds, and says when the broker answered again (with the next line logged after its
errors stopped for :data:`QUIET` seconds)."""

from __future__ import annotations

import logging
import re
import threading
import time

SUMMARY_EVERY = 30.0  # seconds between "still unreachable" lines
QUIET = 10.0  # seconds without a connection error after which the outage counts as over
# what aiokafka logs when it cannot reach a broker (not "coordinator not available", which a healthy broker
# also answers while a group's coordinator loads)
_CONNECTION_ERRORS = (
    "Unable connect to",
    "Unable to update metadata",
    "Failed fetch messages",
    "NodeNotReadyError",
    "KafkaConnectionError",
    "Error sending HeartbeatRequest",
    "Error sending LeaveGroupRequest",
)
_ADDRESS = re.compile(r"\('([^']+)', (\d+)\)|Connection at (\S+:\d+)")


def _clock(seconds: float) -> str:
    return time.strftime("%H:%M:%SZ", time.gmtime(seconds))


class BrokerOutageFilter(logging.Filter):
    """Collapses aiokafka's connection errors into an outage's first line, periodic counts and its end."""

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self._broker = "the Kafka broker"
        self._since: float | None = None  # wall time of the outage's first error (None: no outage)
        self._last_error = 0.0  # monotonic
        self._last_summary = 0.0  # monotonic
        self._errors = 0  # errors suppressed since the last line

    def filter(self, record: logging.LogRecord) -> bool:
        with self._lock:
            now = time.monotonic()
            ended = self._end(now) if self._since is not None and now - self._last_error > QUIET else None
            keep = True
            if record.name.startswith("aiokafka") and any(text in record.getMessage() for text in _CONNECTION_ERRORS):
                self._last_error = now
                if self._since is None:
                    self._begin(record, now)
                else:
                    self._errors += 1
                    keep = now - self._last_summary >= SUMMARY_EVERY
                    if keep:
                        self._rewrite(
                            record,
                            logging.WARNING,
                            f"{self._broker} still unreachable since {_clock(self._since)}: {self._errors} "
                            f"connection errors in the last {now - self._last_summary:.0f} s",
                        )
                        self._errors, self._last_summary = 0, now
            if ended is not None:  # said ahead of the first line logged after the errors stopped
                record.msg, record.args = f"{ended}. {record.getMessage()}", None
            return keep

    def _begin(self, record: logging.LogRecord, now: float) -> None:
        match = _ADDRESS.search(record.getMessage())
        if match:
            self._broker = "Kafka broker " + (match.group(3) or f"{match.group(1)}:{match.group(2)}")
        self._since, self._last_summary, self._errors = time.time(), now, 0
        self._rewrite(
            record,
            logging.ERROR,
            f"{self._broker} unreachable since {_clock(self._since)} "
            f"({record.getMessage()}); further connection errors are counted, "
            f"not logged, until it answers",
        )

    def _end(self, now: float) -> str:
        """The line that closes the outage (its errors stopped ``QUIET`` seconds ago or more)."""
        assert self._since is not None
        back = time.time() - (now - self._last_error)
        line = (
            f"{self._broker} answered again after {back - self._since:.0f} s (unreachable from "
            f"{_clock(self._since)} to about {_clock(back)})"
        )
        self._since = None
        return line

    @staticmethod
    def _rewrite(record: logging.LogRecord, level: int, message: str) -> None:
        record.msg, record.args, record.exc_info, record.exc_text = message, None, None, None
        record.levelno, record.levelname = level, logging.getLevelName(level)
