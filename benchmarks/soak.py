"""Soak: a long closed loop under real faults, outside the test suite.

    python benchmarks/soak.py --model DIR [--minutes 30] [--brokers 3] [--kill-every 60 120] [--out DIR]

Starts its own Kafka cluster of ``--brokers`` nodes (a fresh folder, stopped at the end) and plays rounds of a
closed loop until ``--minutes`` have passed: each round is a fresh set of topics with ``--partitions``
partitions (replicated as the worker would: min(3, nodes) replicas), two workers of one app id at their default
settings and ``--services`` shifted and scaled copies of ``--dataset`` for ``--ticks`` ticks. Every
``--kill-every`` seconds (uniform in the range, seeded) one of the two workers or (one time in
``--broker-share``) a Kafka node is SIGKILLed, whatever the round is doing. A worker's kill is, by
``--worker-faults``, of its command (started again at once: a new interpreter, as a supervisor restarts a crashed
container), of its worker process (which the command forks again: ``respawn``, on by default on Linux), or of
each in turn (``both``, the default). On a
cluster the node is the one leading the most partitions or the active controller, in turn, and it stays away
for ``--node-away`` ticks while the loop goes on on the others; a single node restarts at once on its port and
data. After each round the actions are read back with ``read_committed`` and audited against the
uninterrupted reference (the simulator on the same workload): gaps (a (service, tick) with no action),
duplicates and mismatches must all be zero; and no worker may have exited by itself.

Prints one line per fault (time to recover: from the kill to the next tick's actions all in force) and a
summary (kills, recoveries, p50/max time to recover, gaps, duplicates, mismatches), written to
``soak.json`` in ``--out`` with the machine's description. The harness is the chaos test's
(tests/support/chaos.py); a model for the workers comes from ``picrl train --dataset genai-mem --quick``.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import math
import os
import random
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the chaos harness lives in tests/support

from host import describe  # noqa: E402

from picrl.datasets import load_dataset  # noqa: E402
from picrl.kafka import LocalKafka  # noqa: E402
from picrl.workloads import copies_of  # noqa: E402
from picrl_core.artifact import load_artifact  # noqa: E402
from producers.closed_loop import ClosedLoopEnvironment, NoActionError  # noqa: E402
from stream.topics import Replication, TopicNames, ensure_topics, topic_specs  # noqa: E402
from tests.support.chaos import BROKER, CONTROLLER, LEADER, NODES, PROCESS, Chaos, Fault, audit  # noqa: E402


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, required=True, help="a model folder (picrl train)")
    parser.add_argument("--dataset", default="genai-mem", help="bundled dataset the services copy (default genai-mem)")
    parser.add_argument("--minutes", type=float, default=30.0, help="how long to keep playing rounds (default 30)")
    parser.add_argument(
        "--kill-every",
        type=float,
        nargs=2,
        default=(60.0, 120.0),
        metavar=("MIN", "MAX"),
        help="seconds between kills, uniform in [MIN, MAX] (default 60 120)",
    )
    parser.add_argument(
        "--brokers", type=int, default=3, help="Kafka brokers (default 3; 2 or more come with 3 dedicated controllers)"
    )
    parser.add_argument("--broker-share", type=int, default=3, help="one kill in N is a Kafka node's (default 3)")
    parser.add_argument(
        "--node-away", type=int, default=40, help="ticks a killed node stays away on a cluster (default 40)"
    )
    parser.add_argument(
        "--worker-faults",
        choices=("command", "process", "both"),
        default="both",
        help="a worker's kill: of its command, restarted at once; of its worker process, forked again by the "
        "command; or each in turn (default both)",
    )
    parser.add_argument("--services", type=int, default=12)
    parser.add_argument("--ticks", type=int, default=1000, help="ticks per round (default 1000)")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument(
        "--action-timeout",
        type=float,
        default=300.0,
        help="seconds without a tick's actions after which the round counts as stalled (default 300)",
    )
    parser.add_argument(
        "--worker-log-level", default="warning", choices=("debug", "info", "warning"), help="(default warning)"
    )
    parser.add_argument("--seed", type=int, default=15)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/soak"))
    return parser.parse_args()


class KillClock:
    """The plan of :class:`Chaos` by wall time: a kill every ``every`` seconds (uniform), of a worker or, one
    time in ``broker_share``, of a Kafka node (on a cluster the lead node and the active controller in turn)."""

    def __init__(
        self, every: tuple[float, float], workers: int, broker_share: int, brokers: int, seed: int, faults: str
    ) -> None:
        self.rng = random.Random(seed)
        self.every, self.workers, self.broker_share = every, workers, broker_share
        self.nodes = itertools.cycle([LEADER, CONTROLLER] if brokers > 1 else [BROKER])
        self.kinds = itertools.cycle({"command": [""], "process": [PROCESS], "both": ["", PROCESS]}[faults])
        self.next = time.monotonic() + self.rng.uniform(*every)

    def __call__(self, tick: int) -> int | str | None:
        if time.monotonic() < self.next:
            return None
        self.next = time.monotonic() + self.rng.uniform(*self.every)
        if self.rng.randrange(self.broker_share) == 0:
            target: int | str = next(self.nodes)
        else:
            index, kind = self.rng.randrange(self.workers), next(self.kinds)
            target = f"{kind}{index}" if kind else index
        print(
            f"{time.strftime('%H:%M:%S')} tick {tick}: SIGKILL "
            + (
                str(target)
                if target in NODES
                else f"{'worker process' if str(target).startswith(PROCESS) else 'worker'} "
                f"{str(target).removeprefix(PROCESS)}"
            ),
            flush=True,
        )
        return target


def _median(values: list[float]) -> float | None:
    kept = [v for v in values if not math.isnan(v)]
    return round(float(np.median(kept)), 1) if kept else None


def _max(values: list[float]) -> float | None:
    kept = [v for v in values if not math.isnan(v)]
    return round(max(kept), 1) if kept else None


def main() -> int:
    args = _arguments()
    artifact = load_artifact(args.model)
    window = artifact.config.predictor.window
    trace = load_dataset(args.dataset)
    clock = KillClock(tuple(args.kill_every), 2, args.broker_share, args.brokers, args.seed, args.worker_faults)
    deadline = time.monotonic() + args.minutes * 60
    load_before = os.getloadavg()
    rounds: list[dict] = []
    faults: list[Fault] = []
    exited: list[str] = []
    with tempfile.TemporaryDirectory(prefix="picrl-soak-") as home:
        broker = LocalKafka(home=Path(home) / "kafka", brokers=args.brokers, log=lambda _: None)
        bootstrap = broker.start().bootstrap
        try:
            while time.monotonic() < deadline:
                broker.start()  # a node killed late in the last round may still be away: its topics need every node
                index = len(rounds)
                workload = copies_of(trace, args.services, min(args.ticks, trace.values.size), seed=args.seed + index)
                prefix = f"soak-{index}-{int(time.time())}"
                asyncio.run(
                    ensure_topics(
                        bootstrap, topic_specs(prefix, args.partitions), Replication.for_brokers(args.brokers)
                    )
                )
                worker_args = [
                    "worker",
                    "--model",
                    str(args.model),
                    "--bootstrap",
                    bootstrap,
                    "--prefix",
                    prefix,
                    "--partitions",
                    str(args.partitions),
                    "--app-id",
                    f"{prefix}-worker",
                    "--log-level",
                    args.worker_log_level,
                ]
                logs = args.out / "logs" / prefix  # kept: the workers' logs of every round
                logs.mkdir(parents=True)
                chaos = Chaos(
                    worker_args, logs, 2, broker, clock, node_away=args.node_away if args.brokers > 1 else 0, fresh=True
                )
                began = time.monotonic()
                try:
                    chaos.start()
                    record = asyncio.run(
                        ClosedLoopEnvironment(
                            bootstrap,
                            TopicNames(prefix),
                            workload,
                            action_timeout=args.action_timeout,
                            on_tick=chaos.on_tick,
                        ).run()
                    )
                    exited += chaos.exited_by_themselves()
                    result = audit(record, bootstrap, prefix, artifact, window)
                except NoActionError as exc:
                    print(
                        f"round {index} stalled: {exc}\n{chaos.report()}\n"
                        f"{chaos.diagnose(bootstrap, prefix, args.partitions, f'{prefix}-worker')}\n"
                        f"worker logs: {logs}",
                        flush=True,
                    )
                    raise
                finally:
                    chaos.stop()
                faults += chaos.faults
                rounds.append(
                    {
                        "round": index,
                        "seconds": round(time.monotonic() - began, 1),
                        "checked": result.checked,
                        "gaps": len(result.missing),
                        "duplicates": len(result.repeated),
                        "mismatches": result.mismatches,
                        "faults": len(chaos.faults),
                        "load_average": [round(v, 2) for v in os.getloadavg()],
                    }
                )
                print(
                    f"round {index}: {workload.ticks} ticks x {args.services} services in "
                    f"{rounds[-1]['seconds']:.0f} s, {len(chaos.faults)} kill(s); {result.checked} actions: "
                    f"{len(result.missing)} gaps, {len(result.repeated)} duplicates, {result.mismatches} mismatches\n"
                    f"{chaos.report()}",
                    flush=True,
                )
        finally:
            broker.stop()
    recovered = [f.recovered for f in faults if not math.isnan(f.recovered)]
    summary = {
        "minutes": round(sum(r["seconds"] for r in rounds) / 60, 1),
        "rounds": len(rounds),
        "kills": len(faults),
        "brokers": args.brokers,
        "node_kills": sum(f.node for f in faults),
        "worker_recover_p50_s": _median([f.recovered for f in faults if not f.node]),
        "worker_recover_max_s": _max([f.recovered for f in faults if not f.node]),
        "worker_command_recover_p50_s": _median([f.recovered for f in faults if f.target.startswith("worker")]),
        "worker_command_recover_max_s": _max([f.recovered for f in faults if f.target.startswith("worker")]),
        "worker_process_recover_p50_s": _median([f.recovered for f in faults if f.target.startswith(PROCESS)]),
        "worker_process_recover_max_s": _max([f.recovered for f in faults if f.target.startswith(PROCESS)]),
        "node_recover_p50_s": _median([f.recovered for f in faults if f.node]),
        "node_recover_max_s": _max([f.recovered for f in faults if f.node]),
        "recoveries": len(recovered),
        "recover_p50_s": round(float(np.median(recovered)), 1) if recovered else None,
        "recover_max_s": round(max(recovered), 1) if recovered else None,
        "gaps": sum(r["gaps"] for r in rounds),
        "duplicates": sum(r["duplicates"] for r in rounds),
        "mismatches": sum(r["mismatches"] for r in rounds),
        "workers_exited_by_themselves": len(exited),
        "load_average_before": [round(v, 2) for v in load_before],
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "soak.json").write_text(
        json.dumps(
            {
                "machine": describe(),
                "summary": summary,
                "rounds": rounds,
                "faults": [
                    {
                        "tick": f.tick,
                        "target": f.target,
                        "down_s": round(f.down, 1),
                        "recovered_s": round(f.recovered, 1),
                    }
                    for f in faults
                ],
            },
            indent=2,
        )
        + "\n"
    )
    print(json.dumps(summary, indent=2))
    for line in exited:
        print(line)
    clean = not exited and not (summary["gaps"] or summary["duplicates"] or summary["mismatches"])
    return 0 if clean else 1


if __name__ == "__main__":
    sys.exit(main())
