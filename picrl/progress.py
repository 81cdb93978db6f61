"""Progress for the long commands: tqdm bars on a terminal, plain periodic lines elsewhere.

A bar redrawn with carriage returns fills a log file (``picrl up > up.log``, CI, the child processes'
logs) with frames; :func:`progress_bar` therefore draws a tqdm bar only when stderr is a terminal,
and otherwise returns a :class:`PlainProgress` with the same calls that writes one line at most every
``PLAIN_EVERY`` seconds and a last one when it closes. The core only calls plain callbacks.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

from tqdm import tqdm

Callback = Callable[[dict[str, float]], None]
PLAIN_EVERY = 10.0  # seconds between two plain progress lines


class PlainProgress:
    """tqdm's ``update``/``set_postfix``/``close`` as lines like ``closed loop: 120/240 tick (50%), censored=3.1%``."""

    def __init__(
        self, total: int, desc: str, unit: str, every: float = PLAIN_EVERY, file: TextIO | None = None
    ) -> None:
        self.total, self.desc, self.unit, self.every = total, desc, unit, every
        self.file = file or sys.stderr
        self.n, self.postfix, self._printed_n = 0, "", -1
        self._last = time.monotonic()

    def update(self, n: int = 1) -> None:
        self.n += n
        if time.monotonic() - self._last >= self.every:
            self._line()

    def set_postfix(self, ordered_dict: dict[str, Any] | None = None, refresh: bool = True, **kwargs: Any) -> None:
        self.postfix = ", ".join(f"{k}={v}" for k, v in {**(ordered_dict or {}), **kwargs}.items())

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> None:
        self.postfix = s

    def close(self) -> None:
        if self._printed_n != self.n:
            self._line()

    def _line(self) -> None:
        share = f" ({self.n / self.total:.0%})" if self.total else ""
        print(
            f"{self.desc}: {self.n}/{self.total} {self.unit}{share}" + (f", {self.postfix}" if self.postfix else ""),
            file=self.file,
            flush=True,
        )
        self._printed_n, self._last = self.n, time.monotonic()

    def __enter__(self) -> PlainProgress:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def progress_bar(total: int, desc: str, unit: str) -> tqdm | PlainProgress:
    """A tqdm bar on a terminal, plain periodic lines otherwise (both close as context managers)."""
    if sys.stderr.isatty():
        return tqdm(total=total, desc=desc, unit=unit, dynamic_ncols=True)
    return PlainProgress(total, desc, unit)


class PhaseBars:
    """One bar per phase, shown one after the other: a phase's bar opens at its first report and
    closes the previous one. Use as a context manager so the last bar is closed too."""

    def __init__(self) -> None:
        self._bar: tqdm | PlainProgress | None = None

    def phase(self, total: int, description: str, unit: str, fields: tuple[str, ...]) -> Callback:
        def update(report: dict[str, float]) -> None:
            if self._bar is None or self._bar.desc != description:
                self.close()
                self._bar = progress_bar(total, description, unit)
            self._bar.set_postfix({k: f"{report[k]:.4g}" for k in fields if k in report})
            self._bar.update(1)

        return update

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self) -> PhaseBars:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()
