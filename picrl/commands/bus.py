"""Shared CLI options of the commands that talk to Kafka, resolved through ``picrl.settings``."""

from __future__ import annotations

import argparse
import json
import logging
import logging.config
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from picrl.broker_outage import BrokerOutageFilter
from picrl.errors import UserError
from picrl.kafka import BrokerError, LocalKafka
from picrl.kafka.probe import answers_metadata
from picrl.settings import Settings, load_settings

log = logging.getLogger("picrl")


def add_bus_arguments(parser: argparse.ArgumentParser, *, partitions: bool = True) -> None:
    """``--bootstrap``, ``--prefix`` (and ``--partitions``) and ``--settings``; unset flags fall back to the
    settings file, then ``PICRL_*`` variables, then defaults (see ``picrl config show``)."""
    group = parser.add_argument_group("Kafka (unset: settings file, then PICRL_* environment, then defaults)")
    group.add_argument(
        "--bootstrap", metavar="HOST:PORT", help="a Kafka cluster (default: the local broker of `picrl kafka start`)"
    )
    group.add_argument(
        "--prefix", help="topic name prefix: <prefix>.usage, .actions, .replay, .policy, .deadletter (default picrl)"
    )
    if partitions:
        group.add_argument(
            "--partitions",
            type=int,
            help="partitions of the keyed topics; scale out with one worker per few partitions (default 8)",
        )
    group.add_argument(
        "--bootstrap-timeout",
        type=float,
        metavar="SECONDS",
        help="seconds to wait for Kafka to answer at start before exiting with an error, code 2 (default 15)",
    )
    group.add_argument("--settings", type=Path, metavar="FILE", help="JSON settings file (default $PICRL_SETTINGS)")


def add_replication_arguments(parser: argparse.ArgumentParser) -> None:
    """``--replication-factor`` and ``--min-insync-replicas`` of the topics a command creates."""
    group = parser.add_argument_group(
        "replication of the topics created (picrl's and the worker's changelog; existing topics are kept as they are)"
    )
    group.add_argument(
        "--replication-factor", type=int, metavar="N", help="replicas of each partition (default min(3, live brokers))"
    )
    group.add_argument(
        "--min-insync-replicas",
        type=int,
        metavar="N",
        help="replicas that must have a write before it is acknowledged (producers use acks=all; "
        "default: replication factor - 1, at least 1)",
    )


def settings_from_args(args: argparse.Namespace, **flags: Any) -> Settings:
    """The settings with this command's flags on top (``flags``: more flag values by setting name)."""
    names = ("bootstrap", "bootstrap_timeout", "prefix", "partitions", "replication_factor", "min_insync_replicas")
    given = {name: getattr(args, name, None) for name in names}
    return load_settings(args.settings, {**given, **flags})


def bootstrap_or_local(bootstrap: str | None) -> str:
    """The given bootstrap address, else the running local broker's."""
    if bootstrap:
        return bootstrap
    info = LocalKafka().status()
    if info is None:
        raise BrokerError("no --bootstrap given and no local broker is running: start one with `picrl kafka start`")
    return info.bootstrap


class KafkaUnreachable(ConnectionError):
    """No node of the bootstrap list answered within the bootstrap timeout."""


FIRST_PROBE = 1.0  # seconds the first metadata request may take before the command says it waits


def wait_for_kafka(bootstrap: str, timeout: float, say: Callable[[str], None] | None = None) -> None:
    """Return once a node of ``bootstrap`` answers a metadata request; raise :class:`KafkaUnreachable` after
    ``timeout`` seconds. When the first request (at most :data:`FIRST_PROBE` s) gets no answer it says at once,
    in one line, where and how long it waits: through ``say`` (a command's own output), else logged as a warning
    (a worker or trainer started beside a broker that is still starting waits for it)."""
    deadline = time.monotonic() + timeout
    if answers_metadata(bootstrap, min(FIRST_PROBE, timeout)):
        return
    line = f"Kafka at {bootstrap} does not answer yet; waiting up to {timeout:g} s (--bootstrap-timeout sets the wait)"
    if say is None:
        log.warning("%s", line)
    else:
        say(line)
    while (left := deadline - time.monotonic()) > 0:
        time.sleep(min(1.0, left))
        if answers_metadata(bootstrap, max(0.1, min(2.0, deadline - time.monotonic()))):
            return
    raise KafkaUnreachable(
        f"Kafka at {bootstrap} did not answer within {timeout:g} s: check --bootstrap and that "
        f"the brokers run (--bootstrap-timeout sets the wait)"
    )


def reachable_bootstrap(settings: Settings, command: str | None = None) -> str:
    """The settings' bootstrap address (else the local broker's), once Kafka answers there (:func:`wait_for_kafka`
    with the ``bootstrap_timeout`` setting). A ``command`` (``picrl <command>``) says that it waits on stderr; a
    process that logs (no ``command``) logs it."""
    bootstrap = bootstrap_or_local(settings["bootstrap"])
    say = None if command is None else (lambda line: print(f"picrl {command}: {line}", file=sys.stderr, flush=True))
    wait_for_kafka(bootstrap, settings["bootstrap_timeout"], say)
    return bootstrap


def logged_errors(run: Callable[[], int]) -> int:
    """``run()``, where an error the CLI would print as a plain line is logged instead (exit code 2), so that a
    process whose logs are JSON writes nothing but JSON."""
    try:
        return run()
    except UserError as exc:
        log.error("%s", exc)
        return 2


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, and ``service``/``tick`` when given via
    ``extra``; tracebacks only for unexpected errors (``log.exception``)."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key in ("service", "tick", "reason", "version", "partition", "offset"):
            if hasattr(record, key):
                entry[key] = getattr(record, key)
        if record.exc_info:
            entry["error"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


# What aiokafka logs as a warning or an error although it only retries or goes on: states a cluster passes through
# at a first start (the consumer offsets or transaction state topic being created), while a node starts, when a
# worker joins the group, and in a fail-over.
RETRIED_STATES = (
    "GroupCoordinatorNotAvailableError",
    "Marking the coordinator dead",
    "NotEnoughReplicas",
    "NotLeaderForPartitionError",
    "LeaderNotAvailableError",
    "CoordinatorLoadInProgressError",
    "because it is rebalancing",
)


class RetriedStates(logging.Filter):
    """Logs aiokafka's lines about the states it retries (:data:`RETRIED_STATES`) at info: expected at start-up,
    they are no warning; one that lasts shows as what it leads to (a failed transaction, a stalled partition)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if (
            record.levelno > logging.INFO
            and record.name.startswith("aiokafka")
            and any(text in record.getMessage() for text in RETRIED_STATES)
        ):
            record.levelno, record.levelname = logging.INFO, "INFO"
            return logging.getLogger().isEnabledFor(logging.INFO)  # dropped under --log-level warning
        return True


NOISY_LOGGERS = ("aiokafka", "kafka", "faust", "mode")  # Kafka clients and Faust: warnings only unless debugging


class CurrentStderr(logging.StreamHandler):  # type: ignore[type-arg]
    """A stream handler on whatever ``sys.stderr`` is when it writes, not when it was configured: a command run in
    the same process as its caller (the tests' ``main([...])``, a notebook), whose stderr is swapped for a capture
    and closed afterwards, leaves no handler writing to a closed file (``--- Logging error ---``)."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property  # type: ignore[override]
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, _: Any) -> None:
        """Ignored: the stream is always the current ``sys.stderr``."""


def logging_config(level: str, log_format: str = "text") -> dict[str, Any]:
    """A :func:`logging.config.dictConfig` dict: one stderr handler, JSON lines or plain text.

    The worker hands the same dict to ``faust.Worker(logging_config=...)``, which otherwise replaces
    the root handlers with its own text format when it starts."""
    level = level.upper()
    formatter = (
        {"()": JsonFormatter} if log_format == "json" else {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}
    )
    loggers: dict[str, dict[str, str]] = {}
    if level != "DEBUG":
        loggers = {name: {"level": "WARNING"} for name in NOISY_LOGGERS}
        loggers["mode.timers"] = {"level": "ERROR"}  # "Timer commit is overlapping" at short intervals
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"picrl": formatter},
        "filters": {
            "retried": {"()": RetriedStates},  # expected start-up states -> info
            "broker_outage": {"()": BrokerOutageFilter},
        },  # aiokafka's error flood -> a few lines
        "handlers": {
            "stderr": {
                "()": CurrentStderr,
                "formatter": "picrl",
                "filters": ["retried", "broker_outage"],
            }
        },
        "root": {"level": level, "handlers": ["stderr"]},
        "loggers": loggers,
    }


def configure_logging(level: str, log_format: str = "text") -> None:
    """Apply :func:`logging_config` (``dictConfig`` consumes its dict: build a fresh one per use)."""
    logging.config.dictConfig(logging_config(level, log_format))


def command_logging() -> None:
    """Warnings and errors on stderr, for a command that prints its own output (``picrl produce``): aiokafka's
    connection errors become one line per node and outage (:class:`picrl.broker_outage.BrokerOutageFilter`),
    not one per retry. Left alone when the process has set up logging already (a program that embeds the CLI,
    a test)."""
    if not logging.getLogger().handlers:
        configure_logging("warning")
