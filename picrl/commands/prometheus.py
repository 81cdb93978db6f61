"""``picrl produce prometheus``: usage events (or a training CSV) from the series a Prometheus server keeps."""

from __future__ import annotations

import argparse
import asyncio
import csv
import math
import re
import signal
import textwrap
import time
from datetime import UTC, datetime
from pathlib import Path

from prometheus_client import start_http_server

from picrl.commands.bus import add_bus_arguments, configure_logging, reachable_bootstrap, settings_from_args
from picrl.settings import resource_names
from producers.prometheus import (
    PrometheusClient,
    PrometheusSource,
    ResourceQueries,
    UsageWriter,
    backfill_rows,
    first_tick,
    produce_live,
    produce_range,
)
from stream.metrics import SourceMetrics
from stream.topics import TopicNames

MEMORY_USAGE = 'max by (namespace, pod, container) (container_memory_working_set_bytes{container!=""})'
EXAMPLES = """examples (cAdvisor and kube-state-metrics; docs/guide/prometheus.md explains each query):
  picrl produce prometheus --url http://prometheus:9090 --service-label container --interval 60 \\
    --usage 'max by (container) (container_memory_working_set_bytes{namespace="shop",container!=""})' \\
    --limit 'max by (container) (kube_pod_container_resource_limits{namespace="shop",resource="memory"})' \\
    --shortage 'max by (container) (increase(kube_pod_container_status_restarts_total{namespace="shop"}[2m]))'
  the same history as a training CSV per service:
  picrl produce prometheus ... --from 2026-11-01T00:00:00 --to 2026-11-08T00:00:00 --out history/"""


def _time(text: str) -> float:
    """``--from``/``--to``: epoch seconds or an ISO 8601 date-time (UTC unless it names a zone)."""
    try:
        return float(text)
    except ValueError:
        pass
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is neither epoch seconds nor an ISO 8601 date-time") from None
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()


def _positive(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a number > 0; got {text}")
    return value


def _resource(text: str) -> str:
    try:
        return resource_names(text)[0]
    except (ValueError, IndexError) as exc:
        raise argparse.ArgumentTypeError(str(exc) or "expected a resource name") from None


def register(kinds: argparse._SubParsersAction) -> None:
    parser = kinds.add_parser(
        "prometheus",
        help="read usage, limits and shortages from a Prometheus server, one event per service per tick",
        description=textwrap.fill(
            "Every --interval seconds, evaluate the queries at time = k * interval (an instant query, "
            "/api/v1/query) and produce one usage event per service to <prefix>.usage: usage, the limit as the "
            "capacity in force, censored when usage >= limit * (1 - tolerance) or the shortage query is above 0. "
            "Each query must return an instant vector with one series per service, each carrying --service-label. "
            "Each tick is one Kafka transaction; started again, the producer resumes at the first tick it has not "
            "produced (no gap, no duplicate). With --from and --to, read that history through /api/v1/query_range "
            "instead: to the topic, or with --out to one CSV per service for `picrl train --trace`.",
            100,
        ),
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    group = parser.add_argument_group("Prometheus")
    group.add_argument("--url", required=True, help="the server, e.g. http://prometheus.monitoring:9090")
    group.add_argument(
        "--usage",
        action="append",
        required=True,
        metavar="QUERY",
        help="PromQL of each service's usage, one series per service, e.g. "
        f"'{MEMORY_USAGE}' (with several --resource: once per resource, in their order)",
    )
    group.add_argument(
        "--limit",
        action="append",
        required=True,
        metavar="QUERY",
        help="PromQL of the capacity in force (the unit of --usage), e.g. 'max by (namespace, pod, container) "
        '(kube_pod_container_resource_limits{resource="memory"})\'; a service without a limit gets no event',
    )
    group.add_argument(
        "--shortage",
        action="append",
        metavar="QUERY",
        help="optional PromQL whose value above 0 marks the tick short (censored) whatever usage says, e.g. "
        "'max by (namespace, pod, container) (increase(kube_pod_container_status_restarts_total[2m]))' or the "
        "CFS throttled share 'rate(container_cpu_cfs_throttled_periods_total[2m]) / "
        "rate(container_cpu_cfs_periods_total[2m]) > 0.25'; an absent series counts as 0",
    )
    group.add_argument(
        "--service-label",
        required=True,
        metavar="LABEL",
        help="the label naming the service on every series, e.g. container; join several with "
        'label_join(QUERY, "service", "/", "namespace", "pod", "container") and give service',
    )
    group.add_argument(
        "--interval",
        type=_positive,
        default=60.0,
        metavar="SECONDS",
        help="the tick: queries are evaluated at multiples of it since the epoch (default 60)",
    )
    group.add_argument(
        "--delay",
        type=float,
        default=5.0,
        metavar="SECONDS",
        help="how long after a tick's instant to query it, for the scrape before it to be stored (default 5)",
    )
    group.add_argument(
        "--tolerance",
        type=float,
        default=0.05,
        help="usage within this share of the limit counts as at the limit (censored): a working set sampled at "
        "its limit reads a little under it (default 0.05)",
    )
    group.add_argument(
        "--resource",
        action="append",
        type=_resource,
        metavar="NAME",
        help="emit schema-2 records (a resources map) for workers started with --resources; repeat it "
        "for several resources, each with its own --usage and --limit (and --shortage), e.g. "
        "--resource gpu_mem ... --resource gpu_compute ...",
    )
    group.add_argument("--timeout", type=_positive, default=10.0, metavar="SECONDS", help="per request (default 10)")
    group.add_argument(
        "--retries",
        type=int,
        default=8,
        help="failed requests in a row (backoff 0.5 s doubling to 30 s) before exiting; started again, the "
        "producer resumes where it stopped (default 8)",
    )
    history = parser.add_argument_group("history (both --from and --to: query_range instead of polling)")
    history.add_argument(
        "--from",
        dest="start",
        type=_time,
        metavar="TIME",
        help="first instant: epoch seconds or ISO 8601, UTC unless a zone is given, e.g. 2026-11-01T00:00:00",
    )
    history.add_argument("--to", dest="end", type=_time, metavar="TIME", help="last instant, as --from")
    history.add_argument(
        "--out",
        type=Path,
        metavar="FOLDER",
        help="write <service>.csv files (time, usage, limit, censored; <resource>_ prefixes with --resource) "
        "for `picrl train --trace FILE --column usage --time-column time` instead of producing",
    )
    parser.add_argument(
        "--producer-id",
        default="prometheus",
        metavar="ID",
        help="names this producer's transactions and records; a producer started again with the same id fences "
        "the old one and resumes after its last tick (default prometheus)",
    )
    parser.add_argument("--metrics-port", type=int, metavar="PORT", help="serve this producer's metrics")
    parser.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    add_bus_arguments(parser, partitions=False)
    parser.set_defaults(handler=run)


def queries_from_args(args: argparse.Namespace) -> dict[str | None, ResourceQueries]:
    """One :class:`ResourceQueries` per ``--resource`` (the single resource ``None`` without it)."""
    resources: list[str | None] = list(args.resource or [None])
    shortage = args.shortage or []
    if len(set(resources)) != len(resources):
        raise ValueError(f"--resource names repeated: {resources}")
    if (
        len(args.usage) != len(resources)
        or len(args.limit) != len(resources)
        or len(shortage) not in (0, len(resources))
    ):
        raise ValueError(
            f"{len(resources)} resource(s): give --usage and --limit once each per resource (and --shortage "
            f"once per resource or not at all); got {len(args.usage)} --usage, {len(args.limit)} --limit, "
            f"{len(shortage)} --shortage"
        )
    return {
        resource: ResourceQueries(args.usage[i], args.limit[i], shortage[i] if shortage else None)
        for i, resource in enumerate(resources)
    }


def run(args: argparse.Namespace) -> int:
    configure_logging(args.log_level)
    if (args.start is None) != (args.end is None) or (args.out and args.start is None):
        raise ValueError("--from and --to go together (and --out needs them)")
    if args.delay < 0:
        raise ValueError(f"--delay must be >= 0 seconds; got {args.delay}")
    if not 0 <= args.tolerance < 1:
        raise ValueError(f"--tolerance must be in [0, 1); got {args.tolerance}")
    metrics = SourceMetrics()
    if args.metrics_port is not None:
        start_http_server(args.metrics_port, registry=metrics.registry)
    source = PrometheusSource(
        PrometheusClient(args.url, args.timeout),
        queries_from_args(args),
        args.service_label,
        args.interval,
        retries=args.retries,
        metrics=metrics,
    )
    asyncio.run(source.check(time.time()))  # a query of the wrong shape stops here, before anything is produced
    if args.out is not None:
        return write_backfill(source, args)
    settings = settings_from_args(args)
    bootstrap = reachable_bootstrap(settings)
    writer = UsageWriter(bootstrap, TopicNames(settings["prefix"]), args.producer_id)
    return asyncio.run(_produce(source, writer, args))


async def _produce(source: PrometheusSource, writer: UsageWriter, args: argparse.Namespace) -> int:
    task = asyncio.current_task()
    assert task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)  # abort the open transaction
    last = await writer.start()
    try:
        if args.start is not None:
            first = math.ceil(args.start / source.interval)
            if last is not None:
                first = max(first, last + 1)  # the ticks already produced are not produced again
            final = math.floor(args.end / source.interval)
            sent = await produce_range(source, writer, tolerance=args.tolerance, first=first, last=final)
            print(f"produced {sent} usage events of ticks {first} to {final} to {writer.topics.usage}")
            return 0
        first = first_tick(last, time.time(), source.interval)
        print(
            f"producing to {writer.topics.usage} from tick {first}"
            + (f" (after tick {last}, the last one produced)" if last is not None else ""),
            flush=True,
        )
        await produce_live(source, writer, tolerance=args.tolerance, delay=args.delay, first=first)
    except asyncio.CancelledError:
        return 0
    finally:
        await writer.stop()
    return 0


def write_backfill(source: PrometheusSource, args: argparse.Namespace) -> int:
    """``--out``: one CSV per service of the ticks from ``--from`` to ``--to``."""
    first, last = math.ceil(args.start / source.interval), math.floor(args.end / source.interval)
    if last < first:
        raise ValueError(f"--from {args.start:g} to --to {args.end:g} holds no tick of {source.interval:g} s")
    ticks = asyncio.run(source.range_readings(first, last))
    resources = list(source.queries)
    rows = backfill_rows(ticks, source.interval, args.tolerance, resources)
    args.out.mkdir(parents=True, exist_ok=True)
    columns = ["time"] + [f"{r}_{name}" if r else name for r in resources for name in ("usage", "limit", "censored")]
    files = {service: re.sub(r"[^A-Za-z0-9_.-]", "_", service) + ".csv" for service in rows}
    if len(set(files.values())) < len(files):
        raise ValueError("services whose names differ only in characters a file name cannot hold: choose a label")
    for service, service_rows in rows.items():
        path = args.out / files[service]
        with path.open("w", newline="") as handle:
            writer = csv.DictWriter(handle, columns, restval="")
            writer.writeheader()
            writer.writerows(service_rows)
        print(f"{service}: {path}")
    print(f"{len(rows)} services, ticks {first} to {last} ({last - first + 1} rows each) in {args.out}")
    return 0
