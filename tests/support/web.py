"""Helpers for the workers' web endpoints and Prometheus text in the integration tests."""

from __future__ import annotations

import json
import socket
import time
import urllib.error
import urllib.request


def free_port() -> int:
    """A loopback TCP port nobody listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(port: int, path: str, wait: float = 60.0) -> tuple[int, dict | str]:
    """GET ``path`` on a local endpoint (status, JSON body or text), waiting up to ``wait`` s for it to listen."""
    deadline = time.monotonic() + wait
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
                body = response.read().decode()
                status = response.status
            break
        except urllib.error.HTTPError as exc:
            status, body = exc.code, exc.read().decode()
            break
        except (urllib.error.URLError, ConnectionError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)
    try:
        return status, json.loads(body)
    except ValueError:
        return status, body


def metric(text: str, name: str, **labels: str) -> float:
    """The value of one sample in Prometheus exposition ``text`` (0 when absent)."""
    selector = name + ("{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}" if labels else "")
    for line in text.splitlines():
        if line.startswith(selector + " "):
            return float(line.split()[-1])
    return 0.0
