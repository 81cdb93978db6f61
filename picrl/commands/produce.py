"""``picrl produce replay|closed-loop|prometheus``: put usage telemetry on the bus from a trace (or from Prometheus,
:mod:`picrl.commands.prometheus`)."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

from picrl.commands import prometheus
from picrl.commands.bus import add_bus_arguments, command_logging, reachable_bootstrap, settings_from_args
from picrl.commands.source import add_trace_source, load_trace
from picrl.datasets import load_dataset, load_pod_fleet
from picrl.progress import progress_bar
from picrl.reports.closed_loop import COLUMNS, write_report
from picrl.settings import SettingsError, resource_names
from picrl.workloads import copies_of, fleet_of, resource_fleet_of
from producers.closed_loop import ClosedLoopEnvironment, ClosedLoopRecord, NoActionError, TickSummary
from producers.replay import replay_usage
from producers.workload import Workload
from stream.topics import TopicNames

TEST_FRACTION = 0.2  # the chronological test split: the part a trained model never saw
RESOURCE_DATASET = "pods-2r"  # the bundled fleet provisioned on several resources
OOM_DATASET = "pods-2r-oom"  # the same, its memory shortages killing the pod


def resource_names_argument(text: str) -> tuple[str, ...]:
    """``--resources`` as argparse reads it: known, distinct resource names, comma separated."""
    try:
        return resource_names(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _add_workload_arguments(parser: argparse.ArgumentParser, ticks_default: int | None) -> None:
    add_trace_source(parser, pods=True)
    parser.add_argument("--services", type=int, default=4, help="number of services (default 4)")
    parser.add_argument(
        "--ticks",
        type=int,
        default=ticks_default,
        help="ticks per service"
        + (f" (default {ticks_default})" if ticks_default else " (default: the whole trace part)"),
    )
    parser.add_argument(
        "--part",
        choices=("test", "all"),
        default="test",
        help="trace part to play: the last 20%% (the test split, default) or all of it",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the services' shifts and scales (default 0)")
    add_bus_arguments(parser, partitions=False)


def pods_with_resources(
    names: tuple[str, ...], services: int, ticks: int | None, part: str = "test", hard_shortage: str = "requests"
) -> Workload:
    """The first ``services`` pods of the fleet provisioned on the resources ``names`` (``pods-2r``: gpu_mem and
    gpu_compute), over the test split (``part="test"``) or the whole trace, ``ticks`` long (None: to the end);
    ``hard_shortage="pod"``: a memory shortage kills the pod (``pods-2r-oom``)."""
    trace = load_dataset(OOM_DATASET if hard_shortage == "pod" else RESOURCE_DATASET)
    if tuple(names) != trace.resources:
        raise SettingsError(
            f"resources {','.join(names)}: the bundled fleet {trace.name} provides "
            f"{','.join(trace.resources)}, decided together"
        )
    length = trace.values.shape[0]
    start = 0 if part == "all" else int(length * (1 - TEST_FRACTION))
    return resource_fleet_of(trace, services, ticks or length - start, start=start)


def workload_from_args(args: argparse.Namespace) -> Workload:
    """N services from the trace: shifted/scaled copies, the first N pods with ``--pods``, or the first N pods
    provisioned several resources with ``--resources``."""
    if getattr(args, "resources", None):
        return pods_with_resources(args.resources, args.services, args.ticks, args.part, args.hard_shortage)
    if getattr(args, "hard_shortage", "requests") == "pod":
        raise SettingsError(
            "--hard-shortage pod needs --resources: with one resource per service there is none to kill the pod"
        )
    if getattr(args, "pods", False):
        fleet = load_pod_fleet()
        length = min(t.values.size for t in fleet)
        start = 0 if args.part == "all" else int(length * (1 - TEST_FRACTION))
        return fleet_of(fleet, args.services, args.ticks or length - start, start=start)
    trace = load_trace(args)
    for note in trace.notes:
        print(f"note: {note}")
    start = 0 if args.part == "all" else int(trace.values.size * (1 - TEST_FRACTION))
    return copies_of(trace, args.services, args.ticks or trace.values.size - start, start=start, seed=args.seed)


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "produce",
        help="produce usage telemetry from a trace (open-loop replay or closed loop) or from Prometheus",
        description="Put usage events on <prefix>.usage from a trace, for N services.",
    )
    kinds = parser.add_subparsers(dest="kind", metavar="KIND", required=True)
    replay = kinds.add_parser(
        "replay",
        help="replay usage as a cluster on static allocations would report it",
        description="Open loop: each service runs on a fixed capacity of --capacity-headroom times its peak and "
        "reports min(demand, capacity) and the censored flag every tick, paced to --rate events/s. "
        "Service 0 is the trace; the others are copies shifted in time and scaled (or pods, --pods).",
    )
    _add_workload_arguments(replay, None)
    replay.add_argument("--rate", type=float, required=True, help="events per second, all services together")
    replay.add_argument(
        "--capacity-headroom",
        type=float,
        default=1.0,
        help="static capacity as a multiple of each service's peak (below 1 censors the peaks)",
    )
    replay.set_defaults(handler=run_replay)
    loop = kinds.add_parser(
        "closed-loop",
        help="the counterfactual environment: reveal min(d, a) for the capacities workers decide",
        description="Closed loop over Kafka: each tick reveal every service's min(demand, capacity in force) and "
        "the censored flag on <prefix>.usage, then wait for the workers' actions for the next tick on "
        "<prefix>.actions (read_committed) and put them in force. Needs running workers. Writes "
        "metrics.json, ticks.csv and closed_loop.png to --out.",
    )
    _add_workload_arguments(loop, 300)
    loop.add_argument(
        "--resources",
        metavar="NAMES",
        type=resource_names_argument,
        help="play the pods of pods-2r provisioned these resources at once (gpu_mem,gpu_compute; "
        "schema-2 records): for workers started with the same --resources",
    )
    loop.add_argument(
        "--hard-shortage",
        choices=("requests", "pod"),
        default="requests",
        help="with --resources, what a memory shortage does to a pod: requests (default: the requests "
        "that do not fit fail) or pod (an OOM kill: none of the tick's load is served); for workers "
        "started with the same --hard-shortage",
    )
    loop.add_argument("--interval", type=float, default=0.0, help="seconds to pause between ticks (default 0)")
    loop.add_argument(
        "--initial-headroom",
        type=float,
        default=1.1,
        help="capacity before picrl's first decision, as a multiple of each service's peak (default 1.1)",
    )
    loop.add_argument(
        "--action-timeout",
        type=float,
        default=60.0,
        help="seconds to wait for a tick's actions before giving up (default 60)",
    )
    loop.add_argument("--out", type=Path, required=True, help="folder for metrics.json, ticks.csv, closed_loop.png")
    resume = loop.add_mutually_exclusive_group()
    resume.add_argument(
        "--resume",
        action="store_true",
        help="resume a stopped run (same workload arguments): start at the last tick for which "
        "<prefix>.actions holds every service's action",
    )
    resume.add_argument(
        "--start-tick",
        type=int,
        default=0,
        metavar="T",
        help="resume a stopped run at tick T (ticks 0..T are rebuilt from <prefix>.actions; default 0: a new run)",
    )
    loop.set_defaults(handler=run_closed_loop)
    prometheus.register(kinds)


def run_replay(args: argparse.Namespace) -> int:
    command_logging()
    settings = settings_from_args(args)
    workload = workload_from_args(args)
    bootstrap = reachable_bootstrap(settings, "produce")
    topics = TopicNames(settings["prefix"])
    with progress_bar(workload.ticks, "replay", "tick") as bar:
        sent = asyncio.run(
            replay_usage(
                bootstrap,
                topics,
                workload,
                rate=args.rate,
                capacity_headroom=args.capacity_headroom,
                on_tick=lambda _: bar.update(1),
            )
        )
    print(f"sent {sent} usage events for {len(workload.services)} services to {topics.usage}")
    return 0


def print_summary(summary: dict, out: Path) -> None:
    metrics = summary["metrics"]
    print(
        f"\n{summary['services']} services, {summary['ticks']} ticks ({summary['control_ticks']} under PIC-RL) in "
        f"{summary['seconds']:.0f} s; censoring rate {summary['censoring_rate']:.1%}; policy versions "
        f"{summary['policy_versions']}; duplicate actions {summary['duplicate_actions']}"
    )
    if metrics:
        native = summary["metrics_native"]
        rows = [(f"native ({summary['unit']})", native)] if "regret" in native else list(native.items())
        print("| units | " + " | ".join(COLUMNS) + " |")
        print("|---|" + "---|" * len(COLUMNS))
        for units, values in [*rows, ("normalised", metrics)]:  # native units first
            print(f"| {units} | " + " | ".join(f"{values[c]:.4g}" for c in COLUMNS) + " |")
    resources = summary.get("resources")
    if resources:
        names = list(resources["weights"])
        print(f"per resource (total regret {resources['total_regret']:.4g}, weights {resources['weights']}):")
        print("| resource | regret | shortage rate |")
        print("|---|---|---|")
        for name in names:
            print(f"| {name} | {resources['regret_' + name]:.4g} | {resources['shortage_' + name]:.3f} |")
        if "soft_short_with_hard_short" in resources:
            print(
                f"a soft resource short on {resources['soft_short_with_hard_short']:.1%} of the ticks a hard one ran "
                f"short, {resources['soft_short_otherwise']:.1%} of the others"
            )
    print(
        f"written: {out / 'metrics.json'}, {out / 'ticks.csv'}, {out / 'closed_loop.png'}"
        + (f", {out / 'resources.png'}" if resources else "")
    )


def play_closed_loop(
    bootstrap: str,
    prefix: str,
    workload: Workload,
    *,
    interval: float = 0.0,
    initial_headroom: float = 1.1,
    action_timeout: float = 60.0,
    start_tick: int | None = 0,
) -> ClosedLoopRecord:
    """Run the environment with a live progress bar (ticks, censoring rate, policy version)."""
    with progress_bar(workload.ticks, "closed loop", "tick") as bar:

        def progress(summary: TickSummary) -> None:
            bar.set_postfix(
                censored=f"{summary.censoring_rate:.1%}",
                policy=summary.policy_version,
                picrl=f"{summary.control_services}/{len(workload.services)}",
            )
            bar.update(1)

        env = ClosedLoopEnvironment(
            bootstrap,
            TopicNames(prefix),
            workload,
            initial_headroom=initial_headroom,
            interval=interval,
            action_timeout=action_timeout,
            start_tick=start_tick,
            on_tick=progress,
        )
        return asyncio.run(env.run())


def run_closed_loop(args: argparse.Namespace) -> int:
    command_logging()
    settings = settings_from_args(args)
    workload = workload_from_args(args)
    bootstrap = reachable_bootstrap(settings, "produce")
    try:
        record = play_closed_loop(
            bootstrap,
            settings["prefix"],
            workload,
            interval=args.interval,
            initial_headroom=args.initial_headroom,
            action_timeout=args.action_timeout,
            start_tick=None if args.resume else args.start_tick,
        )
    except NoActionError as exc:
        print(f"\nclosed loop stopped: {exc}")
        if exc.tick is not None:
            print(
                f"Once the workers answer again, resume this run where it stopped: the same command with --resume "
                f"(or --start-tick {exc.tick - 1}); usage already delivered is not decided twice."
            )
        return 1
    summary = write_report(record, args.out, f"closed loop over Kafka: {len(workload.services)} services")
    print_summary(summary, args.out)
    return 0
