"""A real Prometheus server (Debian's ``prometheus`` package) for the integration tests, and a test exporter that
serves a trace to it tick by tick."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from wsgiref.simple_server import WSGIServer

import numpy as np
from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from tests.support.processes import require_program, stop, tail
from tests.support.web import http_get


def wait_until_ready(port: int, log: Path, wait: float = 90.0) -> None:
    """Prometheus listens before its storage is open and answers 503 until then: wait for /-/ready."""
    deadline = time.monotonic() + wait
    while (status := http_get(port, "/-/ready")[0]) != 200:
        assert time.monotonic() < deadline, (status, tail(log))
        time.sleep(0.5)


class PrometheusServer:
    """``prometheus`` on ``port`` scraping ``targets`` every ``scrape`` (e.g. "100ms"), its storage in ``folder``
    kept across :meth:`restart`; ``lookback`` is its ``--query.lookback-delta``."""

    def __init__(self, folder: Path, port: int, targets: list[str], scrape: str, lookback: str = "5m") -> None:
        self.program = require_program("prometheus", "prometheus")
        self.folder, self.port, self.lookback = folder, port, lookback
        self.log = folder / "prometheus.log"
        self.config = folder / "prometheus.yml"
        self.config.write_text(
            json.dumps(  # YAML is a superset of JSON
                {
                    "global": {"scrape_interval": scrape, "scrape_timeout": scrape},
                    "scrape_configs": [{"job_name": "trace", "static_configs": [{"targets": targets}]}],
                }
            )
        )
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                [
                    self.program,
                    f"--config.file={self.config}",
                    f"--storage.tsdb.path={self.folder / 'tsdb'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                    f"--query.lookback-delta={self.lookback}",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        wait_until_ready(self.port, self.log)

    def stop(self) -> None:
        if self.process is not None:
            stop(self.process)
            self.process = None

    def restart(self, down: float) -> None:
        """Stop (SIGTERM: the samples stored stay in its storage), stay down ``down`` seconds, start again."""
        self.stop()
        time.sleep(down)
        self.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


class TraceExporter(Collector):
    """Serves a trace to a scraping Prometheus: ``picrl_test_usage``, ``picrl_test_limit`` (gauges) and
    ``picrl_test_oom_kills_total`` (a counter) per service (label ``service``), row ``i`` of each ``(T, N)`` array
    being tick ``first_tick + i``, from :meth:`begin` on.

    Each scrape exposes the next tick, its samples stamped with the tick's instant ``tick * interval`` (so the value
    Prometheus answers at that instant is exactly the tick's, whenever it was scraped), each tick on two scrapes in a
    row (so a tick whose scrape a stopping Prometheus dropped is served again after it restarts), up to ``lead`` ticks
    ahead of the clock and never past the trace's end. A NaN usage is served as NaN; ``absent`` (tick index, service
    index) pairs serve no usage sample."""

    def __init__(
        self,
        services: tuple[str, ...],
        usage: np.ndarray,
        limit: np.ndarray,
        oom_kills: np.ndarray,
        interval: float,
        lead: int,
        absent: frozenset[tuple[int, int]] = frozenset(),
    ) -> None:
        self.services, self.usage, self.limit, self.oom_kills = services, usage, limit, oom_kills
        self.interval, self.lead, self.absent = interval, lead, absent
        self.first_tick: int | None = None
        self._served = 0  # scrapes served a tick
        self._lock = threading.Lock()

    def begin(self, ticks_ahead: int = 2) -> int:
        """Start the trace ``ticks_ahead`` ticks after the clock's (once: later calls change nothing); its first
        tick."""
        with self._lock:
            if self.first_tick is None:
                self.first_tick = int(time.time() // self.interval) + ticks_ahead
            return self.first_tick

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        with self._lock:
            first, i = self.first_tick, self._served // 2
            if first is None or i >= self.usage.shape[0] or (first + i - self.lead) * self.interval > time.time():
                return
            self._served += 1
        stamp = (first + i) * self.interval
        usage = GaugeMetricFamily("picrl_test_usage", "usage of the trace", labels=["service"])
        limit = GaugeMetricFamily("picrl_test_limit", "limit in force", labels=["service"])
        kills = CounterMetricFamily("picrl_test_oom_kills", "OOM kills so far", labels=["service"])
        for j, service in enumerate(self.services):
            if (i, j) not in self.absent:
                usage.add_metric([service], float(self.usage[i, j]), timestamp=stamp)
            limit.add_metric([service], float(self.limit[i, j]), timestamp=stamp)
            kills.add_metric([service], float(self.oom_kills[i, j]), timestamp=stamp)
        yield from (usage, limit, kills)

    def describe(self) -> Iterator[GaugeMetricFamily]:
        return iter(())

    def serve(self, port: int) -> tuple[WSGIServer, threading.Thread]:
        registry = CollectorRegistry(auto_describe=False)
        registry.register(self)
        return start_http_server(port, addr="127.0.0.1", registry=registry)
