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


def broker_count_or_zero(address: str, timeout: float = 2.0) -> int:
    """:func:`broker_count` of the node at ``address`` ("host:port"), 0 when it does not answer."""
    host, _, port = address.rpartition(":")
    try:
        return broker_count(host, int(port), timeout)
    except (OSError, ConnectionError, struct.error, ValueError):
        return 0


def answers_metadata(bootstrap: str, timeout: float = 2.0) -> bool:
    """True when a node of ``bootstrap`` ("host:port", or several comma separated) answers Metadata with at
    least one broker."""
    addresses = [address.strip() for address in bootstrap.split(",") if address.strip()]
    return any(broker_count_or_zero(address, timeout) > 0 for address in addresses)
