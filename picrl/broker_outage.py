"""One line per Kafka node outage instead of aiokafka's flood, and a recovery line only once the node answers.

While a node is away, every aiokafka client of a process (a worker has a dozen: consumer, producers per
partition, admin) logs each failed connect, fetch and metadata refresh: thousands of lines a minute (5,000 in a
22 s outage in the chaos test; ``picrl produce`` repeated "Unable connect to node with id 1" 144 times). This
filter, on the log handler, lets the first such error about a node through as "Kafka node N (HOST:PORT)
unreachable since T" and counts the others. The node's address is then asked for metadata every
:data:`PROBE_EVERY` seconds (a thread, :func:`picrl.kafka.probe.broker_count_or_zero`), and once it answers one
line says so, with the errors counted meanwhile: "Kafka node N (HOST:PORT) answered again after S s". Errors
about a node whose address no line gave, and retried produce errors (``NotEnoughReplicasError``: a partition
short of in-sync replicas, or a transaction the broker cannot verify yet, which is what it means on one node),
are logged once each and closed by a count once they have stopped for
:data:`QUIET` seconds, saying only that: whether a node answers is known only by asking it.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from picrl.kafka.probe import broker_count_or_zero

PROBE_EVERY = 1.0  # seconds between metadata requests to a node that is away
QUIET = 10.0  # seconds without an error after which errors that cannot be probed count as stopped
# what aiokafka logs when it cannot reach a node (not "coordinator not available", which a healthy broker also
# answers while a group's coordinator loads)
_CONNECTION_ERRORS = (
    "Unable connect to",
    "Unable to update metadata",
    "Failed fetch messages",
    "NodeNotReadyError",
    "KafkaConnectionError",
    "Error sending HeartbeatRequest",
    "Error sending LeaveGroupRequest",
)
_NODE = re.compile(r"node with id (\d+)|Failed fetch messages from (\d+)|\(node id (\d+)\)")
_NODES = re.compile(r"Unable to update metadata from \[?([\d, ]+)\]?")
_ADDRESS = re.compile(r"\('([^']+)', (\d+)\)|Connection at (\S+:\d+)|Unable connect to \"(\S+:\d+)\"")
_PRODUCE_ERROR = re.compile(r"Got error produce response.*?(\w+Error)")
# what a retried produce error means, where its name says less than it is (said on its first line)
_MEANING = {
    "NotEnoughReplicasError": (
        "Kafka answers so for a partition short of in-sync replicas, and since Kafka 3.6 (KIP-890) for a "
        "transactional write it cannot verify yet: the producer's previous transaction still completing, or its "
        "coordinator loading or moving; on one node only the second"
    ),
}

log = logging.getLogger("picrl.kafka")


def _clock(seconds: float) -> str:
    return time.strftime("%H:%M:%SZ", time.gmtime(seconds))


@dataclass
class Outage:
    """Errors about one node (or one kind of retried produce error) since their first."""

    label: str  # "Kafka node 1 (127.0.0.1:9092)", "Kafka at 127.0.0.1:9092", "produce requests refused with ..."
    address: str | None  # where to ask whether it answers again (None: cannot be asked)
    since: float  # wall time of the first error
    last: float  # wall time of the latest error
    errors: int = 0  # errors not logged since the first


class BrokerOutageFilter(logging.Filter):
    """Logs aiokafka's connection errors once per node and outage, and the node's recovery once it answers.

    ``probe`` asks an address for metadata (True: it answers); ``watch`` runs :meth:`check` every
    :data:`PROBE_EVERY` seconds on a thread of its own while an outage lasts (off: the caller runs it)."""

    def __init__(self, probe: Callable[[str], bool] | None = None, *, watch: bool = True) -> None:
        super().__init__()
        self._probe = probe or (lambda address: broker_count_or_zero(address, PROBE_EVERY) > 0)
        self._watch = watch
        self._lock = threading.Lock()
        self._outages: dict[str, Outage] = {}  # by node id, address or produce error
        self._addresses: dict[str, str] = {}  # node id -> address, as the errors named them
        self._watcher: threading.Thread | None = None

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.name.startswith("aiokafka"):
            return True
        message = record.getMessage()
        with self._lock:
            keys = self._keys(message)
            if not keys:
                return True
            now = time.time()
            first = [key for key in keys if key not in self._outages]
            for key in keys:
                outage = self._outages.get(key)
                if outage is None:
                    self._outages[key] = Outage(self._label(key), self._address(key), now, now)
                    continue
                outage.last, outage.errors = now, outage.errors + 1
                if outage.address is None and self._address(key) is not None:  # a later line named it
                    outage.label, outage.address = self._label(key), self._address(key)
            if not first:
                return False
            began = [self._outages[key] for key in first]
            labels = " and ".join(outage.label for outage in began)
            if first[0].startswith("produce:"):
                meaning = _MEANING.get(first[0].split(":", 1)[1])
                line = (
                    f"{labels} since {_clock(now)} ({message}){'; ' + meaning if meaning else ''}; aiokafka retries "
                    "them; the next are counted"
                )
            else:
                until = "it answers" if all(outage.address for outage in began) else "they stop"
                line = (
                    f"{labels} unreachable since {_clock(now)} ({message}); the next errors are counted until {until}"
                )
            _rewrite(record, line)
            self._start_watching()
        return True

    def check(self) -> list[str]:
        """Ask each node that is away whether it answers, and close the outages that are over: a node that
        answered, or errors that cannot be probed and have stopped for :data:`QUIET` seconds. Logs a line for
        each (logger ``picrl.kafka``) and returns them."""
        with self._lock:
            outages = dict(self._outages)
        lines = []
        for key, outage in outages.items():
            if outage.address is not None:
                if not self._probe(outage.address):
                    continue
                level, line = (
                    logging.WARNING,
                    f"{outage.label} answered again after {time.time() - outage.since:.0f} s (unreachable since "
                    f"{_clock(outage.since)}; {outage.errors} more connection errors about it were not logged)",
                )
            elif time.time() - outage.last >= QUIET:
                level = logging.INFO if key.startswith("produce:") else logging.WARNING
                line = (
                    f"{outage.label}: no more errors since {_clock(outage.last)} (the first at "
                    f"{_clock(outage.since)}; {outage.errors} more were not logged)"
                )
            else:
                continue
            with self._lock:
                if self._outages.get(key) is outage:
                    del self._outages[key]
            log.log(level, "%s", line)
            lines.append(line)
        return lines

    def _keys(self, message: str) -> list[str]:
        """The nodes (or the kind of produce error) a log line of aiokafka is about; none: not such a line."""
        produce = _PRODUCE_ERROR.search(message)
        if produce:
            return [f"produce:{produce.group(1)}"]
        if not any(text in message for text in _CONNECTION_ERRORS):
            return []
        found = _ADDRESS.search(message)
        where = None if found is None else found.group(3) or found.group(4) or "{}:{}".format(*found.group(1, 2))
        several = _NODES.search(message)
        if several:
            return [node.strip() for node in several.group(1).split(",") if node.strip()]
        node = _NODE.search(message)
        if node:
            node_id = next(group for group in node.groups() if group is not None)
            if where is not None:
                self._addresses[node_id] = where
            return [node_id]
        return [where] if where is not None else ["?"]

    def _label(self, key: str) -> str:
        if key.startswith("produce:"):
            return f"produce requests refused with {key.split(':', 1)[1]}"
        if key == "?":
            return "a Kafka node"
        if key.isdigit():
            address = self._addresses.get(key)
            return f"Kafka node {key}" + (f" ({address})" if address else "")
        return f"Kafka at {key}"

    def _address(self, key: str) -> str | None:
        if key.startswith("produce:") or key == "?":
            return None
        return self._addresses.get(key) if key.isdigit() else key

    def _start_watching(self) -> None:
        """Start the thread that runs :meth:`check` while an outage lasts (called with the lock held)."""
        if self._watch and (self._watcher is None or not self._watcher.is_alive()):
            self._watcher = threading.Thread(target=self._run_watch, name="picrl-broker-outage", daemon=True)
            self._watcher.start()

    def _run_watch(self) -> None:
        while True:
            time.sleep(PROBE_EVERY)
            self.check()
            with self._lock:
                if not self._outages:
                    self._watcher = None
                    return


def _rewrite(record: logging.LogRecord, message: str) -> None:
    record.msg, record.args, record.exc_info, record.exc_text = message, None, None, None
