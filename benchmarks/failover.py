"""Fail-over: how long services wait for decisions after a worker is killed or stopped, outside the test suite.

    python benchmarks/failover.py --model DIR [--repeats 3] [--static both] [--out DIR]

Starts its own Kafka node (a fresh folder, stopped at the end). Each scenario is a closed loop of ``--services``
copies of ``--dataset`` on 4 partitions with two workers of one app id at their default settings, both holding
partitions before the loop starts; at ticks 30, 50 and 70 it inflicts the scenario's fault on one of them:

- ``kill``: SIGKILL, and the same command started again at once (a crash under a supervisor);
- ``term``: SIGTERM (the worker stops; the other takes its partitions over), then started again once it has exited;
- ``crash``: workers run with ``--respawn on``; SIGKILL of the worker process (as the OOM killer would), which the
  command forks again at once.

Before each fault the worker restarted after the last one is back in its group (a rolling restart's pace).

The time to recover is from the fault until every service's action for the next tick is in force (the closed
loop's clock). ``--static both`` runs each scenario with static membership (the default, ``instance_id auto``) and
without it (``--instance-id none``: dynamic members, as before static membership). Prints a table and writes
``failover.json`` (every recovery, medians, maxima, the host with its load and CPU steal) to ``--out``.
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
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the process helpers live in tests/support

from host import StealMeter, describe  # noqa: E402
from tqdm import tqdm  # noqa: E402

from picrl.datasets import load_dataset  # noqa: E402
from picrl.kafka import LocalKafka  # noqa: E402
from picrl.workloads import copies_of  # noqa: E402
from producers.closed_loop import ClosedLoopEnvironment, TickSummary  # noqa: E402
from stream.topics import TopicNames, ensure_topics, topic_specs  # noqa: E402
from tests.support.processes import forked_workers, spawn, stop  # noqa: E402

FAULT_TICKS = (30, 50, 70)
PARTITIONS = 4


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
    parser.add_argument("--scenarios", nargs="+", choices=("kill", "term", "crash"), default=["kill", "term", "crash"])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/failover"))
    return parser.parse_args()


class Faults:
    """The closed loop's tick callback: at each of :data:`FAULT_TICKS` SIGKILL (``kill``) or SIGTERM (``term``)
    one worker, alternately, and start it again (at once after a kill, once it has exited after a stop); or SIGKILL
    its worker process (``crash``), which its command forks again."""

    def __init__(self, scenario: str, args: list[str], logs: Path) -> None:
        self.scenario, self.args, self.logs = scenario, args, logs
        self.workers = [spawn(args, logs / f"worker{i}.log", fresh=True) for i in range(2)]
        self.seen: dict[int, float] = {}
        self.at: dict[int, float] = {}
        self._restarts: list[threading.Thread] = []

    def on_tick(self, summary: TickSummary) -> None:
        self.seen[summary.tick] = time.monotonic()
        if summary.tick not in FAULT_TICKS:
            return
        self._settle()
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

    def _settle(self, timeout: float = 180.0) -> None:
        """Wait until the worker restarted after the last fault is back in the group, as a rolling restart waits
        before the next worker: a fault while it is still starting leaves no worker at all."""
        for restart in self._restarts:
            restart.join()
        deadline = time.monotonic() + timeout
        while not all(_in_group(self.logs / f"worker{i}.log") for i in (0, 1)):
            if time.monotonic() > deadline:
                raise TimeoutError(f"a restarted worker did not rejoin its group within {timeout:.0f} s")
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


def run_scenario(bootstrap: str, model: Path, scenario: str, static: bool, services: int, dataset: str) -> list[float]:
    prefix = f"failover-{scenario}-{'static' if static else 'dynamic'}-{int(time.time() * 1000) % 10**9}"
    asyncio.run(ensure_topics(bootstrap, topic_specs(prefix, PARTITIONS)))
    logs = Path(tempfile.mkdtemp(prefix=f"{prefix}-"))
    args = ["worker", "--model", str(model), "--bootstrap", bootstrap, "--prefix", prefix]
    args += ["--partitions", str(PARTITIONS), "--app-id", f"{prefix}-worker", "--log-level", "info"]
    args += [] if static else ["--instance-id", "none"]
    args += ["--respawn", "on"] if scenario == "crash" else []
    faults = Faults(scenario, args, logs)
    try:
        _both_hold_partitions(logs)
        workload = copies_of(load_dataset(dataset), services, FAULT_TICKS[-1] + 10, start=900, seed=11)
        loop = ClosedLoopEnvironment(
            bootstrap, TopicNames(prefix), workload, action_timeout=180, on_tick=faults.on_tick
        )
        asyncio.run(loop.run())
    finally:
        faults.stop()
    return faults.recoveries()


def main() -> int:
    args = _arguments()
    memberships = {"on": [True], "off": [False], "both": [True, False]}[args.static]
    runs = [(s, m) for s in args.scenarios for m in memberships for _ in range(args.repeats)]
    results: dict[str, list[float]] = {}
    steal = StealMeter()
    with tempfile.TemporaryDirectory(prefix="picrl-failover-") as home:
        broker = LocalKafka(home=Path(home) / "kafka", log=lambda _: None)
        bootstrap = broker.start().bootstrap
        try:
            for scenario, static in tqdm(runs, desc="scenarios", unit="run"):
                key = f"{scenario}, {'static' if static else 'dynamic'} members"
                results.setdefault(key, []).extend(
                    run_scenario(bootstrap, args.model, scenario, static, args.services, args.dataset)
                )
        finally:
            broker.stop()
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
    report = {"machine": describe(), "steal_share": round(steal.share(), 4), "summary": summary}
    (args.out / "failover.json").write_text(json.dumps(report, indent=2) + "\n")
    print(f"CPU steal {steal.share():.1%}; written: {args.out / 'failover.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
