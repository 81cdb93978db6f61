"""The commands' logging: one stderr handler, which writes to whatever ``sys.stderr`` is at the time."""

from __future__ import annotations

import io
import logging
import sys
from collections.abc import Iterator

import pytest

from picrl.commands.bus import CurrentStderr, configure_logging


@pytest.fixture
def root_restored() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:], root.level = handlers, level


@pytest.mark.usefixtures("root_restored")
def test_a_command_run_in_process_never_writes_to_a_closed_stderr(monkeypatch: pytest.MonkeyPatch) -> None:
    """A command configured while its caller had swapped stderr for a capture (pytest's, a notebook's) keeps
    logging after that capture is closed: to the stderr of the moment, without ``--- Logging error ---``."""
    failed: list[logging.LogRecord] = []
    monkeypatch.setattr(CurrentStderr, "handleError", lambda _, record: failed.append(record))
    capture, after = io.StringIO(), io.StringIO()
    with monkeypatch.context() as swapped:
        swapped.setattr(sys, "stderr", capture)
        configure_logging("info")
        logging.getLogger("picrl.test").warning("during the command")
    assert "during the command" in capture.getvalue()
    capture.close()
    monkeypatch.setattr(sys, "stderr", after)
    logging.getLogger("picrl.test").warning("after it")
    assert not failed and "after it" in after.getvalue()
