"""Fail-over: how long services wait for decisions after a worker or a Kafka node is killed, outside the test suite.

    python benchmarks/failover.py --model DIR [--brokers 3] [--repeats 3] [--static both] [--out DIR]

Starts its own Kafka cluster of ``--brokers`` nodes at the settings of ``picrl kafka start --brokers N`` (a fresh
folder, stopped at the end). Each scenario is a closed loop of ``--services`` copies of ``--dataset`` on 4
partitions (replicated as the worker would: min(3, nodes) replicas) with two workers of one app id at their default
settings, both holding partitions before the loop starts; at ticks 30, 50 and 70 it inflicts the scenario's fault:

- ``kill``: SIGKILL of one worker's command (worker and, under ``respawn on``, the process that forks it), and the
  same command started again at once (a crash under a supervisor: a new interpreter, imports included);
- ``term``: SIGTERM (the worker stops; the other takes its partitions over), then started again once it has exited;
- ``crash``: SIGKILL of the worker process (as the OOM killer would), which the command forks again at once
  (``respawn``, on by default on Linux);
- ``leader``: SIGKILL of the Kafka node that leads the most usage partitions, started again at once on its ports and
  data (a cluster of 2 or more nodes);
- ``controller``: SIGKILL of the active KRaft controller, started again at once (a cluster of 2 or more nodes).

Before each fault the worker restarted after the last one is back in its group (a rolling restart's pace), and a
node killed is back in the cluster.

The time to recover is from the fault until every service's action for the next tick is in force (the closed
loop's clock). ``--static both`` runs each scenario with static membership (the default, ``instance_id auto``) and
without it (``--instance-id none``: dynamic members, as before static membership). Prints a table and writes
``failover.json`` (every recovery, medians, maxima, the host's load average before and after each run and its CPU
steal) to ``--out``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the process helpers live in tests/support

from host import StealMeter, describe  # noqa: E402
from tqdm import tqdm  # noqa: E402

from picrl.datasets import load_dataset  # noqa: E402
from picrl.kafka import LocalKafka  # noqa: E402
from picrl.workloads import copies_of  # noqa: E402
from producers.closed_loop import ClosedLoopEnvironment, TickSummary  # noqa: E402
from stream.topics import Replication, TopicNames, ensure_topics, topic_specs  # noqa: E402
from tests.support.chaos import leader_counts, under_replicated  # noqa: E402
from tests.support.processes import forked_workers, spawn, stop  # noqa: E402

FAULT_TICKS = (30, 50, 70)
PARTITIONS = 4
NODE_FAULTS = ("leader", "controller")


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, required=True, help="a model folder (picrl train)")
    parser.add_argument("--dataset", default="genai-mem", help="bundled dataset the services copy (default genai-mem)")
    parser.add_argument("--services", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=1, help="runs of each scenario, 3 faults each (default 1)")
    parser.add_argument(
        "--static",
        choices=("on", "off", "both"),
        default="on",
        help="static membership: on (the default settings), off (--instance-id none) or both (default on)",
    )
    parser.add_argument(
        "--brokers", type=int, default=3, help="Kafka brokers (default 3; 2 or more come with 3 dedicated controllers)"
    )
    parser.add_argument(
        "--scenarios",
        nargs="+",
        choices=("kill", "term", "crash", *NODE_FAULTS),
        default=["leader", "controller", "kill", "crash"],
    )
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/failover"))
    return parser.parse_args()


class Faults:
    """The closed loop's tick callback: at each of :data:`FAULT_TICKS` SIGKILL (``kill``) or SIGTERM (``term``)
    one worker, alternately, and start it again (at once after a kill, once it has exited after a stop); SIGKILL
    its worker process (``crash``), which its command forks again; or SIGKILL a Kafka node of ``cluster``
    (``leader``, ``controller``) and start it again at once."""

    def __init__(self, scenario: str, args: list[str], logs: Path, cluster: LocalKafka, usage: str) -> None:
        self.scenario, self.args, self.logs, self.cluster, self.usage = scenario, args, logs, cluster, usage
        self.workers = [spawn(args, logs / f"worker{i}.log", fresh=True) for i in range(2)]
        self.seen: dict[int, float] = {}
        self.at: dict[int, float] = {}
        self.wall: dict[int, str] = {}  # each fault's UTC time, to read the logs by
        self.nodes: dict[int, int] = {}  # the node killed at each tick
        self._restarts: list[threading.Thread] = []

    def on_tick(self, summary: TickSummary) -> None:
        self.seen[summary.tick] = time.monotonic()
        if summary.tick not in FAULT_TICKS:
            return
        self._settle()
        self.wall[summary.tick] = datetime.now(UTC).strftime("%H:%M:%S.%f")[:-3]
        if self.scenario in NODE_FAULTS:
            self._kill_node(summary.tick)
            return
        index = FAULT_TICKS.index(summary.tick) % 2
        victim = self.workers[index]
        self.at[summary.tick] = time.monotonic()
        if self.scenario == "crash":
            os.kill(forked_workers(self.logs / f"worker{index}.log")[-1], signal.SIGKILL)
            return
        if self.scenario == "kill":
            victim.send_signal(signal.SIGKILL)
            victim.wait()
            self.workers[index] = spawn(self.args, self.logs / f"worker{index}.log", fresh=True)
            return
        victim.send_signal(signal.SIGTERM)
        restart = threading.Thread(target=self._restart, args=(index, victim), daemon=True)
        restart.start()
        self._restarts.append(restart)

    def _kill_node(self, tick: int) -> None:
        """SIGKILL the node that leads the most usage partitions, or the active controller, and start it again at
        once (in a thread: the loop goes on on the other nodes meanwhile)."""
        info = self.cluster.status()
        assert info is not None, "the cluster is not running"
        if self.scenario == "leader":
            node: int | None = leader_counts(info.bootstrap, [self.usage]).most_common(1)[0][0]
        else:
            node = self.cluster.active_controller()
        assert node is not None, f"no {self.scenario} node is known"
        self.nodes[tick] = node
        self.at[tick] = time.monotonic()
        self.cluster.stop(node=node, crash=True)
        restart = threading.Thread(target=self.cluster.start, daemon=True)
        restart.start()
        self._restarts.append(restart)

    def _settle(self, timeout: float = 180.0) -> None:
        """Wait until the worker restarted after the last fault is back in the group (as a rolling restart waits
        before the next worker: a fault while it is still starting leaves no worker at all) and a node restarted is
        back in the cluster with every replica in sync (as a rolling restart of the nodes waits)."""
        for restart in self._restarts:
            restart.join()
        deadline = time.monotonic() + timeout
        info = self.cluster.status()
        while not all(_in_group(self.logs / f"worker{i}.log") for i in (0, 1)) or (
            self.scenario in NODE_FAULTS and info is not None and under_replicated(info.bootstrap)
        ):
            if time.monotonic() > deadline:
                raise TimeoutError(f"the workers or the nodes restarted did not settle within {timeout:.0f} s")
            time.sleep(0.2)

    def _restart(self, index: int, stopped: subprocess.Popen) -> None:
        stopped.wait()
        self.workers[index] = spawn(self.args, self.logs / f"worker{index}.log", fresh=True)

    def recoveries(self) -> list[float]:
        return [self.seen[tick + 1] - self.at[tick] for tick in FAULT_TICKS if tick + 1 in self.seen]

    def stop(self) -> None:
        for restart in self._restarts:
            restart.join()
        for worker in self.workers:
            stop(worker)


def _in_group(log: Path) -> bool:
    """Whether the worker last started with output to ``log`` has logged an assignment since it started."""
    text = log.read_text() if log.exists() else ""
    return "assigned partitions" in text[text.rfind('"message": "picrl worker ') :]


def _both_hold_partitions(logs: Path, timeout: float = 180.0) -> None:
    """Wait until both workers logged an assignment (both in the group), then let the second rebalance settle."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        texts = [(logs / f"worker{i}.log").read_text() if (logs / f"worker{i}.log").exists() else "" for i in (0, 1)]
        if all("assigned partitions" in text for text in texts):
            time.sleep(3.0)
            return
        time.sleep(0.5)
    raise TimeoutError(f"the two workers did not both join their group within {timeout:.0f} s (logs in {logs})")


def run_scenario(cluster: LocalKafka, model: Path, scenario: str, static: bool, services: int, dataset: str) -> dict:
    """One run of ``scenario``: its recoveries, the nodes killed, the load average before and after, its logs."""
    info = cluster.status()
    assert info is not None, "the cluster is not running"
    bootstrap = info.bootstrap
    load_before = os.getloadavg()
    prefix = f"failover-{scenario}-{'static' if static else 'dynamic'}-{int(time.time() * 1000) % 10**9}"
    asyncio.run(ensure_topics(bootstrap, topic_specs(prefix, PARTITIONS), Replication.for_brokers(len(info.brokers))))
    logs = Path(tempfile.mkdtemp(prefix=f"{prefix}-"))
    args = ["worker", "--model", str(model), "--bootstrap", bootstrap, "--prefix", prefix]
    args += ["--partitions", str(PARTITIONS), "--app-id", f"{prefix}-worker", "--log-level", "info"]
    args += [] if static else ["--instance-id", "none"]
    faults = Faults(scenario, args, logs, cluster, TopicNames(prefix).usage)
    try:
        _both_hold_partitions(logs)
        workload = copies_of(load_dataset(dataset), services, FAULT_TICKS[-1] + 10, start=900, seed=11)
        loop = ClosedLoopEnvironment(
            bootstrap, TopicNames(prefix), workload, action_timeout=180, on_tick=faults.on_tick
        )
        asyncio.run(loop.run())
    finally:
        faults.stop()
    return {
        "recoveries_s": [round(v, 2) for v in faults.recoveries()],
        "nodes_killed": list(faults.nodes.values()),
        "faults_at_utc": list(faults.wall.values()),
        "load_before": [round(v, 2) for v in load_before],
        "load_after": [round(v, 2) for v in os.getloadavg()],
        "logs": str(logs),
    }


def main() -> int:
    args = _arguments()
    memberships = {"on": [True], "off": [False], "both": [True, False]}[args.static]
    runs = [(s, m) for s in args.scenarios for m in memberships for _ in range(args.repeats)]
    if args.brokers < 2 and set(args.scenarios) & set(NODE_FAULTS):
        raise SystemExit(f"the scenarios {', '.join(NODE_FAULTS)} need a cluster of 2 or more nodes (--brokers)")
    results: dict[str, list[float]] = {}
    details: list[dict] = []
    steal = StealMeter()
    with tempfile.TemporaryDirectory(prefix="picrl-failover-") as home:
        cluster = LocalKafka(home=Path(home) / "kafka", brokers=args.brokers, log=lambda _: None)
        cluster.start()
        try:
            for scenario, static in tqdm(runs, desc="scenarios", unit="run"):
                key = f"{scenario}, {'static' if static else 'dynamic'} members"
                run = run_scenario(cluster, args.model, scenario, static, args.services, args.dataset)
                results.setdefault(key, []).extend(run["recoveries_s"])
                details.append({"scenario": key, **run})
                tqdm.write(f"{key}: {run}")
        finally:
            cluster.stop()
    summary = {
        key: {
            "faults": len(values),
            "p50_s": round(statistics.median(values), 2),
            "max_s": round(max(values), 2),
            "each_s": [round(v, 2) for v in values],
        }
        for key, values in results.items()
        if values
    }
    print(f"{'scenario':<28} {'faults':>6} {'p50 s':>7} {'max s':>7}")
    for key, row in summary.items():
        print(f"{key:<28} {row['faults']:>6} {row['p50_s']:>7.2f} {row['max_s']:>7.2f}")
    args.out.mkdir(parents=True, exist_ok=True)
    report = {
        "machine": describe(),
        "brokers": args.brokers,
        "steal_share": round(steal.share(), 4),
        "summary": summary,
        "runs": details,
    }
    (args.out / "failover.json").write_text(json.dumps(report, indent=2) + "\n")
    print(f"CPU steal {steal.share():.1%}; written: {args.out / 'failover.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
