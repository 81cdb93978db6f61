"""Counter-based Gaussian noise: the exploration draw for (seed, service, tick) is a pure function.

A stream worker sees a service's ticks in whatever batches arrive; the simulator steps all services
together. Drawing exploration noise from a stateful RNG would make their decisions differ. Hashing
the counter ``(seed, service key, tick, dimension)`` with SplitMix64 gives the same normal draw in
both, whatever the batching.
"""

from __future__ import annotations

import hashlib

import numpy as np

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
_KEY_MULT = np.uint64(0xD6E8FEB86659FD93)
_TICK_MULT = np.uint64(0xA0761D6478BD642F)
_DIM_MULT = np.uint64(0xE7037ED1A0B428DB)


def service_key(service_id: str) -> int:
    """A stable 63-bit integer key for a service id (same in every process and platform)."""
    return int.from_bytes(hashlib.blake2b(service_id.encode(), digest_size=8).digest(), "little") >> 1


def _splitmix64(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        z = x + _GOLDEN
        z = (z ^ (z >> np.uint64(30))) * _MIX1
        z = (z ^ (z >> np.uint64(27))) * _MIX2
        return z ^ (z >> np.uint64(31))


def _uniform(bits: np.ndarray) -> np.ndarray:
    """Map 64 random bits to a float64 in the open interval (0, 1)."""
    return ((bits >> np.uint64(11)).astype(np.float64) + 0.5) / float(1 << 53)


def counter_normal(seed: int, keys: np.ndarray, ticks: np.ndarray, dims: int) -> np.ndarray:
    """Standard normal draws of shape ``(B, dims)`` determined by ``(seed, keys[i], ticks[i], d)`` only
    (Box-Muller on two SplitMix64 streams)."""
    keys = np.asarray(keys, dtype=np.uint64)[:, None]
    ticks = np.asarray(ticks, dtype=np.int64).astype(np.uint64)[:, None]
    dim = np.arange(dims, dtype=np.uint64)[None, :]
    with np.errstate(over="ignore"):
        base = _splitmix64(np.uint64(seed) ^ (keys * _KEY_MULT)) ^ (ticks * _TICK_MULT) ^ (dim * _DIM_MULT)
    first = _splitmix64(base)
    second = _splitmix64(first)
    return np.sqrt(-2.0 * np.log(_uniform(first))) * np.cos(2.0 * np.pi * _uniform(second))
