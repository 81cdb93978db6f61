"""Progress bars (tqdm) for the long offline phases; the core only calls plain callbacks."""
from __future__ import annotations

from typing import Callable

from tqdm import tqdm

Callback = Callable[[dict[str, float]], None]


class PhaseBars:
    """One bar per phase, shown one after the other: a phase's bar opens at its first report and
    closes the previous one. Use as a context manager so the last bar is closed too."""

    def __init__(self) -> None:
        self._bar: tqdm | None = None

    def phase(self, total: int, description: str, unit: str, fields: tuple[str, ...]) -> Callback:
        def update(report: dict[str, float]) -> None:
            if self._bar is None or self._bar.desc != description:
                self.close()
                self._bar = tqdm(total=total, desc=description, unit=unit, dynamic_ncols=True)
            self._bar.update(1)
            self._bar.set_postfix({k: f"{report[k]:.4g}" for k in fields if k in report})
        return update

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self) -> "PhaseBars":
        return self

    def __exit__(self, *_: object) -> None:
        self.close()
