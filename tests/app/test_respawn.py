"""``respawn``: the worker run in a forked child, forked again when a signal kills it (picrl/commands/respawn.py).

Each case runs :func:`respawning` in a process of its own (it forks its caller), with a stand-in for the worker; the
worker under Kafka is tested in tests/stream/test_reliability.py."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from picrl.commands.respawn import RESPAWNS_PER_MINUTE, respawn_wanted
from picrl.kafka.local_broker import pid_alive
from picrl.settings import load_settings

SCRIPT = """
import logging, os, signal, sys, time
from pathlib import Path
from picrl.commands.respawn import respawning

logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
starts = Path(sys.argv[1])

def worker():
    with starts.open("a") as f:
        f.write(f"{os.getpid()}\\n")
    n = len(starts.read_text().split())
    behaviour = sys.argv[2]
    if behaviour == "killed-once" and n == 1 or behaviour == "always-killed":
        os.kill(os.getpid(), signal.SIGKILL)
    if behaviour == "exits-3":
        return 3
    if behaviour == "waits":
        time.sleep(60)
    return 0

sys.exit(respawning(worker))
"""


def _run(tmp_path: Path, behaviour: str) -> tuple[int, list[str], str]:
    starts = tmp_path / "starts"
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(starts), behaviour], capture_output=True, text=True, timeout=60
    )
    return done.returncode, starts.read_text().split(), done.stderr


def test_respawn_is_on_by_default_where_the_worker_can_die_with_its_command(monkeypatch: pytest.MonkeyPatch) -> None:
    default = load_settings(environ={})["respawn"]
    monkeypatch.setattr(sys, "platform", "linux")
    assert respawn_wanted(default) and respawn_wanted("on") and not respawn_wanted("off")
    monkeypatch.setattr(sys, "platform", "darwin")
    assert not respawn_wanted(default) and respawn_wanted("on")


def test_a_worker_killed_by_a_signal_is_forked_again_and_its_exit_code_is_the_commands(tmp_path: Path) -> None:
    code, starts, log = _run(tmp_path, "killed-once")
    assert code == 0 and len(set(starts)) == 2, log
    assert f"worker process {starts[0]} killed by SIGKILL: forking a new one" in log


def test_a_worker_that_exits_by_itself_is_not_forked_again(tmp_path: Path) -> None:
    code, starts, log = _run(tmp_path, "exits-3")
    assert code == 3 and len(starts) == 1, log


def test_a_crash_loop_ends_the_command(tmp_path: Path) -> None:
    code, starts, log = _run(tmp_path, "always-killed")
    assert code == 128 + signal.SIGKILL and len(starts) == RESPAWNS_PER_MINUTE + 1, log
    assert "within a minute: not forked again" in log


def test_sigterm_reaches_the_worker_and_a_killed_command_takes_its_worker_with_it(tmp_path: Path) -> None:
    starts = tmp_path / "starts"
    for sig, expected in ((signal.SIGTERM, 128 + signal.SIGTERM), (signal.SIGKILL, -signal.SIGKILL)):
        starts.unlink(missing_ok=True)
        command = subprocess.Popen([sys.executable, "-c", SCRIPT, str(starts), "waits"], stderr=subprocess.PIPE)
        deadline = time.monotonic() + 30
        while not (starts.exists() and starts.read_text().strip()) and time.monotonic() < deadline:
            time.sleep(0.05)
        worker = int(starts.read_text().split()[0])
        command.send_signal(sig)
        assert command.wait(30) == expected
        deadline = time.monotonic() + 10
        while pid_alive(worker) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not pid_alive(worker), f"worker {worker} outlived its command ({sig.name})"
        assert len(starts.read_text().split()) == 1  # a stop is not a crash: not forked again
        command.stderr.close()  # type: ignore[union-attr]
