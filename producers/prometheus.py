"""Usage events from a Prometheus server: the telemetry a platform team already keeps (cAdvisor, kube-state-metrics).

Each tick ``k`` the producer evaluates its PromQL queries as instant queries at ``time = k * interval`` (HTTP API
``/api/v1/query``) and turns each service's values into the PIC observation of the paper (section 2): the capacity
in force ``a_t`` is the limit query's value, and the tick is censored (``c_t = 1``) when usage reached the limit,
``y >= a * (1 - tolerance)``, or when the shortage query (an OOM kill, CPU throttling) is above 0. A censored tick
reports ``y_t = a_t``, as the usage record's rule asks. Prometheus answers the value at ``k * interval`` with the last
sample at or before that instant (within its lookback, 5 minutes by default), so a tick reads what was scraped by
then; the producer asks ``delay`` seconds after the instant, once that scrape is stored.

A service is one value of the ``service_label`` label. A service whose usage or limit series is absent at a tick gets
no event (its worker holds the capacity in force); a NaN, infinite or negative value becomes a dead letter with its
reason. A query that does not answer an instant vector of one series per service is refused at start
(:class:`PrometheusQueryError`). An unreachable server is retried with exponential backoff, logged once per outage
and once at recovery, and counted in :class:`~stream.metrics.SourceMetrics`.

Each tick's events (and dead letters) go out in one Kafka transaction of a producer whose ``transactional_id`` is
fixed per producer id; a producer started again fences the previous one and resumes at the tick after the last one
committed on the usage topic (records carry the producer id in a header), so a restart leaves no gap and no
duplicate. :func:`range_readings` reads the same values for a past interval with ``/api/v1/query_range``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import KafkaError

from stream.metrics import SourceMetrics
from stream.records import DeadLetter, DecodeError, ResourceUsage, ResourceUsageEvent, UsageEvent
from stream.topics import TopicNames, records_up_to

log = logging.getLogger("picrl.prometheus")

PRODUCER_HEADER = "picrl-producer"  # header naming the producer id on every usage record it writes
MAX_POINTS = 10_000  # points per series in one query_range (Prometheus refuses more than 11,000)
RESUME_CHUNK = 500  # offsets read back at a time from a partition's end when looking for the last tick


class PrometheusQueryError(ValueError):
    """A query Prometheus refuses, or whose answer is not an instant vector with one series per service."""


class PrometheusUnreachable(ConnectionError):
    """Prometheus did not answer (connection refused, timeout, a 5xx): worth retrying."""


@dataclass(frozen=True)
class ResourceQueries:
    """The PromQL of one resource: usage, the limit in force, and optionally a shortage signal (> 0: short)."""

    usage: str
    limit: str
    shortage: str | None = None

    def named(self) -> Iterator[tuple[str, str]]:
        yield "usage", self.usage
        yield "limit", self.limit
        if self.shortage is not None:
            yield "shortage", self.shortage


@dataclass(frozen=True)
class Reading:
    """One resource of one service at one tick, as Prometheus answered (shortage 0 when not asked or absent)."""

    usage: float
    limit: float
    shortage: float = 0.0


Readings = dict[str, dict[str | None, Reading]]  # service -> resource (None: the single resource) -> reading


class PrometheusClient:
    """The HTTP API of one Prometheus server (stdlib ``urllib``; blocking calls, run in a thread by the caller)."""

    def __init__(self, url: str, timeout: float = 10.0) -> None:
        self.url = url.rstrip("/")
        self.timeout = timeout

    def _post(self, endpoint: str, params: dict[str, str]) -> dict[str, Any]:
        request = urllib.request.Request(
            f"{self.url}/api/v1/{endpoint}",
            data=urllib.parse.urlencode(params).encode(),
            headers={"Content-Type": "application/x-www-form-urlencoded"},
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                body = response.read()
        except urllib.error.HTTPError as exc:
            if exc.code in (400, 422):  # bad_data, or an expression that cannot be executed
                raise PrometheusQueryError(_error_text(exc.read())) from None
            raise PrometheusUnreachable(f"HTTP {exc.code} from {self.url}") from None
        except (urllib.error.URLError, OSError) as exc:
            raise PrometheusUnreachable(f"{self.url}: {getattr(exc, 'reason', exc)}") from None
        try:
            payload = json.loads(body)
        except ValueError:
            raise PrometheusUnreachable(f"{self.url} answered something other than JSON") from None
        if payload.get("status") != "success":
            raise PrometheusQueryError(_error_text(body))
        return payload["data"]

    def query(self, expression: str, at: float) -> dict[str, Any]:
        """``/api/v1/query`` evaluated at ``at`` (epoch seconds): ``{"resultType", "result"}``."""
        return self._post("query", {"query": expression, "time": f"{at:.3f}"})

    def query_range(self, expression: str, start: float, end: float, step: float) -> dict[str, Any]:
        """``/api/v1/query_range`` at ``start``, ``start + step``, ... up to ``end``."""
        return self._post(
            "query_range", {"query": expression, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}"}
        )


def _error_text(body: bytes) -> str:
    try:
        payload = json.loads(body)
        return f"{payload.get('errorType', 'error')}: {payload.get('error', body.decode(errors='replace'))}"
    except ValueError:
        return body.decode(errors="replace")[:200]


def _service_of(series: dict[str, Any], label: str, name: str, expression: str) -> str:
    service = series.get("metric", {}).get(label)
    if not service:
        raise PrometheusQueryError(
            f"{name} query {expression!r}: a series without the service label {label!r} ({series.get('metric')}); "
            f"aggregate by it, e.g. max by ({label}) (...)"
        )
    return service


def instant_values(data: dict[str, Any], label: str, name: str, expression: str) -> dict[str, float]:
    """``{service: value}`` of an instant query's answer; :class:`PrometheusQueryError` unless it is an instant
    vector of series that each carry ``label``, one per service."""
    if data.get("resultType") != "vector":
        raise PrometheusQueryError(
            f"{name} query {expression!r} returns a {data.get('resultType')}, not an instant vector "
            "(one series per service)"
        )
    values: dict[str, float] = {}
    for series in data["result"]:
        service = _service_of(series, label, name, expression)
        if service in values:
            raise PrometheusQueryError(
                f"{name} query {expression!r}: several series for {label}={service!r}; aggregate by {label}"
            )
        values[service] = float(series["value"][1])  # Prometheus writes NaN and +Inf as strings float() reads
    return values


def range_values(
    data: dict[str, Any], label: str, name: str, expression: str, step: float
) -> dict[str, dict[int, float]]:
    """``{service: {tick: value}}`` of a range query's answer (a matrix), ticks being ``time / step``."""
    if data.get("resultType") != "matrix":
        raise PrometheusQueryError(f"{name} query {expression!r} returns a {data.get('resultType')}, not a vector")
    values: dict[str, dict[int, float]] = {}
    for series in data["result"]:
        service = _service_of(series, label, name, expression)
        if service in values:
            raise PrometheusQueryError(
                f"{name} query {expression!r}: several series for {label}={service!r}; aggregate by {label}"
            )
        values[service] = {round(float(t) / step): float(v) for t, v in series["values"]}
    return values


def combine(answers: dict[str | None, dict[str, dict[str, float]]]) -> Readings:
    """The readings of the services that have usage and limit for every resource: ``answers`` maps each resource
    to ``{query name: {service: value}}``."""
    services = set.intersection(*(set(named["usage"]) & set(named["limit"]) for named in answers.values()))
    return {
        service: {
            resource: Reading(
                named["usage"][service], named["limit"][service], named.get("shortage", {}).get(service, 0.0)
            )
            for resource, named in answers.items()
        }
        for service in sorted(services)
    }


def _checked(service: str, resource: str | None, reading: Reading) -> None:
    """A :class:`DecodeError` with the usage record's reason for a value no record may carry."""
    where = f"{service!r}" + (f" {resource}" if resource else "")
    for name, value in (("usage", reading.usage), ("limit", reading.limit), ("shortage", reading.shortage)):
        if not math.isfinite(value):
            raise DecodeError("non_finite", f"{name} of {where}: expected a finite number, got {value!r}")
        if value < 0:
            reason = "negative_usage" if name == "usage" else "out_of_range"
            raise DecodeError(reason, f"{name} of {where}: expected a number >= 0, got {value!r}")


def observation(reading: Reading, tolerance: float) -> ResourceUsage:
    """The PIC observation of one resource: censored when usage reached ``limit * (1 - tolerance)`` or a shortage
    was reported; then ``y = a`` (the limit)."""
    censored = reading.usage >= reading.limit * (1.0 - tolerance) or reading.shortage > 0
    return ResourceUsage(reading.limit if censored else reading.usage, reading.limit, censored)


def usage_record(
    service: str, tick: int, readings: dict[str | None, Reading], tolerance: float, produced_at: float
) -> UsageEvent | ResourceUsageEvent:
    """The usage record of one service at one tick (schema 1 for the single resource ``None``, else schema 2);
    :class:`DecodeError` (its reason) for a value no record may carry."""
    for resource, reading in readings.items():
        _checked(service, resource, reading)
    observed = {resource: observation(reading, tolerance) for resource, reading in readings.items()}
    if None in observed:
        one = observed[None]
        return UsageEvent(service, tick, one.usage, one.censored, one.capacity, None, produced_at)
    return ResourceUsageEvent(service, tick, {str(r): o for r, o in observed.items()}, None, produced_at)


class PrometheusSource:
    """Readings per tick from one Prometheus server, with bounded retries over outages."""

    def __init__(
        self,
        client: PrometheusClient,
        queries: dict[str | None, ResourceQueries],
        service_label: str,
        interval: float,
        *,
        retries: int = 8,
        backoff: float = 0.5,
        max_backoff: float = 30.0,
        metrics: SourceMetrics | None = None,
    ) -> None:
        if interval <= 0:
            raise ValueError(f"--interval must be > 0 seconds; got {interval}")
        self.client = client
        self.queries = queries
        self.label = service_label
        self.interval = interval
        self.retries = retries
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.metrics = metrics or SourceMetrics()
        self._previous: set[str] = set()  # the services read at the tick before
        self._failures = 0  # failed tries of the outage going on (0: Prometheus answers)
        self._down_since = 0.0

    async def _call(self, call: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        """``call()`` in a thread, tried again after an unreachable answer, up to ``retries`` failures in a row;
        one warning when an outage begins and one when it ends."""
        while True:
            try:
                data = await asyncio.to_thread(call)
            except PrometheusUnreachable as exc:
                self._failures += 1
                self.metrics.failures.inc()
                if self._failures == 1:
                    self._down_since = time.monotonic()
                    self.metrics.up.set(0)
                    self.metrics.outages.inc()
                    log.warning(
                        "Prometheus unreachable (%s): trying again with backoff, up to %d times", exc, self.retries
                    )
                if self._failures > self.retries:
                    raise PrometheusUnreachable(
                        f"Prometheus unreachable after {self._failures} tries ({exc}); started again, this "
                        "producer resumes at the first tick it has not produced"
                    ) from None
                await asyncio.sleep(min(self.max_backoff, self.backoff * 2 ** (self._failures - 1)))
                continue
            if self._failures:
                log.warning(
                    "Prometheus answers again after %d failed tries in %.1f s",
                    self._failures,
                    time.monotonic() - self._down_since,
                )
                self._failures = 0
            self.metrics.up.set(1)
            return data

    async def check(self, at: float) -> None:
        """Every query evaluated once at ``at``: :class:`PrometheusQueryError` unless each is an instant vector of
        one series per service carrying the service label."""
        for queries in self.queries.values():
            for name, expression in queries.named():
                data = await self._call(partial(self.client.query, expression, at))
                instant_values(data, self.label, name, expression)

    async def readings_at(self, tick: int) -> Readings:
        """Each service's readings at ``tick * interval``; a service read at the tick before and absent now is counted
        as missing."""
        at = tick * self.interval
        answers: dict[str | None, dict[str, dict[str, float]]] = {}
        for resource, queries in self.queries.items():
            answers[resource] = {}
            for name, expression in queries.named():
                data = await self._call(partial(self.client.query, expression, at))
                answers[resource][name] = instant_values(data, self.label, name, expression)
        readings = combine(answers)
        self._note_missing(tick, readings)
        return readings

    async def range_readings(self, first: int, last: int) -> Iterator[tuple[int, Readings]]:
        """The readings of ticks ``first`` to ``last`` through ``query_range``, tick by tick."""
        chunks = []
        for start in range(first, last + 1, MAX_POINTS):
            end = min(last, start + MAX_POINTS - 1)
            answers: dict[str | None, dict[str, dict[str, dict[int, float]]]] = {}
            for resource, queries in self.queries.items():
                answers[resource] = {}
                for name, expression in queries.named():
                    data = await self._call(
                        partial(
                            self.client.query_range,
                            expression,
                            start * self.interval,
                            end * self.interval,
                            self.interval,
                        )
                    )
                    answers[resource][name] = range_values(data, self.label, name, expression, self.interval)
            chunks.append((start, end, answers))
        return self._ticks(chunks)

    def _ticks(
        self, chunks: list[tuple[int, int, dict[str | None, dict[str, dict[str, dict[int, float]]]]]]
    ) -> Iterator[tuple[int, Readings]]:
        for start, end, answers in chunks:
            for tick in range(start, end + 1):
                at_tick = {
                    resource: {
                        name: {s: series[tick] for s, series in by_service.items() if tick in series}
                        for name, by_service in named.items()
                    }
                    for resource, named in answers.items()
                }
                readings = combine(at_tick)
                self._note_missing(tick, readings)
                yield tick, readings

    def _note_missing(self, tick: int, readings: Readings) -> None:
        """Count the services read at the tick before and absent now: a gap, or a pod gone (counted once)."""
        missing = self._previous - readings.keys()
        if missing:
            self.metrics.missing.inc(len(missing))
            log.info(
                "tick %d: no usage or limit for %d service(s) read at the tick before, e.g. %s",
                tick,
                len(missing),
                min(missing),
            )
        self._previous = set(readings)


@dataclass
class TickRecords:
    """What one tick writes: usage records by service, and dead letters."""

    events: list[UsageEvent | ResourceUsageEvent]
    letters: list[tuple[str, DeadLetter]]  # (service, dead letter)


def tick_records(tick: int, readings: Readings, tolerance: float, source: str, produced_at: float) -> TickRecords:
    """The usage records of one tick, with a dead letter (``topic`` the source, ``offset`` the tick) for each
    service whose values no record may carry."""
    out = TickRecords([], [])
    for service, by_resource in readings.items():
        try:
            out.events.append(usage_record(service, tick, by_resource, tolerance, produced_at))
        except DecodeError as exc:
            raw = json.dumps(
                {"service": service, "tick": tick, "readings": {str(r): vars(v) for r, v in by_resource.items()}},
                default=str,
            ).encode()
            out.letters.append((service, DeadLetter(exc.reason, exc.detail, source, 0, tick, raw, produced_at)))
    return out


class UsageWriter:
    """A transactional producer of whole ticks on the usage topic, which resumes after the last tick committed."""

    def __init__(self, bootstrap: str, topics: TopicNames, producer_id: str) -> None:
        self.bootstrap = bootstrap
        self.topics = topics
        self.producer_id = producer_id
        self._producer: AIOKafkaProducer | None = None

    async def start(self) -> int | None:
        """Start the producer (fencing a previous one with this id: its open transaction is aborted) and return the
        last tick it committed on the usage topic (None: none)."""
        self._producer = AIOKafkaProducer(
            bootstrap_servers=self.bootstrap,
            transactional_id=f"{self.topics.usage}.{self.producer_id}",
            acks="all",
            enable_idempotence=True,
            linger_ms=5,
        )
        await self._producer.start()
        try:
            partitions = await self._producer.partitions_for(self.topics.usage)
        except KafkaError:
            raise ValueError(
                f"topic {self.topics.usage} not found: create the topics first (`picrl topics create`)"
            ) from None
        return await last_tick(self.bootstrap, self.topics.usage, sorted(partitions), self.producer_id)

    async def write(self, records: TickRecords) -> None:
        """One tick's records in one transaction."""
        header = [(PRODUCER_HEADER, self.producer_id.encode())]
        producer = self._producer
        assert producer is not None, "start() first"
        async with producer.transaction():
            for event in records.events:
                await producer.send(self.topics.usage, event.to_bytes(), key=event.service.encode(), headers=header)
            for service, letter in records.letters:
                await producer.send(self.topics.deadletter, letter.to_bytes(), key=service.encode())

    async def stop(self) -> None:
        if self._producer is not None:
            await self._producer.stop()


async def last_tick(
    bootstrap: str, topic: str, partitions: list[int], producer_id: str, timeout: float = 60.0
) -> int | None:
    """The largest tick among the committed records of ``producer_id`` on ``partitions`` of ``topic`` (None: none),
    read back from each partition's end ``RESUME_CHUNK`` offsets at a time until one of its records shows."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, isolation_level="read_committed", enable_auto_commit=False)
    await consumer.start()
    ours = producer_id.encode()
    found: int | None = None
    try:
        tps = [TopicPartition(topic, p) for p in partitions]
        consumer.assign(tps)
        begins = await consumer.beginning_offsets(tps)
        ends = await consumer.end_offsets(tps)
        deadline = time.monotonic() + timeout
        for tp in tps:
            end = ends[tp]
            while end > begins[tp]:
                start = max(begins[tp], end - RESUME_CHUNK)
                ticks = [
                    json.loads(m.value)["tick"]
                    async for m in records_up_to(consumer, tp, start, end, deadline, timeout)
                    if (PRODUCER_HEADER, ours) in [(k, bytes(v)) for k, v in m.headers]
                ]
                if ticks:
                    found = max(ticks) if found is None else max(found, *ticks)
                    break
                end = start
    finally:
        await consumer.stop()
    return found


def first_tick(last: int | None, now: float, interval: float) -> int:
    """Where a producer starts: after the last tick it committed, else at the tick of ``now``."""
    return last + 1 if last is not None else math.floor(now / interval)


async def produce_live(
    source: PrometheusSource,
    writer: UsageWriter,
    *,
    tolerance: float,
    delay: float,
    first: int,
    stop_before: int | None = None,
) -> None:
    """Produce ticks ``first``, ``first + 1``, ... each once ``delay`` s past its instant (at once while catching
    up), until ``stop_before`` (None: forever)."""
    tick = first
    metrics = source.metrics
    while stop_before is None or tick < stop_before:
        wait = tick * source.interval + delay - time.time()
        if wait > 0:
            await asyncio.sleep(wait)
        readings = await source.readings_at(tick)
        records = tick_records(tick, readings, tolerance, f"prometheus:{source.client.url}", time.time())
        await writer.write(records)
        _count(metrics, tick, records)
        tick += 1


async def produce_range(
    source: PrometheusSource, writer: UsageWriter, *, tolerance: float, first: int, last: int
) -> int:
    """Produce ticks ``first`` to ``last`` from ``query_range``; the number of events written."""
    sent = 0
    for tick, readings in await source.range_readings(first, last):
        records = tick_records(tick, readings, tolerance, f"prometheus:{source.client.url}", time.time())
        await writer.write(records)
        _count(source.metrics, tick, records)
        sent += len(records.events)
    return sent


def _count(metrics: SourceMetrics, tick: int, records: TickRecords) -> None:
    metrics.tick.set(tick)
    metrics.events.inc(len(records.events))
    for _, letter in records.letters:
        metrics.dead_letters.labels(letter.reason).inc()
        log.warning("tick %d: dead letter (%s): %s", tick, letter.reason, letter.detail)


def backfill_rows(
    ticks: Iterator[tuple[int, Readings]], interval: float, tolerance: float, resources: Sequence[str | None]
) -> dict[str, list[dict[str, str]]]:
    """Per service, one CSV row per tick: ``time`` (epoch seconds) and, per resource (columns prefixed
    ``<resource>_`` when named), ``usage``, ``limit`` and ``censored`` (1/0); a tick without readings, or with
    values no record may carry, has empty cells."""
    rows: dict[str, dict[int, dict[str, str]]] = {}
    span: list[int] = []
    for tick, readings in ticks:
        span.append(tick)
        for service, by_resource in readings.items():
            try:
                record = usage_record(service, tick, by_resource, tolerance, 0.0)
            except DecodeError:
                continue
            row: dict[str, str] = {}
            for resource in resources:
                one = record if isinstance(record, UsageEvent) else record.resources[str(resource)]
                prefix = f"{resource}_" if resource else ""
                row[prefix + "usage"] = repr(one.usage)
                row[prefix + "limit"] = repr(one.capacity)
                row[prefix + "censored"] = str(int(one.censored))
            rows.setdefault(service, {})[tick] = row
    return {
        service: [{"time": repr(tick * interval), **by_tick.get(tick, {})} for tick in span]
        for service, by_tick in rows.items()
    }
