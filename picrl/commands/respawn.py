"""A worker process forked again at once when a signal kills it (``respawn`` setting: on by default on Linux).

The process that runs ``picrl worker`` has imported torch, Faust and picrl (3-5 s on a 2-core host), loaded the
model, looked up the brokers, checked the topics, built the worker and claimed its static-membership slot and web
port. With ``respawn`` on it forks the worker from there, so a worker killed by a signal (the OOM killer, a crash in
native code, ``kill -9`` of the worker process) is back in a fork's time and rejoins its group with the same
instance id: its partitions come back without a rebalance. SIGTERM and SIGINT reach the worker, which stops as it
always does, and its exit code is the command's. A worker that exits by itself (0, or an error's code) is not forked
again, nor one killed more than ``RESPAWNS_PER_MINUTE`` times in a minute (a crash loop is the orchestrator's to
handle). The worker dies with this process (``PR_SET_PDEATHSIG``), so a kill of the whole command never leaves a
worker behind. A worker forked again skips the command's wait for Kafka (``bootstrap_timeout``): it starts as
Faust starts, against the brokers the command found.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys
import time
from collections.abc import Callable
from types import FrameType

RESPAWNS_PER_MINUTE = 5
_PR_SET_PDEATHSIG = 1

log = logging.getLogger("picrl.worker")


def _die_with_parent(parent: int) -> None:
    """Have the kernel SIGKILL this process when its parent dies (Linux); if the parent is already gone, exit."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent:
        os._exit(1)


def respawn_wanted(setting: str) -> bool:
    """Whether the ``respawn`` setting runs the worker in a forked child: ``on``, or ``auto`` (the default) on Linux."""
    return setting == "on" or (setting == "auto" and sys.platform.startswith("linux"))


def respawning(worker: Callable[[], int]) -> int:
    """Run ``worker()`` in a forked child, forked again whenever a signal other than SIGTERM or SIGINT kills it;
    the child's exit code once it exits by itself or is stopped. In the child this returns ``worker()``'s code."""
    if not sys.platform.startswith("linux"):
        raise OSError("respawn needs Linux (PR_SET_PDEATHSIG): set respawn off")
    parent, stopping, deaths = os.getpid(), [], []
    child = 0

    def forward(signum: int, _frame: FrameType | None) -> None:
        stopping.append(signum)
        if child:
            os.kill(child, signum)

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGTERM, signal.SIGINT)}
    while True:
        child = os.fork()
        if child == 0:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            _die_with_parent(parent)
            return worker()
        if stopping:
            os.kill(child, stopping[0])  # stopped while forking
        log.info("worker process %d forked (respawn on: forked again if a signal kills it)", child)
        _, status = os.waitpid(child, 0)
        code = os.waitstatus_to_exitcode(status)
        if code >= 0 or stopping:
            return code if code >= 0 else 128 - code
        now = time.monotonic()
        deaths[:] = [t for t in deaths if now - t < 60.0] + [now]
        if len(deaths) > RESPAWNS_PER_MINUTE:
            log.error(
                "worker process %d killed by %s, %d deaths within a minute: not forked again",
                child,
                signal.Signals(-code).name,
                len(deaths),
            )
            return 128 - code
        log.warning("worker process %d killed by %s: forking a new one", child, signal.Signals(-code).name)
