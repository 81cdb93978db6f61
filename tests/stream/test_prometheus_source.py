"""``picrl produce prometheus`` against a real Prometheus (Debian's package) that scrapes a test exporter serving a
trace with limits and OOM kills: the events feed a worker on the real broker, whose actions equal the decision
engine's (the simulator's controller, tests/stream/test_decisions.py) on the same events, through a Prometheus
restart and a producer killed and started again; the history read back as a training CSV; bad queries refused.

The exporter stamps each tick's samples at the tick's instant and Prometheus runs with a lookback of half a tick,
so the value at ``k * interval`` is exactly tick ``k``'s sample, or nothing (see tests/support/prometheus.py)."""

from __future__ import annotations

import asyncio
import collections
import math
import time
from argparse import Namespace
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from picrl.cli import main
from picrl.commands.prometheus import queries_from_args
from picrl.datasets import Trace, load_csv
from picrl.workloads import copies_of
from picrl_core.artifact import ModelArtifact
from producers.prometheus import (
    PrometheusQueryError,
    Reading,
    ResourceQueries,
    instant_values,
    usage_record,
)
from stream.decisions import DecisionEngine, Incoming
from stream.records import ResourceUsageEvent, UsageEvent, decode_action, decode_dead_letter, decode_usage
from stream.topics import TopicNames, end_offsets, ensure_topics, topic_specs
from tests.stream.conftest import WINDOW
from tests.support.kafka import consume, unique
from tests.support.processes import Started, picrl_process, tail, worker_args
from tests.support.prometheus import PrometheusServer, TraceExporter
from tests.support.web import free_port, http_get, metric

INTERVAL = 1.0
TICKS = WINDOW + 16
LEAD = 20  # ticks the exporter serves ahead of the clock: longer than a Prometheus restart and its first scrape
TOLERANCE = 0.05
NAN_AT, ABSENT_AT = (WINDOW + 6, 1), (WINDOW + 4, 2)  # (tick index, service index)
SERVICES = ("shop/cart/app", "shop/checkout/app", "shop/search/app")  # <namespace>/<pod>/<container>
SHORTAGE = "picrl_test_oom_kills_total - picrl_test_oom_kills_total offset 1s"


@dataclass
class ServedTrace:
    exporter: TraceExporter
    prometheus: PrometheusServer
    services: tuple[str, ...]
    usage: np.ndarray
    limit: np.ndarray
    kills: np.ndarray

    def begin(self) -> int:
        """The trace's first tick, starting it now unless it has started: far enough ahead that Prometheus has
        scraped its first ticks before the producer asks for them, however late a loaded host runs the scrapes
        (with the default 2 ticks, a loaded run found its first 4 ticks not yet scraped)."""
        return self.exporter.begin(ticks_ahead=LEAD // 2)

    @property
    def expected(self) -> list[list[UsageEvent]]:
        """Per tick, the events a correct producer writes: the rule of the issue, computed here from the arrays."""
        return _expected(self.services, self.usage, self.limit, self.kills, self.begin())


def _expected(
    services: tuple[str, ...], usage: np.ndarray, limit: np.ndarray, kills: np.ndarray, first: int
) -> list[list[UsageEvent]]:
    ticks = []
    for i in range(usage.shape[0]):
        events = []
        for j, service in enumerate(services):
            if (i, j) in (NAN_AT, ABSENT_AT):
                continue
            short = i > 0 and kills[i, j] > kills[i - 1, j]
            censored = bool(usage[i, j] >= limit[i, j] * (1 - TOLERANCE) or short)
            events.append(
                UsageEvent(service, first + i, float(limit[i, j] if censored else usage[i, j]), censored, limit[i, j])
            )
        ticks.append(events)
    return ticks


@pytest.fixture(scope="module")
def served(native_trace: Trace, tmp_path_factory: pytest.TempPathFactory):
    """3 services: one limited below its peaks, one whose limit drops mid-trace, one OOM-killed twice under a high
    limit; a NaN usage and an absent usage sample after the warm-up."""
    demand = copies_of(native_trace, 3, TICKS, start=900, seed=7).demand
    peak = demand.max(axis=0)
    limit = np.tile(peak * np.array([0.9, 1.2, 1.3]), (TICKS, 1))
    limit[TICKS // 2 :, 1] = 0.85 * peak[1]
    usage = np.minimum(demand, limit)
    usage[NAN_AT] = np.nan
    kills = np.zeros_like(usage)
    kills[WINDOW + 2 :, 2] += 1
    kills[WINDOW + 9 :, 2] += 1
    services = SERVICES
    exporter = TraceExporter(services, usage, limit, kills, INTERVAL, LEAD, frozenset({ABSENT_AT}))
    port = free_port()
    server, _ = exporter.serve(port)
    prometheus = PrometheusServer(
        tmp_path_factory.mktemp("prometheus"), free_port(), [f"127.0.0.1:{port}"], "100ms", lookback="500ms"
    )
    prometheus.start()
    try:
        yield ServedTrace(exporter, prometheus, services, usage, limit, kills)
    finally:
        prometheus.stop()
        server.shutdown()


def _producer_args(url: str, bootstrap: str, prefix: str, *extra: str) -> list[str]:
    return [
        "produce",
        "prometheus",
        "--url",
        url,
        "--usage",
        "picrl_test_usage",
        "--limit",
        "picrl_test_limit",
        "--shortage",
        SHORTAGE,
        "--service-label",
        "service",
        "--interval",
        str(INTERVAL),
        "--delay",
        "0.2",
        "--tolerance",
        str(TOLERANCE),
        "--bootstrap",
        bootstrap,
        "--prefix",
        prefix,
        *extra,
    ]


def _wait(predicate, timeout: float, what: str, process: Started, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline and process.poll() is None, f"{what}\n{tail(log)}"
        time.sleep(0.2)


def _produced_tick(port: int) -> float:
    try:
        return metric(str(http_get(port, "/metrics", wait=0)[1]), "picrl_source_tick")
    except OSError:
        return 0.0


def _reference(artifact: ModelArtifact, expected: list[list[UsageEvent]]) -> dict[tuple[str, int], float]:
    """The decision engine's actions on the expected events, tick by tick."""
    engine, rows, actions, offset = DecisionEngine(artifact), {}, {}, 0
    for events in expected:
        batch = []
        for event in events:
            batch.append(Incoming(event, 0, offset))
            offset += 1
        outcome = engine.process(batch, {e.service: rows.get(e.service) for e in events})
        rows.update(outcome.rows)
        actions.update({(a.service, a.tick): a.capacity for a in outcome.actions})
    return actions


def test_a_worker_fed_from_prometheus_decides_as_the_simulator_through_restarts(
    served: ServedTrace,
    kafka_bootstrap: str,
    tiny_model_dir: Path,
    tiny_artifact: ModelArtifact,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    prefix = unique("promsrc")
    topics = TopicNames(prefix)
    asyncio.run(ensure_topics(kafka_bootstrap, topic_specs(prefix, 2)))
    web, first_metrics, second_metrics = free_port(), free_port(), free_port()
    worker = worker_args(
        tiny_model_dir, kafka_bootstrap, prefix, "--capacity-gauge", "2", "--web-port", str(web), partitions=2
    )
    produce = _producer_args(served.prometheus.url, kafka_bootstrap, prefix)
    with picrl_process(worker, tmp_path / "worker.log"):
        with picrl_process([*produce, "--metrics-port", str(first_metrics)], tmp_path / "a.log") as producer:
            _wait(
                lambda: "producing to" in (tmp_path / "a.log").read_text(), 90, "no start", producer, tmp_path / "a.log"
            )
            assert served.exporter.first_tick is None, "the trace must start after the producer"
            first = served.begin()
            last = first + TICKS - 1
            expected = _reference(tiny_artifact, served.expected)
            _wait(
                lambda: _produced_tick(first_metrics) >= first + WINDOW + 2, 90, "no tick", producer, tmp_path / "a.log"
            )
            served.prometheus.restart(down=1.5)
            _wait(
                lambda: _produced_tick(first_metrics) >= first + WINDOW + 8, 90, "no tick", producer, tmp_path / "a.log"
            )
            scraped = str(http_get(first_metrics, "/metrics")[1])
            producer.kill()  # mid-run, maybe mid-transaction: the next one fences it and resumes after its last tick
            producer.wait()
        with picrl_process([*produce, "--metrics-port", str(second_metrics)], tmp_path / "b.log") as producer:
            _wait(lambda: _produced_tick(second_metrics) >= last, 90, "no last tick", producer, tmp_path / "b.log")
            actions = [
                decode_action(m.value)
                for m in asyncio.run(consume(kafka_bootstrap, topics.actions, len(expected), timeout=60))
            ]
            gauges = str(http_get(web, "/metrics")[1])
    usage = [decode_usage(m.value) for m in asyncio.run(consume(kafka_bootstrap, topics.usage, 10_000, timeout=5))]
    produced = collections.Counter((e.service, e.tick) for e in usage)
    wanted = [e for events in served.expected for e in events]
    assert max(produced.values()) == 1, "a tick produced twice"
    assert sorted(produced) == sorted((e.service, e.tick) for e in wanted), "a tick missing or extra"
    values = sorted((e.service, e.tick, e.usage, e.censored, e.capacity) for e in usage)  # type: ignore[union-attr]
    assert values == sorted((e.service, e.tick, e.usage, e.censored, e.capacity) for e in wanted), "values differ"
    decided = {(a.service, a.tick): a.capacity for a in actions}
    assert len(decided) == len(actions) == len(expected)
    assert decided == expected, "the worker's actions differ from the engine's on the same events"
    # the outage: one line when it began, one when it ended, and its metric
    log = (tmp_path / "a.log").read_text()
    assert log.count("Prometheus unreachable") == 1 and log.count("Prometheus answers again") == 1, log
    assert metric(scraped, "picrl_source_outages_total") == 1.0
    assert "the last one produced)" in (tmp_path / "b.log").read_text()  # the second producer resumed
    (letter,) = [
        decode_dead_letter(m.value) for m in asyncio.run(consume(kafka_bootstrap, topics.deadletter, 1, timeout=10))
    ]
    assert (letter.reason, letter.offset) == ("non_finite", first + NAN_AT[0])
    # the way back: the decided capacity of the first two services, the third beyond the cap
    last_capacity = {a.service: a.capacity for a in sorted(actions, key=lambda a: a.tick)}
    exported = {s: metric(gauges, "picrl_decided_capacity", resource="", service=s) for s in last_capacity}
    assert [s for s in exported if exported[s]] == [s for s in exported if exported[s] == last_capacity[s]]
    assert sum(bool(v) for v in exported.values()) == 2
    assert metric(gauges, "picrl_decided_capacity_beyond_cap_total") > 0
    # the example scheduler's dry run: each service's last command sets its last decided capacity
    capsys.readouterr()
    assert main(["schedule", "--bootstrap", kafka_bootstrap, "--prefix", prefix]) == 0
    commands = capsys.readouterr().out.splitlines()
    for service, capacity in last_capacity.items():
        _, pod, _ = service.split("/")
        mine = [c for c in commands if f"kubectl patch pod {pod} -n shop --subresource resize" in c]
        assert f'"limits":{{"memory":"{math.ceil(capacity)}"}}' in mine[-1], commands


def _history_ready(served: ServedTrace) -> None:
    last = served.begin() + TICKS - 1
    deadline = time.monotonic() + 60
    while True:
        status, body = http_get(served.prometheus.port, f"/api/v1/query?query=picrl_test_limit&time={last * INTERVAL}")
        if status == 200 and body["data"]["result"]:  # type: ignore[index]
            return
        assert time.monotonic() < deadline, tail(served.prometheus.log)
        time.sleep(0.5)


def test_history_becomes_a_training_csv_per_service_and_a_replay_on_the_topic(
    served: ServedTrace, kafka_bootstrap: str, tmp_path: Path
) -> None:
    _history_ready(served)
    first, last = served.begin(), served.begin() + TICKS - 1
    span = ["--from", str(first * INTERVAL), "--to", str(last * INTERVAL)]
    args = _producer_args(served.prometheus.url, kafka_bootstrap, "unused", *span)
    assert main([*args, "--out", str(tmp_path)]) == 0
    for service in SERVICES:
        trace = load_csv(tmp_path / (service.replace("/", "_") + ".csv"), "usage", time_column="time")
        want = np.full(TICKS, np.nan)
        for i, events in enumerate(served.expected):
            for e in events:
                if e.service == service:
                    want[i] = e.usage
        np.testing.assert_array_equal(trace.values, want)
        assert trace.step_seconds == INTERVAL
    prefix = unique("promhist")
    asyncio.run(ensure_topics(kafka_bootstrap, topic_specs(prefix, 2)))
    history = _producer_args(served.prometheus.url, kafka_bootstrap, prefix, *span)
    assert main(history) == 0 and main(history) == 0  # the second run finds every tick produced
    usage = [
        decode_usage(m.value) for m in asyncio.run(consume(kafka_bootstrap, TopicNames(prefix).usage, 1000, timeout=5))
    ]
    assert sorted((e.service, e.tick, e.usage) for e in usage) == sorted(
        (e.service, e.tick, e.usage) for events in served.expected for e in events
    )


@pytest.mark.parametrize(
    ("usage", "error"),
    [
        ("scalar(sum(last_over_time(picrl_test_usage[1h])))", "returns a scalar, not an instant vector"),
        ("sum(last_over_time(picrl_test_usage[1h]))", "without the service label 'service'"),
        ("picrl_test_usage{", "bad_data"),
        ("picrl_test_usage[1h]", "returns a matrix, not an instant vector"),
    ],
)
def test_a_query_of_the_wrong_shape_stops_the_producer_before_anything_is_produced(
    served: ServedTrace, kafka_bootstrap: str, usage: str, error: str, capsys: pytest.CaptureFixture[str]
) -> None:
    _history_ready(served)
    prefix = unique("prombad")
    asyncio.run(ensure_topics(kafka_bootstrap, topic_specs(prefix, 2)))
    args = _producer_args(served.prometheus.url, kafka_bootstrap, prefix)
    args[args.index("picrl_test_usage")] = usage
    assert main(args) == 2
    assert error in capsys.readouterr().err
    assert set(asyncio.run(end_offsets(kafka_bootstrap, TopicNames(prefix).usage, 2)).values()) == {0}


def test_a_tick_is_censored_at_the_limit_or_on_a_shortage_and_reports_the_limit() -> None:
    free = usage_record("a", 7, {None: Reading(9.0, 10.0)}, 0.05, 1.0)
    assert free == UsageEvent("a", 7, 9.0, False, 10.0, None, 1.0)
    assert usage_record("a", 7, {None: Reading(9.6, 10.0)}, 0.05, 1.0).censored  # within 5% of the limit
    killed = usage_record("a", 7, {None: Reading(2.0, 10.0, shortage=1.0)}, 0.05, 1.0)
    assert (killed.usage, killed.capacity, killed.censored) == (10.0, 10.0, True)  # y = a when censored
    both = usage_record("a", 7, {"gpu_mem": Reading(10.0, 10.0), "gpu_compute": Reading(40.0, 100.0)}, 0.05, 1.0)
    assert isinstance(both, ResourceUsageEvent) and both.resources["gpu_mem"].censored
    assert not both.resources["gpu_compute"].censored
    for reading, reason in [
        (Reading(float("nan"), 10.0), "non_finite"),
        (Reading(-1.0, 10.0), "negative_usage"),
        (Reading(1.0, float("inf")), "non_finite"),
        (Reading(1.0, -10.0), "out_of_range"),
    ]:
        with pytest.raises(ValueError, match=reason):
            usage_record("a", 7, {None: reading}, 0.05, 1.0)


def test_an_answer_with_two_series_for_a_service_is_refused() -> None:
    series = {"metric": {"service": "a"}, "value": [0, "1"]}
    assert instant_values({"resultType": "vector", "result": [series]}, "service", "usage", "q") == {"a": 1.0}
    with pytest.raises(PrometheusQueryError, match="several series"):
        instant_values({"resultType": "vector", "result": [series, series]}, "service", "usage", "q")


def test_each_resource_takes_its_queries_in_the_order_of_the_resource_flags() -> None:
    two = Namespace(resource=["gpu_mem", "gpu_compute"], usage=["mu", "cu"], limit=["ml", "cl"], shortage=None)
    assert queries_from_args(two) == {
        "gpu_mem": ResourceQueries("mu", "ml"),
        "gpu_compute": ResourceQueries("cu", "cl"),
    }
    one = Namespace(resource=None, usage=["u"], limit=["l"], shortage=["s"])
    assert queries_from_args(one) == {None: ResourceQueries("u", "l", "s")}
    with pytest.raises(ValueError, match="once each per resource"):
        queries_from_args(Namespace(resource=["gpu_mem", "gpu_compute"], usage=["mu"], limit=["ml"], shortage=None))
