"""The project-provisioned Apache Kafka broker (KRaft, single node) and a liveness probe."""
from picrl.kafka.local_broker import BrokerError, BrokerInfo, LocalKafka, KAFKA_VERSION

__all__ = ["BrokerError", "BrokerInfo", "LocalKafka", "KAFKA_VERSION"]
