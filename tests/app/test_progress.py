"""Progress goes to a terminal as bars and to logs as plain lines (no carriage-return frames)."""

from __future__ import annotations

import io

import pytest

import picrl.progress as progress
from picrl.progress import PhaseBars, PlainProgress, progress_bar


def test_off_a_terminal_progress_is_plain_lines(capsys: pytest.CaptureFixture[str]) -> None:
    with progress_bar(240, "closed loop", "tick") as bar:  # stderr is captured: not a terminal
        assert isinstance(bar, PlainProgress)
        for _ in range(240):
            bar.set_postfix(censored="3.1%", policy=2)
            bar.update(1)
    err = capsys.readouterr().err
    assert "\r" not in err and err.splitlines()[-1] == "closed loop: 240/240 tick (100%), censored=3.1%, policy=2"


def test_plain_lines_come_at_most_every_period(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = iter(range(0, 1000, 3))  # 3 s per call of time.monotonic
    monkeypatch.setattr(progress.time, "monotonic", lambda: next(clock))
    out = io.StringIO()
    with PlainProgress(20, "phase 1: predictor", "epoch", every=10.0, file=out) as bar:
        for _ in range(20):
            bar.update(1)
    lines = out.getvalue().splitlines()
    assert 4 <= len(lines) <= 8 and lines[-1] == "phase 1: predictor: 20/20 epoch (100%)"


def test_phase_bars_write_one_plain_block_per_phase(capsys: pytest.CaptureFixture[str]) -> None:
    with PhaseBars() as bars:
        first = bars.phase(3, "phase 1: predictor", "epoch", ("val_mae",))
        second = bars.phase(2, "phase 2: actor-critic", "iter", ("value_loss",))
        for epoch in range(3):
            first({"val_mae": 0.1 / (epoch + 1)})
        for _ in range(2):
            second({"value_loss": 0.5})
    lines = capsys.readouterr().err.splitlines()
    assert lines == [
        "phase 1: predictor: 3/3 epoch (100%), val_mae=0.03333",
        "phase 2: actor-critic: 2/2 iter (100%), value_loss=0.5",
    ]
