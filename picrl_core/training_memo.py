"""Offline training shared by the methods of a comparison: identical phases run once.

Phases 1 and 2 are deterministic functions of the series values, the config fields they read and the
substituted components (every random draw is seeded from ``config.seed`` inside them). Many rows of
Tables 2 and 3 repeat the same training: PIC-RL, CQL, Pensieve, conformal, Thompson sampling and
every ablation train the same Phase-1 LSTM, and ablations A5/A6 (online switches) the same Phase 2.
Inside a :func:`shared_training` block, :func:`memoized` returns the result of an earlier identical
call instead of recomputing it; outside one, it always computes. Results are shared objects: callers
must not modify them (every consumer copies the networks it trains further).

>>> calls = []
>>> with shared_training():
...     first = memoized(("phase1", 0), lambda: calls.append(1) or "net")
...     again = memoized(("phase1", 0), lambda: calls.append(1) or "net")
>>> first is again, len(calls)
(True, 1)
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from typing import TypeVar

import numpy as np

from picrl_core.series import PreparedSeries

T = TypeVar("T")
_memo: dict[Hashable, object] | None = None


@contextmanager
def shared_training() -> Iterator[None]:
    """Share offline training between identical calls until the block ends (then it is released)."""
    global _memo
    outer, _memo = _memo, ({} if _memo is None else _memo)
    try:
        yield
    finally:
        _memo = outer


def memoized(key: Hashable, compute: Callable[[], T]) -> T:
    """``compute()``, or inside :func:`shared_training` the value an earlier call with ``key`` returned."""
    if _memo is None:
        return compute()
    if key not in _memo:
        _memo[key] = compute()
    return _memo[key]  # type: ignore[return-value]  # the memo holds what compute() of this key returned


def series_fingerprint(series: PreparedSeries) -> str:
    """Digest of the training and validation values (and context, and how many services they hold)
    that offline training reads."""
    digest = hashlib.sha256(f"{series.name}/{series.services}".encode())
    for part in (series.train, series.val, series.train_ctx, series.val_ctx):
        if part is not None:
            digest.update(np.ascontiguousarray(part, dtype=np.float64).tobytes())
    return digest.hexdigest()
