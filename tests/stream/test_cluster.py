"""A replicated Kafka cluster of three brokers and three controllers (`picrl kafka start --brokers 3`): what picrl
creates on it, a broker lost and back, the active controller lost and back, the stream (two resources per pod)
under the loss of the broker leading the most partitions, of the active controller and of a worker, and `picrl
kafka stop` ending every node. One cluster serves the module (its tests run in file order)."""

from __future__ import annotations

import asyncio
import json
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from picrl.cli import main
from picrl.datasets import Trace
from picrl.kafka import BrokerError, LocalKafka
from picrl.kafka.local_broker import pid_alive
from picrl_core.artifact import ModelArtifact
from producers.closed_loop import ClosedLoopEnvironment
from stream.records import decode_dead_letter
from stream.topics import Replication, TopicNames, ensure_topics, topic_specs
from tests.stream.conftest import WINDOW, two_resource_workload
from tests.support.chaos import CONTROLLER, FREEZE, LEADER, STOP, Chaos, audit
from tests.support.kafka import consume, produce, unique, usage_json
from tests.support.processes import worker_args

PARTITIONS = 4


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, local_kafka: LocalKafka | None) -> Iterator[LocalKafka]:
    """Three brokers and three dedicated controllers started by the CLI (stopped at the end if still up)."""
    if local_kafka is None:
        pytest.fail("these tests start and kill their own nodes: unset KAFKA_BOOTSTRAP_SERVERS to run them")
    home = tmp_path_factory.mktemp("cluster")
    nodes = LocalKafka(home=home, cache=local_kafka.cache, log=lambda _: None)
    assert main(["kafka", "start", "--brokers", "3", "--home", str(home), "--cache", str(local_kafka.cache)]) == 0
    try:
        yield nodes
    finally:
        nodes.stop(timeout=10)


def _cli(cluster: LocalKafka) -> list[str]:
    return ["--home", str(cluster.home), "--cache", str(cluster.cache)]


def test_topics_get_three_replicas_and_a_node_killed_comes_back(
    cluster: LocalKafka, capsys: pytest.CaptureFixture[str]
) -> None:
    """picrl's topics get three replicas and min.insync.replicas 2 by default; `status` names every node, its roles
    and the active controller. `kafka stop --node 2 --crash` kills a broker: `status` fails, shows the others
    leading its partitions and those partitions under-replicated; `kafka start --node 2` brings it back on its
    ports and its replicas catch up. Killing the active controller leaves every partition led: another controller
    leads the quorum, and the one killed follows it once started again."""
    capsys.readouterr()
    assert main(["kafka", "status", "--json", *_cli(cluster)]) == 0
    status = json.loads(capsys.readouterr().out)
    assert [n["roles"] for n in status["nodes"]] == ["broker"] * 3 + ["controller"] * 3
    assert status["answers"] and [n["brokers_seen"] for n in status["nodes"]] == [3, 3, 3, 0, 0, 0]
    assert [n["follows_leader"] for n in status["nodes"][3:]] == [True] * 3
    assert len({n["pid"] for n in status["nodes"]}) == 6 and len(status["bootstrap"].split(",")) == 3
    assert status["active_controller"] in (4, 5, 6)
    prefix = unique("replicated")
    assert main(["topics", "create", "--bootstrap", status["bootstrap"], "--prefix", prefix, "--partitions", "2"]) == 0
    assert capsys.readouterr().out.count("replicas=3  min.insync.replicas=2") == 5
    replicas, min_isr = asyncio.run(_replication(status["bootstrap"], f"{prefix}.usage"))
    assert replicas == [3, 3] and min_isr == "2"

    assert main(["kafka", "stop", "--node", "2", "--crash", *_cli(cluster)]) == 0
    assert capsys.readouterr().out.strip() == "killed 1 node(s) (2)"
    assert [n.pid is None for n in cluster.status().nodes] == [False, True, False, False, False, False]
    # once the controller has fenced node 2, the others lead its partitions, now short of one in-sync replica
    down = _status_until(
        cluster,
        lambda s: "2" not in s["partitions"]["leaders"] and any(2 in p["replicas"] for p in _short(s)),
        capsys,
    )
    assert down["partitions"]["without_leader"] == [] and not down["answers"]
    assert all(2 not in p["isr"] for p in _short(down))
    # the text form says the same; each call asks one node, whose metadata can lag the controller's for a moment
    deadline = time.monotonic() + 60
    while True:
        code, out = main(["kafka", "status", *_cli(cluster)]), capsys.readouterr().out
        if f"{prefix}.usage[0]: leader node " in out or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert code == 1 and "node 2 (broker): not running" in out and f"{prefix}.usage[0]: leader node " in out, out
    assert main(["kafka", "start", "--node", "2", *_cli(cluster)]) == 0
    capsys.readouterr()
    again = cluster.status()
    assert again is not None and again.bootstrap == status["bootstrap"] and all(n.pid is not None for n in again.nodes)
    back = _status_until(cluster, lambda s: s["answers"] and not _short(s), capsys)
    assert back["partitions"]["total"] == down["partitions"]["total"]

    active = back["active_controller"]
    assert main(["kafka", "stop", "--node", str(active), "--crash", *_cli(cluster)]) == 0
    assert capsys.readouterr().out.strip() == f"killed 1 node(s) ({active})"
    elected = _status_until(cluster, lambda s: s["active_controller"] not in (None, active), capsys)
    assert not elected["answers"] and elected["partitions"]["without_leader"] == [] and not _short(elected)
    assert [n["brokers_seen"] for n in elected["nodes"][:3]] == [3, 3, 3]
    assert main(["kafka", "start", "--node", str(active), *_cli(cluster)]) == 0
    capsys.readouterr()
    assert _status_until(cluster, lambda s: s["answers"], capsys)["answers"]


def _short(status: dict) -> list[dict]:
    """The under-replicated partitions in `picrl kafka status --json`'s answer."""
    return status["partitions"]["under_replicated"] if status["partitions"] else []


def _status_until(
    cluster: LocalKafka, holds: Callable[[dict], bool], capsys: pytest.CaptureFixture[str], wait: float = 60.0
) -> dict:
    """`picrl kafka status --json` once its answer ``holds`` (or after ``wait`` seconds: the caller's asserts say
    what was missing)."""
    deadline = time.monotonic() + wait
    while True:
        main(["kafka", "status", "--json", *_cli(cluster)])
        status = json.loads(capsys.readouterr().out)
        if (status["partitions"] is not None and holds(status)) or time.monotonic() > deadline:
            return status
        time.sleep(0.5)


async def _replication(bootstrap: str, topic: str, wait: float = 15.0) -> tuple[list[int], str | None]:
    """Replicas of each partition of ``topic`` and its min.insync.replicas, as the admin client describes them (a
    node that has not applied the new topic's metadata yet answers without its partitions or configs: asked
    again)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    deadline = time.monotonic() + wait
    try:
        while True:
            (described,) = await admin.describe_topics([topic])
            (response,) = await admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic)])
            configs = {entry[0]: entry[1] for resource in response.resources for entry in resource[4]}
            if ("min.insync.replicas" in configs and described["partitions"]) or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.2)
    finally:
        await admin.close()
    return [len(p["replicas"]) for p in sorted(described["partitions"], key=lambda p: p["partition"])], configs.get(
        "min.insync.replicas"
    )


def test_chaos_two_workers_survive_losing_the_lead_node_the_controller_and_a_worker(
    cluster: LocalKafka, tiny_model_dir: Path, tiny_artifact: ModelArtifact, native_trace: Trace, tmp_path: Path
) -> None:
    """Two workers of one app id on 4 partitions, 12 pods provisioned GPU memory and GPU compute (schema-2
    records, ``--resources``) in closed loop for 84 ticks, on three nodes. At set ticks: a worker frozen (SIGSTOP)
    until the other has taken its partitions over (it comes back as a zombie); a SIGKILL of the node leading the
    most partitions, away for 6 ticks (the loop goes on on two); a worker SIGKILLed and restarted at once; a SIGKILL
    of the active controller, away for 6 ticks; then a worker stopped (SIGTERM: it hands its partitions and their
    rows over as it leaves) and restarted. Every (pod, tick) must get exactly one action, both resources in it,
    equal to the coupled uninterrupted reference; no worker may exit by itself, and the one stopped exits with 0.
    Records without the model's resources are dead-lettered with their reason."""
    bootstrap = cluster.status().bootstrap
    workload = two_resource_workload(native_trace, 12, 84, seed=15)
    plan = {
        WINDOW + 6: f"{FREEZE}1",
        WINDOW + 20: LEADER,
        WINDOW + 36: 0,
        WINDOW + 50: CONTROLLER,
        WINDOW + 62: f"{STOP}1",
    }
    prefix = unique("chaos3")
    asyncio.run(ensure_topics(bootstrap, topic_specs(prefix, PARTITIONS), Replication.for_brokers(3)))
    args = worker_args(tiny_model_dir, bootstrap, prefix, "--resources", "gpu_mem,gpu_compute", partitions=PARTITIONS)
    reading = {"usage": 1.0, "capacity": 2.0, "censored": False}
    bad = {
        "missing_resource": usage_json("single", 0, 1.0, 2.0),
        "unknown_resource": json.dumps(
            {
                "schema": 2,
                "type": "usage",
                "service": "extra",
                "tick": 0,
                "resources": {"gpu_mem": reading, "gpu_compute": reading, "gpu_net": reading},
            }
        ).encode(),
    }
    produce(bootstrap, TopicNames(prefix).usage, [(b"bad", value) for value in bad.values()])
    chaos = Chaos(args, tmp_path, 2, cluster, plan.get, node_away=6)
    started = time.monotonic()
    try:
        chaos.start()
        loop = ClosedLoopEnvironment(bootstrap, TopicNames(prefix), workload, action_timeout=120, on_tick=chaos.on_tick)
        try:
            record = asyncio.run(loop.run())
        except Exception as exc:
            diagnosis = chaos.diagnose(bootstrap, prefix, PARTITIONS, f"{prefix}-worker")
            raise AssertionError("\n".join([str(exc), *chaos.exited_by_themselves(), diagnosis])) from exc
        exited = chaos.exited_by_themselves()
        assert not exited, "\n".join(exited)
        result = audit(record, bootstrap, prefix, tiny_artifact, WINDOW)
        diagnosis = "" if result.clean else chaos.diagnose(bootstrap, prefix, PARTITIONS, f"{prefix}-worker")
        letters = [
            decode_dead_letter(m.value)
            for m in asyncio.run(consume(bootstrap, TopicNames(prefix).deadletter, len(bad), timeout=30))
        ]
    finally:
        chaos.stop()
    print(
        f"\nchaos on 3 nodes: {len(workload.services)} pods x {workload.ticks} ticks on {PARTITIONS} partitions "
        f"in {time.monotonic() - started:.0f} s\n{chaos.report()}\n{result.checked} actions checked: "
        f"{len(result.missing)} missing, {len(result.repeated)} repeated, {result.mismatches} differ"
    )
    assert [f.target.split(" (")[-1] for f in chaos.faults if f.node] == [f"{LEADER})", f"{CONTROLLER})"]
    assert len(chaos.faults) == 5 and all(p.returncode == -signal.SIGKILL for p in chaos.killed)
    assert [p.returncode for p in chaos.stopped] == [0]
    assert result.clean, (
        f"missing {result.missing[:5]}, repeated {result.repeated[:5]}, {result.mismatches} differ, "
        f"first (row, tick, decided, reference): {result.diverged[:8]}\n{diagnosis}"
    )
    assert result.checked == len(workload.services) * workload.ticks  # one action per pod and tick
    assert record.censored[:, : len(workload.services)].any()  # memory ran short: the coupling was exercised
    assert sorted(letter.reason for letter in letters) == sorted(bad)


def test_stop_ends_every_node(cluster: LocalKafka, capsys: pytest.CaptureFixture[str]) -> None:
    pids = [n.pid for n in cluster.start().nodes]
    capsys.readouterr()
    assert main(["kafka", "stop", *_cli(cluster)]) == 0
    assert "stopped 6 node(s)" in capsys.readouterr().out
    assert cluster.status() is None and not any(pid_alive(pid) for pid in pids)
    with pytest.raises(BrokerError, match="formatted with 3 broker"):
        LocalKafka(home=cluster.home, cache=cluster.cache, brokers=1, log=lambda _: None).start()
