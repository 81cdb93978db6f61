"""``picrl up``: the whole product on one machine — broker, topics, worker, trainer and a closed loop."""

from __future__ import annotations

import argparse
import asyncio
import logging
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from picrl.commands.bus import add_replication_arguments, bootstrap_or_local, wait_for_kafka
from picrl.commands.produce import (
    OOM_DATASET,
    RESOURCE_DATASET,
    TEST_FRACTION,
    play_closed_loop,
    print_summary,
    resource_names_argument,
)
from picrl.commands.source import add_training_options, cached_model, config_from_args
from picrl.datasets import DATASETS, Trace, load_dataset, prepare_trace
from picrl.kafka import LocalKafka
from picrl.reports.closed_loop import write_report
from picrl.settings import SettingsError, load_settings
from picrl.workloads import copies_of, resource_fleet_of
from picrl_core.rules import DEPLOYABLE_METHODS
from picrl_core.series import prepare_series
from producers.workload import Workload
from stream.topics import cluster_brokers, ensure_topics, topic_specs
from stream.trainer_replay import TrainerSettings, untrained_transitions

PARTITIONS = 4
TRAINER_CATCH_UP_SECONDS = 120.0  # longest wait, after the loop, for the trainer to train on the loop's replay


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "up",
        help="run everything: local broker, topics, a worker, the trainer and a closed loop on a bundled trace",
        description="The main job in one command. Starts the local Kafka broker (unless --bootstrap is given), "
        "trains the model on the trace's training split (cached after the first run), creates a fresh "
        "set of topics, starts a stream worker and the policy trainer as child processes and plays the "
        "closed-loop environment over Kafka on the trace's test split for --services shifted and scaled "
        "copies. Shows live progress (ticks, censoring rate, policy version), prints MAE and regret and "
        "writes metrics.json, ticks.csv, closed_loop.png and the processes' logs to --out. After the loop it "
        f"waits, at most {TRAINER_CATCH_UP_SECONDS:.0f} s, until the trainer has trained on the loop's replay; "
        "everything it started is stopped then, or on Ctrl-C. With --resources gpu_mem,gpu_compute it plays "
        "the GenAI pods provisioned on GPU memory and GPU compute at once (dataset pods-2r): the "
        "worker decides both capacities of a pod together, a memory shortage censors its compute too, "
        "and the report adds per-resource metrics and resources.png.",
    )
    parser.add_argument("--bootstrap", metavar="HOST:PORT", help="use this Kafka cluster instead of the local broker")
    parser.add_argument(
        "--brokers",
        type=int,
        default=None,
        help="brokers of the local cluster started when none runs (default 1; 2 or more come with 3 dedicated "
        "controllers; `picrl kafka start`)",
    )
    add_replication_arguments(parser)
    parser.add_argument(
        "--dataset",
        choices=sorted([*DATASETS, RESOURCE_DATASET, OOM_DATASET]),
        default=None,
        help=f"bundled trace (default genai-mem; {RESOURCE_DATASET} with --resources, or "
        f"{OOM_DATASET}, where a memory shortage kills the pod)",
    )
    parser.add_argument(
        "--resources",
        metavar="NAMES",
        type=resource_names_argument,
        help=f"decide these resources of each service together, comma separated: gpu_mem,gpu_compute "
        f"(the resources of {RESOURCE_DATASET}, each of its pods a service)",
    )
    parser.add_argument("--services", type=int, default=4, help="number of services (default 4)")
    parser.add_argument(
        "--ticks",
        type=int,
        default=240,
        help="ticks per service, warm-up included (default 240; GenAI-Mem's test split has 289)",
    )
    add_training_options(parser)
    parser.add_argument(
        "--method",
        choices=DEPLOYABLE_METHODS,
        default="pic-rl",
        help="the deployable method the worker runs (default pic-rl; a method without a policy network runs "
        "without the trainer)",
    )
    parser.add_argument("--out", type=Path, default=Path("runs/up"), help="output folder (default runs/up)")
    parser.set_defaults(handler=run)


def hard_shortage(trace: Trace) -> str:
    """The worker's ``--hard-shortage`` for a fleet provisioned on several resources: ``pod`` where a memory
    shortage kills the pod (``pods-2r-oom``), else ``requests``."""
    return "pod" if trace.oom_kills else "requests"


def _workload(trace: Trace, services: int, ticks: int, seed: int) -> Workload:
    """The closed loop's services on the trace's test split: shifted, scaled copies of a series, or the first
    pods of a fleet provisioned on several resources."""
    if trace.resources:
        return resource_fleet_of(trace, services, ticks, start=int(trace.values.shape[0] * (1 - TEST_FRACTION)))
    return copies_of(trace, services, ticks, start=int(trace.values.size * (1 - TEST_FRACTION)), seed=seed)


@contextmanager
def _broker(bootstrap: str | None, brokers: int | None) -> Iterator[str]:
    """The given cluster once it answers (within the ``bootstrap_timeout`` default), else the local one (``brokers``
    nodes, started now and stopped after, unless already running)."""
    if bootstrap:
        wait_for_kafka(
            bootstrap,
            load_settings(None, {})["bootstrap_timeout"],
            lambda line: print(f"picrl up: {line}", file=sys.stderr, flush=True),
        )
        yield bootstrap
        return
    broker = LocalKafka(brokers=brokers, log=lambda line: print(f"kafka: {line}", flush=True))
    if broker.status() is not None:
        yield bootstrap_or_local(None)
        return
    info = broker.start()
    print(f"kafka: local broker up at {info.bootstrap} ({len(info.nodes)} node(s))", flush=True)
    try:
        yield info.bootstrap
    finally:
        broker.stop()
        print("kafka: local broker stopped", flush=True)


@contextmanager
def _child(args: list[str], log: Path) -> Iterator[subprocess.Popen]:
    with open(log, "wb") as out:
        process = subprocess.Popen([sys.executable, "-m", "picrl", *args], stdout=out, stderr=subprocess.STDOUT)
        try:
            yield process
        finally:
            if process.poll() is None:
                process.terminate()
                try:
                    process.wait(30)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()


def trainer_tally(log: Path) -> str:
    """What the trainer said when it stopped: the versions it published and the candidates it skipped (a candidate
    is published only when it differs from its parent by ``--min-kl`` and scores better on held-out transitions)."""
    said = re.search(r"stopped after (\d+) version\(s\) published, (\d+) candidate\(s\) skipped", log.read_text())
    if said is None:
        return f"trainer: did not say what it published (see {log})"
    return (
        f"trainer: {said[1]} version(s) published, {said[2]} candidate(s) skipped (a candidate is published only "
        "when it differs from its parent and scores better on held-out transitions)"
    )


def await_trainer(trainer: subprocess.Popen, settings: TrainerSettings, update_every: int, timeout: float) -> None:
    """Wait, at most ``timeout`` seconds, until the trainer has trained a candidate on every ``update_every``
    transitions of the replay (fewer than that left past its committed offsets), so that stopping it loses none
    of the loop's candidates; a trainer that started late on a loaded machine is still reading then."""
    deadline = time.monotonic() + timeout
    told = -1
    while trainer.poll() is None:
        left = asyncio.run(untrained_transitions(settings, PARTITIONS))
        if left < update_every:
            return
        if time.monotonic() > deadline:
            print(f"warning: stopping the trainer after {timeout:.0f} s of waiting, {left} transitions not trained on")
            return
        if left != told:
            print(f"trainer: {left} transitions of the replay not yet trained on; waiting", flush=True)
            told = left
        time.sleep(1.0)


class _LeaderElection(logging.Filter):
    """Drops aiokafka's "Failed fetch offsets ... NotLeaderForPartitionError": the closed loop's first offset
    look-up on a topic created a moment ago, which the fetcher retries by itself; other errors pass."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not (message.startswith("Failed fetch offsets") and "NotLeaderForPartitionError" in message)


def run(args: argparse.Namespace) -> int:
    # The first sends to the topics created here meet partitions whose leader is still being elected;
    # aiokafka retries them and warns each time ("NotLeaderForPartitionError"). A send that keeps
    # failing still raises, so only the retries are kept off the output; the same goes for the first
    # offset look-ups of the actions consumer.
    logging.getLogger("aiokafka.producer.sender").setLevel(logging.ERROR)
    logging.getLogger("aiokafka.consumer.fetcher").addFilter(_LeaderElection())
    dataset = args.dataset or (RESOURCE_DATASET if args.resources else "genai-mem")
    trace = load_dataset(dataset)
    if args.resources and tuple(args.resources) != trace.resources:
        raise SettingsError(
            f"--resources {','.join(args.resources)}: dataset {dataset} provides "
            f"{','.join(trace.resources) or 'one resource per service'}; the bundled fleets with "
            f"several resources are {RESOURCE_DATASET} and {OOM_DATASET} (gpu_mem,gpu_compute)"
        )
    series = (
        prepare_trace(trace)
        if trace.resources
        else prepare_series(trace.values, trace.name, trace.context, trace.context_names)
    )
    artifact, model, trained = cached_model(trace, series, config_from_args(args), method=args.method)
    print(f"model: {'trained and cached in' if trained else 'cached'} {model}", flush=True)
    workload = _workload(trace, args.services, args.ticks, args.seed)
    args.out.mkdir(parents=True, exist_ok=True)
    prefix = f"picrl-up-{time.strftime('%Y%m%d-%H%M%S')}"
    with ExitStack() as stack:
        bootstrap = stack.enter_context(_broker(args.bootstrap, args.brokers))
        replication = load_settings(
            None, {"replication_factor": args.replication_factor, "min_insync_replicas": args.min_insync_replicas}
        ).replication(asyncio.run(cluster_brokers(bootstrap)))
        asyncio.run(ensure_topics(bootstrap, topic_specs(prefix, PARTITIONS), replication))
        common = [
            "--model",
            str(model),
            "--bootstrap",
            bootstrap,
            "--prefix",
            prefix,
            "--partitions",
            str(PARTITIONS),
            "--replication-factor",
            str(replication.factor),
            "--min-insync-replicas",
            str(replication.min_insync),
        ]
        resources = (
            ["--resources", ",".join(trace.resources), "--hard-shortage", hard_shortage(trace)]
            if trace.resources
            else []
        )
        worker = stack.enter_context(
            _child(
                ["worker", *common, "--app-id", f"{prefix}-worker", "--method", args.method, *resources],
                args.out / "worker.log",
            )
        )
        children = {"worker": worker}
        if artifact.policy is not None:  # a method that learns a policy: the trainer refines it
            children["trainer"] = stack.enter_context(_child(["trainer", *common], args.out / "trainer.log"))
        pids = ", ".join(f"{name} pid {process.pid}" for name, process in children.items())
        print(f"topics {prefix}.*: {pids} (logs in {args.out})", flush=True)
        record = play_closed_loop(bootstrap, prefix, workload, action_timeout=120.0)
        if "trainer" in children:
            settings = TrainerSettings(bootstrap, prefix)
            await_trainer(children["trainer"], settings, artifact.config.online.n_update, TRAINER_CATCH_UP_SECONDS)
        for name, process in children.items():
            if process.poll() is not None:
                print(f"warning: the {name} exited early (code {process.returncode}); see {args.out / (name + '.log')}")
    what = f"{args.services} pods of {trace.name}" if trace.resources else f"{args.services} copies of {trace.name}"
    summary = write_report(record, args.out, f"picrl up: {args.method} on {what} (test split) over Kafka")
    print_summary(summary, args.out)
    if artifact.policy is not None:
        print(trainer_tally(args.out / "trainer.log"))
    print(
        f"how to read these next to `picrl evaluate` (the README's results): the native row is the capacity the "
        f"worker decided against the demand over the {summary['control_ticks']} control ticks of {args.services} "
        "services, pooled (MAE and rates are means, regret a sum); in the normalised row each service is scaled by "
        "its own demand range over this run. Every service is "
        f"{'a pod (each of its resources a row)' if trace.resources else 'a shifted, scaled copy'} "
        "that starts cold (its first range from its first window of ticks, not the training range). `evaluate` "
        "scores one series over the whole test split (native units, and units of its training range), so the two "
        "are not comparable one to one."
    )
    return 0
