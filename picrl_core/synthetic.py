"""Seeded synthetic demand series in ``[0, 1]`` for tests and for checking Proposition 1.

Proposition 1 (Sec. 3.2.3) says a learner that tracks the mean of censored observations drifts
downwards even at the unbiased point; these generators give demand with a known law (stationary,
seasonal, or heavy-tailed and bursty) on which that drift and the controller can be verified without
production data. Every generator draws from ``np.random.default_rng(seed)`` only, returns a float64
array of length ``n`` clipped to ``[0, 1]``, and is identical for identical arguments.
"""

from __future__ import annotations

import numpy as np


def _check_length(n: int) -> None:
    if n < 1:
        raise ValueError(f"series length must be positive, got {n}")


def stationary_gaussian(n: int, mean: float = 0.5, std: float = 0.1, seed: int = 0) -> np.ndarray:
    """i.i.d. ``N(mean, std^2)`` demand clipped to ``[0, 1]``.

    With the defaults the clipping is a 5-sigma event, so the sample mean/std match the parameters.
    """
    _check_length(n)
    if std < 0:
        raise ValueError(f"std must be non-negative, got {std}")
    rng = np.random.default_rng(seed)
    return np.clip(rng.normal(mean, std, n), 0.0, 1.0)


def diurnal(
    n: int, period: int = 1440, base: float = 0.45, amplitude: float = 0.25, noise: float = 0.03, seed: int = 0
) -> np.ndarray:
    """``base + amplitude * sin(2 pi t / period) + noise * eps_t``, ``eps_t ~ N(0, 1)``, clipped.

    ``period`` is in steps (1440 = one day of 60 s steps, like the DLRM trace).
    """
    _check_length(n)
    if period < 2:
        raise ValueError(f"period must be at least 2 steps, got {period}")
    rng = np.random.default_rng(seed)
    t = np.arange(n)
    return np.clip(base + amplitude * np.sin(2 * np.pi * t / period) + noise * rng.standard_normal(n), 0.0, 1.0)


def heavy_tailed_bursts(
    n: int,
    base: float = 0.3,
    noise: float = 0.02,
    burst_rate: float = 0.01,
    tail_index: float = 1.5,
    burst_scale: float = 0.1,
    decay: float = 0.8,
    seed: int = 0,
) -> np.ndarray:
    """Flat load with Pareto-sized bursts that decay geometrically (GenAI-like spikes).

    A burst starts at each step with probability ``burst_rate``; its size is
    ``burst_scale * P`` with ``P`` classical Pareto (minimum 1, tail index ``tail_index``, so
    ``P(P > p) = p^-tail_index``). The excess load obeys ``e_t = decay * e_{t-1} + size_t`` and the
    demand is ``base + e_t + noise * eps_t``, clipped to ``[0, 1]``.
    """
    _check_length(n)
    if not 0 <= burst_rate <= 1:
        raise ValueError(f"burst_rate must be a probability, got {burst_rate}")
    if tail_index <= 0 or burst_scale < 0 or not 0 <= decay < 1:
        raise ValueError(
            f"need tail_index > 0, burst_scale >= 0 and 0 <= decay < 1, got {tail_index}, {burst_scale}, {decay}"
        )
    rng = np.random.default_rng(seed)
    onsets = rng.random(n) < burst_rate
    sizes = np.where(onsets, burst_scale * (1.0 + rng.pareto(tail_index, n)), 0.0)
    eps = rng.standard_normal(n)
    excess = np.empty(n)
    level = 0.0
    for t in range(n):
        level = decay * level + sizes[t]
        excess[t] = level
    return np.clip(base + excess + noise * eps, 0.0, 1.0)


def surges(
    n: int,
    base: float = 0.3,
    noise: float = 0.02,
    period: int = 288,
    amplitude: float = 0.05,
    count: int = 12,
    height: tuple[float, float] = (0.2, 0.4),
    length: tuple[int, int] = (5, 30),
    seed: int = 0,
) -> np.ndarray:
    """A daily wave ``base + amplitude * sin(2 pi t / period)`` with ``count`` flat surges of uniform
    ``height`` lasting a uniform number of steps in ``length`` (a deploy, a traffic spike), clipped."""
    _check_length(n)
    if count < 0 or length[0] < 1 or length[1] < length[0] or n <= length[1]:
        raise ValueError(f"need count >= 0, 1 <= length[0] <= length[1] < n; got {count}, {length}, n={n}")
    rng = np.random.default_rng(seed)
    t = np.arange(n)
    demand = base + amplitude * np.sin(2 * np.pi * t / period) + noise * rng.standard_normal(n)
    for start in rng.choice(n - length[1], count, replace=False):
        demand[start : start + rng.integers(length[0], length[1] + 1)] += rng.uniform(*height)
    return np.clip(demand, 0.0, 1.0)


def linear_drift(
    n: int,
    start: float = 0.3,
    end: float = 0.8,
    period: int = 144,
    amplitude: float = 0.05,
    noise: float = 0.02,
    seed: int = 0,
) -> np.ndarray:
    """Demand rising linearly from ``start`` to ``end`` under a wave of ``period`` steps (a growing
    service), clipped: under train-only scaling its later part lies above the training range."""
    _check_length(n)
    rng = np.random.default_rng(seed)
    t = np.arange(n)
    trend = start + (end - start) * t / max(n - 1, 1)
    return np.clip(trend + amplitude * np.sin(2 * np.pi * t / period) + noise * rng.standard_normal(n), 0.0, 1.0)


def exponential_growth(
    n: int,
    start: float = 0.15,
    end: float = 0.9,
    period: int = 288,
    amplitude: float = 0.1,
    noise: float = 0.01,
    seed: int = 0,
) -> np.ndarray:
    """A service that outgrows its history: a level rising geometrically from ``start`` to ``end``, under a
    daily wave of relative ``amplitude``, ``level_t (1 + amplitude sin(2 pi t / period)) + noise eps_t``,
    clipped. With the defaults each split of a 60/20/20 cut peaks above the one before, so validation and
    test demand lie above the training range (DLRM's shape, where :func:`linear_drift` grows by an
    additive step)."""
    _check_length(n)
    if not 0 < start < end:
        raise ValueError(f"need 0 < start < end; got {start}, {end}")
    rng = np.random.default_rng(seed)
    t = np.arange(n)
    level = start * (end / start) ** (t / max(n - 1, 1))
    wave = 1.0 + amplitude * np.sin(2 * np.pi * t / period)
    return np.clip(level * wave + noise * rng.standard_normal(n), 0.0, 1.0)


def intermittent(
    n: int,
    idle_share: tuple[float, float] = (0.1, 0.6),
    busy_length: float = 40.0,
    level: float = 0.5,
    spread: float = 0.15,
    noise: float = 0.02,
    seed: int = 0,
) -> np.ndarray:
    """A service that idles at 0 in stretches (scale to zero, a GPU pod between jobs): a two-state Markov
    chain whose busy stretches last ``busy_length`` steps on average and whose stationary idle share moves
    linearly from ``idle_share[0]`` to ``idle_share[1]`` over the series (a history that barely idles, a
    later day that idles often: GenAI's shape). Each busy stretch holds a level drawn from
    ``level * exp(spread * N(0, 1))``, plus ``noise * eps_t``; idle ticks are exactly 0."""
    _check_length(n)
    if not all(0 <= s < 1 for s in idle_share) or busy_length < 1:
        raise ValueError(f"need idle shares in [0, 1) and busy_length >= 1; got {idle_share}, {busy_length}")
    rng = np.random.default_rng(seed)
    share = np.linspace(idle_share[0], idle_share[1], n)
    leave_busy = 1.0 / busy_length
    # P(idle -> busy) = q with share = p / (p + q), p = P(busy -> idle)
    leave_idle = np.minimum(1.0, leave_busy * (1.0 - share) / np.maximum(share, 1e-9))
    demand = np.zeros(n)
    busy, stretch = True, level
    for t in range(n):
        if busy and rng.random() < leave_busy:
            busy = False
        elif not busy and rng.random() < leave_idle[t]:
            busy, stretch = True, level * np.exp(spread * rng.standard_normal())
        if busy:
            demand[t] = stretch + noise * rng.standard_normal()
    return np.clip(demand, 0.0, 1.0)


def idle_nights(
    n: int,
    period: int = 144,
    level: float = 0.6,
    amplitude: float = 0.2,
    night: float = 1 / 3,
    idle: float = 0.1,
    idle_from: float = 0.6,
    noise: float = 0.02,
    seed: int = 0,
) -> np.ndarray:
    """A daily wave whose nights go idle after a busy history: ``level (1 + amplitude sin(2 pi t / period)) +
    noise eps_t`` by day, and through the share ``night`` of each period around the wave's trough, from tick
    ``idle_from * n`` on, ``idle * level (1 + 5 noise eps_t)`` (``idle`` 0: the service scales to zero at night).
    Before that tick the nights stay busy on the wave, so a range fixed from the history has its floor at the
    day's trough (about ``level (1 - amplitude)``), far above the idle nights."""
    _check_length(n)
    if not 0 < night < 1 or idle < 0 or not 0 <= idle_from <= 1 or period < 2:
        raise ValueError(f"need 0 < night < 1, idle >= 0, idle_from in [0, 1], period >= 2; got {night}, {idle}")
    rng = np.random.default_rng(seed)
    t = np.arange(n)
    day = level * (1.0 + amplitude * np.sin(2 * np.pi * t / period)) + noise * rng.standard_normal(n)
    phase = (t % period) / period
    dark = (np.abs(phase - 0.75) < night / 2) & (t >= idle_from * n)
    quiet = idle * level * (1.0 + 5 * noise * rng.standard_normal(n))
    return np.clip(np.where(dark, quiet, day), 0.0, 1.0)


def night_ticks(n: int, period: int = 144, night: float = 1 / 3) -> np.ndarray:
    """The ticks of :func:`idle_nights`' nights (whether or not they idle yet), ``(n,)`` bool."""
    phase = (np.arange(n) % period) / period
    return np.abs(phase - 0.75) < night / 2


def shared_load_pods(n: int, pods: int = 24, period: int = 288, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Pods whose GPU memory and GPU compute follow one load, ``(memory, compute)``, each ``(n, pods)``: the
    shape where a memory shortage hides compute demand, which the bundled pods lack (their compute idles
    through the test split).

    Each pod's load is :func:`surges` (a daily wave of ``period`` steps at a phase of its own, with surges);
    memory is weights plus a per-request share, ``0.3 + 0.5 * load``, with little noise (0.005), and compute is
    ``0.8 * load`` with more (0.02), both clipped. So memory runs short when the load rises, exactly when
    compute is busy."""
    _check_length(n)
    if pods < 1:
        raise ValueError(f"need at least one pod, got {pods}")
    rng = np.random.default_rng(seed)
    memory, compute = np.empty((n, pods)), np.empty((n, pods))
    for j in range(pods):
        shift = int(rng.integers(period))
        load = surges(
            n + shift,
            base=0.4,
            amplitude=0.25,
            period=period,
            count=max(1, n // 180),
            height=(0.15, 0.35),
            length=(3, 20),
            seed=int(rng.integers(2**31)),
        )[shift:]
        memory[:, j] = np.clip(0.3 + 0.5 * load + 0.005 * rng.standard_normal(n), 0.0, 1.0)
        compute[:, j] = np.clip(0.8 * load + 0.02 * rng.standard_normal(n), 0.0, 1.0)
    return memory, compute
