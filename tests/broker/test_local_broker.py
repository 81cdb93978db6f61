"""The project-provisioned broker: config, clear failures, restart on the same data, and the CLI."""

from __future__ import annotations

import asyncio
import json
import shutil
import socket
import stat
import uuid
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer

from picrl.cli import main
from picrl.kafka import BrokerError, LocalKafka
from picrl.kafka.local_broker import (
    NodePorts,
    cluster_layout,
    default_cache,
    new_cluster_id,
    ports_needed,
    server_properties,
)
from picrl.kafka.probe import answers_metadata
from tests.support.kafka import consume, create_topics, unique


def _properties(node: NodePorts, nodes: list[NodePorts], data: Path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in server_properties(node, nodes, data).splitlines() if line)


def test_single_node_config_lets_transactions_and_groups_start(tmp_path: Path) -> None:
    node = NodePorts(1, 9092, 9093)
    props = _properties(node, [node], tmp_path)
    for key in (
        "offsets.topic.replication.factor",
        "transaction.state.log.replication.factor",
        "transaction.state.log.min.isr",
        "default.replication.factor",
        "min.insync.replicas",
    ):
        assert props[key] == "1", key
    assert props["process.roles"] == "broker,controller"
    assert props["controller.quorum.voters"] == "1@127.0.0.1:9093"
    assert props["listeners"] == "PLAINTEXT://127.0.0.1:9092,CONTROLLER://127.0.0.1:9093"
    assert props["log.dirs"] == str(tmp_path)


def test_a_cluster_of_brokers_gets_a_quorum_of_three_dedicated_controllers(tmp_path: Path) -> None:
    nodes = cluster_layout(3, list(range(9101, 9107)))
    assert [(n.node_id, n.roles) for n in nodes] == [
        (1, "broker"),
        (2, "broker"),
        (3, "broker"),
        (4, "controller"),
        (5, "controller"),
        (6, "controller"),
    ]
    assert ports_needed(3) == len({p for n in nodes for p in (n.port, n.controller_port) if p is not None}) == 6
    broker, controller = _properties(nodes[1], nodes, tmp_path), _properties(nodes[4], nodes, tmp_path)
    assert broker["process.roles"] == "broker" and controller["process.roles"] == "controller"
    assert broker["listeners"] == broker["advertised.listeners"] == "PLAINTEXT://127.0.0.1:9102"
    assert controller["listeners"] == "CONTROLLER://127.0.0.1:9105" and "advertised.listeners" not in controller
    voters = "4@127.0.0.1:9104,5@127.0.0.1:9105,6@127.0.0.1:9106"
    assert broker["controller.quorum.voters"] == controller["controller.quorum.voters"] == voters
    for props in (broker, controller):  # a controller applies the topic defaults: both hold the brokers' rule
        for key in ("offsets.topic.replication.factor", "transaction.state.log.replication.factor"):
            assert props[key] == props["default.replication.factor"] == "3", key
        assert props["transaction.state.log.min.isr"] == props["min.insync.replicas"] == "2"
    five = cluster_layout(5, list(range(9101, 9109)))
    assert _properties(five[0], five, tmp_path)["offsets.topic.replication.factor"] == "3"
    two = cluster_layout(2, list(range(9101, 9106)))
    assert sum(n.is_controller for n in two) == 3
    assert _properties(two[0], two, tmp_path)["transaction.state.log.min.isr"] == "1"
    with pytest.raises(BrokerError, match="dedicated controller"):
        _ = nodes[3].bootstrap


def test_cluster_config_fails_over_within_seconds(tmp_path: Path) -> None:
    """A lost broker is fenced, and a lost active controller replaced, in seconds: the detection of the controller's
    loss, the longest election round and the fencing of the lost node sum to under 5 s (Kafka's defaults: 14 s),
    and a broker heartbeats at least 4 times per session."""
    nodes = cluster_layout(3, list(range(9101, 9107)))
    for node in (nodes[0], nodes[3]):
        props = {k: int(v) for k, v in _properties(node, nodes, tmp_path).items() if k.endswith(".ms")}
        session, heartbeat = props["broker.session.timeout.ms"], props["broker.heartbeat.interval.ms"]
        election = (
            props["controller.quorum.fetch.timeout.ms"]
            + 2 * props["controller.quorum.election.timeout.ms"]
            + props["controller.quorum.election.backoff.max.ms"]
        )
        assert election + session < 5000 and 4 * heartbeat <= session, props


def test_a_home_of_the_single_broker_layout_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "server.properties").write_text("node.id=1\n")
    with pytest.raises(BrokerError, match="layout of an older picrl"):
        LocalKafka(home=tmp_path, log=lambda _: None).status()


def test_cluster_id_never_starts_with_a_dash(monkeypatch: pytest.MonkeyPatch) -> None:
    # 0xF8 encodes to a leading '-' in base64url; the storage tool would parse it as an option.
    drawn = iter([uuid.UUID(bytes=bytes([0xF8]) + bytes(15)), uuid.UUID(bytes=bytes([0x10]) + bytes(15))])
    monkeypatch.setattr(uuid, "uuid4", lambda: next(drawn))
    cluster_id = new_cluster_id()
    assert not cluster_id.startswith("-") and cluster_id.startswith("E")


def test_missing_java_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("JAVA_HOME", raising=False)
    with pytest.raises(BrokerError, match="Java was not found"):
        LocalKafka(home=tmp_path / "home", cache=tmp_path / "cache", log=lambda _: None).start()


def test_failed_download_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake_mvn = bin_dir / "mvn"
    fake_mvn.write_text("#!/bin/sh\necho 'Could not resolve dependencies: network is unreachable' >&2\nexit 1\n")
    fake_mvn.chmod(fake_mvn.stat().st_mode | stat.S_IEXEC)
    java = shutil.which("java")
    assert java is not None, "the machine must have Java for the broker tests"
    monkeypatch.setenv("PATH", f"{bin_dir}:{Path(java).parent}")
    with pytest.raises(BrokerError, match=r"(?s)downloading Kafka .* failed.*network is unreachable"):
        LocalKafka(home=tmp_path / "home", cache=tmp_path / "empty-cache", log=lambda _: None).start()
    assert not (tmp_path / "empty-cache" / "kafka-3.9.1" / "complete").exists()


def test_taken_port_is_a_clear_error(tmp_path: Path, local_kafka: LocalKafka | None) -> None:
    if local_kafka is None:
        pytest.fail("this test needs the provisioned broker; unset KAFKA_BOOTSTRAP_SERVERS to run it")
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", 0))
        blocker.listen()
        port = blocker.getsockname()[1]
        broker = LocalKafka(home=tmp_path / "home", cache=local_kafka.cache, port=port, log=lambda _: None)
        with pytest.raises(BrokerError, match=f"port {port} on 127.0.0.1 is taken"):
            broker.start()
    assert broker.status() is None


def test_restart_keeps_port_and_data_and_cli_reports_state(
    tmp_path: Path, local_kafka: LocalKafka | None, capsys: pytest.CaptureFixture[str]
) -> None:
    if local_kafka is None:
        pytest.fail("this test needs the provisioned broker; unset KAFKA_BOOTSTRAP_SERVERS to run it")
    home = tmp_path / "home"
    cli = ["--home", str(home), "--cache", str(local_kafka.cache)]
    assert main(["kafka", "status", *cli]) == 1
    assert "no broker running" in capsys.readouterr().out

    assert main(["kafka", "start", "--json", *cli]) == 0
    first = json.loads(capsys.readouterr().out)
    topic = unique("restart")

    async def write() -> None:
        await create_topics(first["bootstrap"], {topic: 1})
        producer = AIOKafkaProducer(bootstrap_servers=first["bootstrap"])
        await producer.start()
        await producer.send_and_wait(topic, b"survives a restart")
        await producer.stop()

    try:
        asyncio.run(write())
        assert main(["kafka", "status", "--json", *cli]) == 0
        status = json.loads(capsys.readouterr().out)
        pid = first["nodes"][0]["pid"]
        assert status["answers"] and status["nodes"][0]["pid"] == pid
        # the topic and the consumer offsets' and transactions' partitions, all led by the one node, in sync
        assert status["partitions"]["total"] >= 1 and status["partitions"]["leaders"].keys() == {"1"}
        assert status["partitions"]["under_replicated"] == status["partitions"]["without_leader"] == []
        assert main(["kafka", "status", *cli]) == 0
        assert "leads" in capsys.readouterr().out
        assert main(["kafka", "start", "--json", *cli]) == 0, "start on a running broker is a no-op"
        assert json.loads(capsys.readouterr().out)["nodes"][0]["pid"] == pid

        assert main(["kafka", "stop", *cli]) == 0
        assert "stopped 1 node(s)" in capsys.readouterr().out
        assert not answers_metadata(first["bootstrap"])
        assert main(["kafka", "start", "--json", *cli]) == 0
        second = json.loads(capsys.readouterr().out)
        assert second["bootstrap"] == first["bootstrap"] and second["nodes"][0]["pid"] != pid
        records = asyncio.run(consume(second["bootstrap"], topic, 1, timeout=30))
        assert [r.value for r in records] == [b"survives a restart"]
    finally:
        main(["kafka", "stop", *cli])
    assert main(["kafka", "stop", *cli]) == 0
    assert "no broker running" in capsys.readouterr().out


def test_default_cache_follows_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PICRL_CACHE", str(tmp_path))
    assert default_cache() == tmp_path
