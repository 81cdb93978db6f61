"""Shared CLI options of the commands that talk to Kafka, resolved through ``picrl.settings``."""
from __future__ import annotations

import argparse
import json
import logging
import logging.config
import time
from pathlib import Path
from typing import Any

from picrl.broker_outage import BrokerOutageFilter
from picrl.kafka import BrokerError, LocalKafka
from picrl.settings import Settings, load_settings


def add_bus_arguments(parser: argparse.ArgumentParser, *, partitions: bool = True) -> None:
    """``--bootstrap``, ``--prefix`` (and ``--partitions``) and ``--settings``; unset flags fall back to the
    settings file, then ``PICRL_*`` variables, then defaults (see ``picrl config show``)."""
    group = parser.add_argument_group("Kafka (unset: settings file, then PICRL_* environment, then defaults)")
    group.add_argument("--bootstrap", metavar="HOST:PORT",
                       help="a Kafka cluster (default: the local broker of `picrl kafka start`)")
    group.add_argument("--prefix", help="topic name prefix: <prefix>.usage, .actions, .replay, .policy, .deadletter "
                                        "(default picrl)")
    if partitions:
        group.add_argument("--partitions", type=int,
                           help="partitions of the keyed topics; scale out with one worker per few partitions (default 8)")
    group.add_argument("--settings", type=Path, metavar="FILE", help="JSON settings file (default $PICRL_SETTINGS)")


def settings_from_args(args: argparse.Namespace, **flags: Any) -> Settings:
    """The settings with this command's flags on top (``flags``: more flag values by setting name)."""
    given = {name: getattr(args, name, None) for name in ("bootstrap", "prefix", "partitions")}
    return load_settings(args.settings, {**given, **flags})


def bootstrap_or_local(bootstrap: str | None) -> str:
    """The given bootstrap address, else the running local broker's."""
    if bootstrap:
        return bootstrap
    info = LocalKafka().status()
    if info is None:
        raise BrokerError("no --bootstrap given and no local broker is running: start one with `picrl kafka start`")
    return info.bootstrap


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, and ``service``/``tick`` when given via
    ``extra``; tracebacks only for unexpected errors (``log.exception``)."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {"time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
                                 + f".{int(record.msecs):03d}Z", "level": record.levelname.lower(),
                                 "logger": record.name, "message": record.getMessage()}
        for key in ("service", "tick", "reason", "version", "partition", "offset"):
            if hasattr(record, key):
                entry[key] = getattr(record, key)
        if record.exc_info:
            entry["error"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


NOISY_LOGGERS = ("aiokafka", "kafka", "faust", "mode")  # Kafka clients and Faust: warnings only unless debugging


def logging_config(level: str, log_format: str = "text") -> dict[str, Any]:
    """A :func:`logging.config.dictConfig` dict: one stderr handler, JSON lines or plain text.

    The worker hands the same dict to ``faust.Worker(logging_config=...)``, which otherwise replaces
    the root handlers with its own text format when it starts."""
    level = level.upper()
    formatter = ({"()": JsonFormatter} if log_format == "json" else
                 {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"})
    loggers: dict[str, dict[str, str]] = {}
    if level != "DEBUG":
        loggers = {name: {"level": "WARNING"} for name in NOISY_LOGGERS}
        loggers["mode.timers"] = {"level": "ERROR"}  # "Timer commit is overlapping" at short intervals
    return {
        "version": 1, "disable_existing_loggers": False,
        "formatters": {"picrl": formatter},
        "filters": {"broker_outage": {"()": BrokerOutageFilter}},  # aiokafka's error flood -> a few lines
        "handlers": {"stderr": {"class": "logging.StreamHandler", "stream": "ext://sys.stderr", "formatter": "picrl",
                                "filters": ["broker_outage"]}},
        "root": {"level": level, "handlers": ["stderr"]},
        "loggers": loggers,
    }


def configure_logging(level: str, log_format: str = "text") -> None:
    """Apply :func:`logging_config` (``dictConfig`` consumes its dict: build a fresh one per use)."""
    logging.config.dictConfig(logging_config(level, log_format))
