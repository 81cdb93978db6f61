"""The project-provisioned Apache Kafka cluster (KRaft, one node or N on loopback) and a liveness probe."""

from picrl.kafka.local_broker import KAFKA_VERSION, BrokerError, BrokerInfo, LocalKafka, NodeInfo

__all__ = ["BrokerError", "BrokerInfo", "LocalKafka", "KAFKA_VERSION", "NodeInfo"]
