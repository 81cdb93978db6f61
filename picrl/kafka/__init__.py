"""The project-provisioned Apache Kafka cluster (KRaft, one node or N on loopback) and a liveness probe."""
from picrl.kafka.local_broker import BrokerError, BrokerInfo, LocalKafka, KAFKA_VERSION, NodeInfo

__all__ = ["BrokerError", "BrokerInfo", "LocalKafka", "KAFKA_VERSION", "NodeInfo"]
