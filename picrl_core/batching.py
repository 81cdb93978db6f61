"""Batch-invariant inference: the same row gives the same bits whatever batch it arrives in.

BLAS picks different kernels (and summation orders) for different batch sizes, so a service's
``(mu, sigma)`` computed alone differed from the same service computed among 37 others by ~1e-8.
A stream worker sees services in whatever batches arrive while the simulator steps all of them at
once; to keep their decisions identical bit for bit, the networks always run on fixed-size chunks
of :data:`INVARIANT_CHUNK` rows, the last one padded by repeating its first row.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

# Rows per forward pass. Larger chunks raise throughput on big batches (LSTM: ~54k rows/s at 64,
# ~81k at 256 on one core) but cost a single event the time of a full chunk.
INVARIANT_CHUNK = 128


def in_fixed_chunks(
    fn: Callable[[np.ndarray], tuple[np.ndarray, ...]], rows: np.ndarray, chunk: int = INVARIANT_CHUNK
) -> tuple[np.ndarray, ...]:
    """``fn`` applied to ``rows`` (B, ...) in chunks of exactly ``chunk`` rows; outputs concatenated
    and trimmed to B rows. ``fn`` returns a tuple of arrays whose first axis is the row axis."""
    outputs: list[tuple[np.ndarray, ...]] = []
    for lo in range(0, rows.shape[0], chunk):
        part = rows[lo : lo + chunk]
        count = part.shape[0]
        if count < chunk:
            part = np.concatenate([part, np.repeat(part[:1], chunk - count, axis=0)])
        outputs.append(tuple(out[:count] for out in fn(np.ascontiguousarray(part))))
    return tuple(np.concatenate(parts) for parts in zip(*outputs))
