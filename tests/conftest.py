"""Session-wide fixtures: one real Kafka broker for every test that needs it.

Where the broker comes from, in order: ``KAFKA_BOOTSTRAP_SERVERS`` if set; else testcontainers'
Kafka (KRaft) where a Docker engine answers; else the broker picrl provisions itself
(``picrl.kafka.LocalKafka``: Maven-fetched jars, a child JVM on a free loopback port).
A broker that cannot be had fails the tests that need it, loudly; it never turns into skips.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import torch

from picrl.kafka import BrokerError, LocalKafka

KAFKA_IMAGE = "confluentinc/cp-kafka:7.9.0"  # Apache Kafka 3.9, like the provisioned broker


@pytest.fixture(scope="session", autouse=True)
def single_torch_thread() -> Iterator[None]:
    """One torch thread for the whole suite: these machines have 2 cores and the broker, the workers
    and pytest compete for them; OpenMP threads spinning on a busy core made runs 10x slower."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def _docker_answers() -> bool:
    try:
        import docker

        docker.from_env(timeout=3).ping()
    except Exception:  # any failure to reach an engine means "no Docker here"
        return False
    return True


@pytest.fixture(scope="session")
def local_kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalKafka | None]:
    """The project-provisioned broker when it is the one in use (None otherwise)."""
    if os.environ.get("KAFKA_BOOTSTRAP_SERVERS") or _docker_answers():
        yield None
        return
    broker = LocalKafka(home=tmp_path_factory.mktemp("kafka-home"), log=lambda line: print(f"[kafka] {line}"))
    try:
        broker.start()
    except BrokerError as exc:
        pytest.fail(f"no Kafka broker for the tests: {exc}", pytrace=False)
    yield broker
    broker.stop()


@pytest.fixture(scope="session")
def kafka_bootstrap(local_kafka: LocalKafka | None) -> Iterator[str]:
    """Bootstrap address ("host:port") of a real Kafka broker."""
    if env := os.environ.get("KAFKA_BOOTSTRAP_SERVERS"):
        yield env
        return
    if local_kafka is not None:
        info = local_kafka.status()
        if info is None:
            pytest.fail("the provisioned Kafka broker is not running", pytrace=False)
        yield info.bootstrap
        return
    from testcontainers.community.kafka import KafkaContainer

    with KafkaContainer(KAFKA_IMAGE).with_kraft() as container:
        yield container.get_bootstrap_server()
