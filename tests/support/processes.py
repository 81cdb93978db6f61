"""Run picrl commands as processes of their own (as users run them), with their output kept for failures.

Each command runs the CLI's ``main`` in a process forked from a fork server that imported torch, Faust and picrl
once, so a start costs a fork rather than the 3-5 s of importing torch again (tests start 40-odd workers). The
process is the CLI's own from ``main`` on: its own event loop, signals, exit code and log file."""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from multiprocessing.context import ForkServerContext
from multiprocessing.process import BaseProcess
from pathlib import Path

import pytest

from picrl.kafka.local_broker import pid_alive

REPO = Path(__file__).resolve().parents[2]

# What every picrl process imports before its arguments are read: imported once, in the fork server.
PRELOAD = ["torch", "faust", "picrl.cli", "picrl.commands.worker", "picrl.commands.trainer"]


# A short test run's trainer: a candidate barely moves and scores better than its parent about half the time, so no
# KL floor and a candidate every 4 transitions (the test paces its clock until a version is published).
SHORT_RUN_TRAINER = ("--update-every", "4", "--min-kl", "0")


def _bus_args(command: str, model: Path, bootstrap: str, prefix: str, partitions: int) -> list[str]:
    return [
        command,
        "--model",
        str(model),
        "--bootstrap",
        bootstrap,
        "--prefix",
        prefix,
        "--partitions",
        str(partitions),
    ]


def worker_args(
    model: Path, bootstrap: str, prefix: str, *extra: str, partitions: int, log_level: str = "warning"
) -> list[str]:
    """``picrl worker``'s arguments for a test: the app id ``<prefix>-worker``, ``log_level`` and ``extra``."""
    return [
        *_bus_args("worker", model, bootstrap, prefix, partitions),
        "--app-id",
        f"{prefix}-worker",
        "--log-level",
        log_level,
        *extra,
    ]


def short_trainer_args(model: Path, bootstrap: str, prefix: str, *extra: str, partitions: int) -> list[str]:
    """``picrl trainer``'s arguments for a short test run (:data:`SHORT_RUN_TRAINER`) and ``extra``."""
    return [*_bus_args("trainer", model, bootstrap, prefix, partitions), *SHORT_RUN_TRAINER, *extra]


@cache
def _fork_server() -> ForkServerContext:
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(PRELOAD)
    return context


def _run_cli(args: list[str], log: str, env: dict[str, str]) -> None:
    """The forked process: ``picrl ARGS`` with the caller's environment, stdout and stderr appended to ``log``."""
    os.environ.clear()
    os.environ.update(env)
    os.chdir(REPO)
    descriptor = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    for stream in (1, 2):
        os.dup2(descriptor, stream)
    sys.stdout = open(1, "w", buffering=1, closefd=False)  # line-buffered, as with PYTHONUNBUFFERED
    sys.stderr = open(2, "w", buffering=1, closefd=False)
    sys.argv = ["picrl", *args]
    from picrl.cli import main

    raise SystemExit(main(args))


class PicrlProcess:
    """A running ``picrl`` command with :class:`subprocess.Popen`'s interface (``returncode`` is ``-N`` after
    signal ``N``)."""

    def __init__(self, process: BaseProcess) -> None:
        self._process = process
        self.pid: int = process.pid  # type: ignore[assignment]  # set once started

    @property
    def returncode(self) -> int | None:
        return self._process.exitcode

    def poll(self) -> int | None:
        return self._process.exitcode if not self._process.is_alive() else None

    def wait(self, timeout: float | None = None) -> int:
        self._process.join(timeout)
        if self._process.exitcode is None:
            raise subprocess.TimeoutExpired(["picrl"], timeout or 0.0)
        return self._process.exitcode

    def send_signal(self, sig: int) -> None:
        if self._process.exitcode is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


Started = PicrlProcess | subprocess.Popen
"""A running picrl command: forked from the fork server, or a fresh interpreter."""


@contextmanager
def picrl_process(args: list[str], log: Path) -> Iterator[Started]:
    """``picrl ARGS`` in the background, its output written to ``log``, stopped with SIGTERM (then SIGKILL) on
    exit."""
    log.write_bytes(b"")
    process = spawn(args, log)
    try:
        yield process
    finally:
        stop(process)


def spawn(args: list[str], log: Path, *, fresh: bool = False) -> Started:
    """``picrl ARGS`` in the background, its output appended to ``log``; the caller stops it. ``fresh``: a new
    interpreter (``python -m picrl``, imports included), for benchmarks that time a start as users get it."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if fresh:
        return subprocess.Popen(
            [sys.executable, "-m", "picrl", *args], stdout=open(log, "ab"), stderr=subprocess.STDOUT, cwd=REPO, env=env
        )
    log.open("ab").close()  # there from the start, as a Popen's redirected output
    process = _fork_server().Process(target=_run_cli, args=(list(args), str(log), env), daemon=True)
    process.start()
    return PicrlProcess(process)


def stop(process: Started, timeout: float = 30.0) -> int:
    """SIGTERM, wait, SIGKILL if needed; the exit code."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    return process.returncode


def worker_pid(process: Started, timeout: float = 60.0) -> int:
    """The process that runs a ``picrl worker`` command's worker: the child it forks (``respawn``, on by default on
    Linux; elsewhere the command's own). The command builds the worker before it forks, and forks again after its
    child died: until a child runs, it is waited for (``timeout`` seconds at most), so that a fault meant for the
    worker process never hits the command."""
    children = Path(f"/proc/{process.pid}/task/{process.pid}/children")
    if not children.exists():
        return process.pid  # no children to read (not Linux, so no respawn), or the command is gone
    deadline = time.monotonic() + timeout
    while True:
        forked = [
            int(pid) for pid in (children.read_text().split() if children.exists() else []) if pid_alive(int(pid))
        ]
        if forked:
            return forked[-1]
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(
                f"worker command {process.pid} runs no forked worker process after {timeout:g} s "
                f"(exit code {process.poll()})"
            )
        time.sleep(0.05)


def forked_workers(log: Path) -> list[int]:
    """The worker processes that a ``picrl worker --respawn on`` logging (JSON, info) to ``log`` has forked, in
    order."""
    entries = (json.loads(line) for line in log.read_text().splitlines() if line.startswith("{"))
    return [
        int(entry["message"].split()[2])
        for entry in entries
        if entry["message"].startswith("worker process") and " forked " in entry["message"]
    ]


def tail(log: Path, lines: int = 40) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:]) if log.exists() else "(no log)"


def require_program(name: str, package: str) -> str:
    """The path of program ``name``; without it the test is skipped on a developer's machine and fails in
    CI (``CI=true``), where ``make test`` installs ``package``."""
    path = shutil.which(name)
    if path is None:
        message = f"{name} is not installed (Debian package {package}; `make test` installs it as root)"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    return path
