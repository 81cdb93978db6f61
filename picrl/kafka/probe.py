"""A dependency-free Kafka liveness probe: one Metadata (v1) request over a plain socket.

Used to decide that a broker is up without starting an asyncio loop (the probe runs from the CLI,
from pytest fixtures and from inside running event loops alike).
"""
from __future__ import annotations

import socket
import struct

_METADATA_API_KEY = 3
_METADATA_VERSION = 1
_CLIENT_ID = b"picrl-probe"


def _metadata_request(correlation_id: int) -> bytes:
    header = struct.pack(">hhih", _METADATA_API_KEY, _METADATA_VERSION, correlation_id, len(_CLIENT_ID)) + _CLIENT_ID
    body = struct.pack(">i", -1)  # null topic array: "all topics"
    payload = header + body
    return struct.pack(">i", len(payload)) + payload


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    chunks = bytearray()
    while len(chunks) < n:
        chunk = sock.recv(n - len(chunks))
        if not chunk:
            raise ConnectionError("broker closed the connection")
        chunks.extend(chunk)
    return bytes(chunks)


def broker_count(host: str, port: int, timeout: float = 2.0) -> int:
    """Number of live brokers the node at ``host:port`` reports in a Metadata response.

    Raises ``OSError`` when nothing answers (connection refused, reset or timed out).
    """
    correlation_id = 7
    with socket.create_connection((host, port), timeout=timeout) as sock:
        sock.settimeout(timeout)
        sock.sendall(_metadata_request(correlation_id))
        (size,) = struct.unpack(">i", _recv_exact(sock, 4))
        body = _recv_exact(sock, size)
    got_id, n_brokers = struct.unpack_from(">ii", body, 0)
    if got_id != correlation_id:
        raise ConnectionError(f"unexpected correlation id {got_id} in metadata response")
    return n_brokers


def answers_metadata(bootstrap: str, timeout: float = 2.0) -> bool:
    """True when the broker at ``bootstrap`` ("host:port") answers Metadata with at least one broker."""
    host, _, port = bootstrap.rpartition(":")
    try:
        return broker_count(host, int(port), timeout) > 0
    except (OSError, ConnectionError, struct.error):
        return False
