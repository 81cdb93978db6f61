"""What every benchmark records about the machine it ran on, and how much CPU the host took away.

These machines are virtual and shared: the hypervisor's *steal* time (``/proc/stat``) is CPU time the
guest wanted and did not get. A benchmark reports the steal share of its measured window next to
each number, so a slow row can be told from a busy host.
"""

from __future__ import annotations

import os
import platform
import sys
from pathlib import Path

import torch


def _cpu_jiffies() -> tuple[int, int]:
    """(steal, total) jiffies of all CPUs since boot; (0, 0) where ``/proc/stat`` is missing."""
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    except OSError:
        return 0, 0
    values = [int(v) for v in fields[:8]]  # user nice system idle iowait irq softirq steal
    return values[7], sum(values)


def steal_seconds() -> float:
    """CPU seconds stolen by the host since boot, summed over all CPUs."""
    return _cpu_jiffies()[0] / os.sysconf("SC_CLK_TCK")


class StealMeter:
    """Share of CPU time stolen by the host since the meter was made, read by :meth:`share`."""

    def __init__(self) -> None:
        self._start = _cpu_jiffies()

    def share(self) -> float:
        steal, total = _cpu_jiffies()
        elapsed = total - self._start[1]
        return (steal - self._start[0]) / elapsed if elapsed > 0 else 0.0


def describe() -> dict[str, object]:
    """The machine, the interpreter and the load: the context every result JSON carries."""
    return {
        "platform": platform.platform(),
        "processor": platform.processor(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "load_average": os.getloadavg(),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
    }
