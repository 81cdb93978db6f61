"""Run picrl commands as child processes (as users run them), with their output kept for failures."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


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


@contextmanager
def picrl_process(args: list[str], log: Path) -> Iterator[subprocess.Popen]:
    """``python -m picrl ARGS`` in the background, stopped with SIGTERM (then SIGKILL) on exit."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "picrl", *args], stdout=out, stderr=subprocess.STDOUT, cwd=REPO, env=env
        )
        try:
            yield process
        finally:
            stop(process)


def spawn(args: list[str], log: Path) -> subprocess.Popen:
    """``python -m picrl ARGS`` in the background, its output appended to ``log``; the caller stops it."""
    return subprocess.Popen(
        [sys.executable, "-m", "picrl", *args],
        stdout=open(log, "ab"),
        stderr=subprocess.STDOUT,
        cwd=REPO,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def stop(process: subprocess.Popen, timeout: float = 30.0) -> int:
    """SIGTERM, wait, SIGKILL if needed; the exit code."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    return process.returncode


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
