"""Turning a raw demand trace into the paper's train/val/test series (Sec. 4.1.1, "Protocol").

The paper maps demand to ``[0, 1]`` by min-max scaling fitted *solely* on the training part, applies
the same scaling to validation and test, clips values outside the training range to ``[0, 1]`` and
splits chronologically 60/20/20. :func:`prepare_series` does exactly that after
:func:`validate_series` has rejected series nothing can be learned from and filled short gaps.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from picrl_core.resources import Resource, check_resources
from picrl_core.scaling import from_unit, to_unit

MAX_FILLED_GAP = 5  # the longest run of missing values filled by interpolation


class UnusableSeriesError(ValueError):
    """A series (or context channel) that cannot be used: too short, constant, gaps too long..."""


def missing_runs(missing: np.ndarray) -> list[tuple[int, int]]:
    """Half-open ``[start, stop)`` index ranges of consecutive ``True`` entries."""
    edges = np.diff(np.concatenate(([0], missing.astype(np.int8), [0])))
    return list(zip(np.flatnonzero(edges == 1).tolist(), np.flatnonzero(edges == -1).tolist()))


def plural(count: int, word: str) -> str:
    """``"1 point"``, ``"2 points"``: a count and its noun, for the messages on a series."""
    return f"{count} {word}{'' if count == 1 else 's'}"


def _check_and_fill(values: np.ndarray, label: str, max_gap: int) -> tuple[np.ndarray, list[str]]:
    """Reject all-NaN / infinite / constant data and NaN runs longer than ``max_gap``; fill the rest.

    Interior gaps are filled by linear interpolation, gaps touching either end by the nearest value.
    """
    missing = np.isnan(values)
    if missing.all():
        raise UnusableSeriesError(f"{label} has no values (every entry is missing)")
    infinite = np.flatnonzero(np.isinf(values))
    if infinite.size:
        raise UnusableSeriesError(
            f"{label} has {plural(infinite.size, 'infinite value')} (first at index {infinite[0]})"
        )
    runs = missing_runs(missing)
    longest = max(runs, key=lambda r: r[1] - r[0], default=None)
    if longest is not None and longest[1] - longest[0] > max_gap:
        start, stop = longest
        raise UnusableSeriesError(
            f"{label} has a gap of {stop - start} consecutive missing values (index {start} to "
            f"{stop - 1}); at most {max_gap} can be filled"
        )
    present = values[~missing]
    if present.max() == present.min():
        raise UnusableSeriesError(f"{label} is constant (every value is {present[0]:g}); nothing to learn")
    if not runs:
        return values.copy(), []
    index = np.arange(values.size)
    # np.interp holds the first/last known value beyond the ends: "nearest value" for edge gaps.
    filled = np.interp(index, index[~missing], present)
    n = values.size
    edge = [r for r in runs if r[0] == 0 or r[1] == n]
    inner = [r for r in runs if r not in edge]
    notes = []
    if inner:
        points = sum(b - a for a, b in inner)
        notes.append(f"filled {plural(len(inner), 'gap')} ({plural(points, 'point')}) by linear interpolation")
    if edge:
        points = sum(b - a for a, b in edge)
        notes.append(
            f"filled {plural(len(edge), 'gap')} ({plural(points, 'point')}) at the series ends with the nearest value"
        )
    return filled, notes


def validate_series(
    values: np.ndarray, name: str, *, min_length: int = 200, max_gap: int = MAX_FILLED_GAP
) -> tuple[np.ndarray, list[str]]:
    """Check a 1-D demand series and fill its short gaps.

    Raises :class:`UnusableSeriesError` (naming ``name``) when the series is not 1-D, has fewer than
    ``min_length`` points, is all missing, holds an infinite value, is constant, or has a run of
    more than ``max_gap`` consecutive NaNs. Returns the gap-filled float64 copy and notes on what
    was filled (empty when nothing was).
    """
    x = np.asarray(values, dtype=np.float64)
    if x.ndim != 1:
        raise UnusableSeriesError(f"series '{name}' must be one-dimensional, got shape {x.shape}")
    if x.size < min_length:
        raise UnusableSeriesError(f"series '{name}' has {plural(x.size, 'point')}; at least {min_length} are needed")
    return _check_and_fill(x, f"series '{name}'", max_gap)


def validate_context(
    context: np.ndarray, names: Sequence[str], max_gap: int = MAX_FILLED_GAP
) -> tuple[np.ndarray, list[str]]:
    """:func:`validate_series` applied to every column of a ``(T, C)`` context matrix.

    ``names`` labels the ``C`` channels; notes are prefixed with the channel's name.
    """
    ctx = np.asarray(context, dtype=np.float64)
    if ctx.ndim != 2:
        raise UnusableSeriesError(f"context must be a (time, channels) matrix, got shape {ctx.shape}")
    if len(names) != ctx.shape[1]:
        raise UnusableSeriesError(
            f"context has {ctx.shape[1]} channels but {len(names)} names were given ({', '.join(names)})"
        )
    filled = np.empty_like(ctx)
    notes: list[str] = []
    for j, channel in enumerate(names):
        filled[:, j], channel_notes = _check_and_fill(ctx[:, j], f"context channel '{channel}'", max_gap)
        notes.extend(f"context '{channel}': {note}" for note in channel_notes)
    return filled, notes


def chronological_split(n: int, fractions: tuple[float, float, float] = (0.6, 0.2, 0.2)) -> tuple[slice, slice, slice]:
    """Consecutive train/validation/test slices of ``range(n)`` (paper: 60/20/20, no shuffling)."""
    if len(fractions) != 3 or any(f <= 0 for f in fractions) or abs(sum(fractions) - 1.0) > 1e-9:
        raise ValueError(f"split fractions must be three positive numbers summing to 1, got {fractions}")
    first = round(n * fractions[0])
    second = round(n * (fractions[0] + fractions[1]))
    if not 0 < first < second < n:
        raise UnusableSeriesError(f"{n} points are too few to split {fractions} with every part non-empty")
    return slice(0, first), slice(first, second), slice(second, n)


def native_splits(values: np.ndarray, name: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The train, validation and test splits of ``values`` (``(T,)`` or ``(T, N)`` for a fleet) in native
    units, unclipped, each ``(T_i, N)``: every series gap-filled (:func:`validate_series`) and cut by
    :func:`chronological_split`, as :func:`prepare_series` does before it scales. What the growth protocol
    (:mod:`picrl_core.methods.growth`) runs on."""
    columns = np.asarray(values, dtype=np.float64)
    columns = columns if columns.ndim == 2 else columns[:, None]
    matrix = np.column_stack([validate_series(columns[:, j], name)[0] for j in range(columns.shape[1])])
    train, val, test = (matrix[part] for part in chronological_split(matrix.shape[0]))
    return train, val, test


@dataclass(frozen=True)
class MinMaxScaler:
    """``z = clip((x - low) / (high - low), 0, 1)``, with ``low``/``high`` from the training part."""

    low: float
    high: float

    def __post_init__(self) -> None:
        if not (np.isfinite(self.low) and np.isfinite(self.high) and self.high > self.low):
            raise ValueError(f"scaler needs finite low < high, got low={self.low}, high={self.high}")

    @classmethod
    def fit(cls, values: np.ndarray, name: str = "series") -> MinMaxScaler:
        """Range of ``values`` (pass only the training part: no look-ahead)."""
        x = np.asarray(values, dtype=np.float64)
        if x.size == 0 or not np.isfinite(x).all():
            raise UnusableSeriesError(f"{name}: cannot fit a scaler on empty or non-finite values")
        low, high = float(x.min()), float(x.max())
        if high == low:
            raise UnusableSeriesError(
                f"{name}: the training part is constant ({low:g}), so it cannot be scaled to [0, 1]"
            )
        return cls(low, high)

    def transform(self, x: np.ndarray) -> np.ndarray:
        return to_unit(x, self.low, self.high)

    def inverse(self, x: np.ndarray) -> np.ndarray:
        return from_unit(x, self.low, self.high)

    def to_dict(self) -> dict[str, float]:
        return {"low": self.low, "high": self.high}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> MinMaxScaler:
        if set(data) != {"low", "high"}:
            raise ValueError(f"scaler expects exactly the keys 'low' and 'high', got {sorted(data)}")
        return cls(float(data["low"]), float(data["high"]))


@dataclass(frozen=True, eq=False)
class PreparedSeries:
    """A validated series split chronologically and scaled to ``[0, 1]`` with train-only statistics.

    ``*_ctx`` are ``(T_i, C)`` context matrices scaled per channel (``None`` without context).
    A fleet (:func:`prepare_fleet`) holds ``services`` equal-length series end to end in each split
    (service-major); windows and rollouts never straddle two of them (:func:`segment_starts`). A
    multi-resource fleet (:func:`prepare_resource_fleet`) holds ``len(resources)`` blocks of services,
    one per resource, each scaled on its own training part (``scaler`` is the first resource's).
    """

    name: str
    train: np.ndarray
    val: np.ndarray
    test: np.ndarray
    train_ctx: np.ndarray | None
    val_ctx: np.ndarray | None
    test_ctx: np.ndarray | None
    scaler: MinMaxScaler
    context_scalers: tuple[MinMaxScaler, ...]
    notes: tuple[str, ...]
    context_names: tuple[str, ...] = ()
    services: int = 1
    resources: tuple[Resource, ...] = ()

    def by_service(self, split: str) -> np.ndarray:
        """Split ``"train" | "val" | "test"`` as ``(services, T_i)``, one row per service."""
        return getattr(self, split).reshape(self.services, -1)


def segment_starts(total: int, services: int, before: int, after: int) -> np.ndarray:
    """Every start ``s`` of a slice ``[s - before, s + after)`` of a split of ``total`` points made of
    ``services`` equal segments end to end that lies inside one segment, in increasing order.
    ``services=1`` gives ``arange(before, total - after + 1)``."""
    if total % services:
        raise ValueError(f"{total} points cannot be {services} equal segments")
    length = total // services
    inner = np.arange(before, length - after + 1)
    return (np.arange(services)[:, None] * length + inner[None, :]).ravel()


def prepare_series(
    values: np.ndarray,
    name: str,
    context: np.ndarray | None = None,
    context_names: Sequence[str] = (),
    fractions: tuple[float, float, float] = (0.6, 0.2, 0.2),
    *,
    min_length: int = 200,
    max_gap: int = MAX_FILLED_GAP,
) -> PreparedSeries:
    """Validate -> split chronologically -> fit min-max on train -> scale and clip every part."""
    filled, notes = validate_series(values, name, min_length=min_length, max_gap=max_gap)
    parts = chronological_split(filled.size, fractions)
    scaler = MinMaxScaler.fit(filled[parts[0]], name=f"series '{name}'")
    train, val, test = (scaler.transform(filled[p]) for p in parts)
    notes += _clipping_notes(filled, parts, scaler)
    if context is None:
        if len(context_names):
            raise UnusableSeriesError(f"series '{name}': context names given without a context matrix")
        return PreparedSeries(name, train, val, test, None, None, None, scaler, (), tuple(notes))
    ctx, ctx_notes = validate_context(context, context_names, max_gap)
    if ctx.shape[0] != filled.size:
        raise UnusableSeriesError(f"series '{name}' has {filled.size} points but its context has {ctx.shape[0]} rows")
    scalers = tuple(
        MinMaxScaler.fit(ctx[parts[0], j], name=f"context channel '{c}' of '{name}'")
        for j, c in enumerate(context_names)
    )
    scaled = np.column_stack([s.transform(ctx[:, j]) for j, s in enumerate(scalers)])
    train_ctx, val_ctx, test_ctx = (scaled[p] for p in parts)
    return PreparedSeries(
        name,
        train,
        val,
        test,
        train_ctx,
        val_ctx,
        test_ctx,
        scaler,
        scalers,
        tuple(notes + ctx_notes),
        tuple(context_names),
    )


def _clipping_notes(values: np.ndarray, parts: tuple[slice, slice, slice], scaler: MinMaxScaler) -> list[str]:
    """Say how much of validation/test lies outside the training range (clipped to 0 or 1 by the protocol)."""
    notes = []
    for label, part in zip(("validation", "test"), parts[1:]):
        raw = values[part]
        outside = float(np.mean((raw < scaler.low) | (raw > scaler.high))) if raw.size else 0.0
        if outside > 0.01:
            notes.append(
                f"{outside:.0%} of the {label} part lies outside the training range "
                f"[{scaler.low:g}, {scaler.high:g}] and is clipped to [0, 1]"
            )
    return notes


def _acf(x: np.ndarray, lag: int) -> float:
    """Pearson correlation of ``x[:-lag]`` and ``x[lag:]``; NaN when too short or degenerate."""
    if lag < 1 or x.size <= lag + 2:
        return float("nan")
    a, b = x[:-lag] - x[:-lag].mean(), x[lag:] - x[lag:].mean()
    denom = float(np.sqrt((a * a).sum() * (b * b).sum()))
    return float((a * b).sum() / denom) if denom > 0 else float("nan")


def describe_series(values: np.ndarray, step_seconds: float) -> dict[str, float]:
    """Table-1 statistics of a raw series (NaNs dropped).

    ``pmr`` = max/mean, ``cv`` = population std/mean; ``mm_pmr``/``mm_cv`` are the same after
    min-max scaling of the whole series to ``[0, 1]``; ``acf_lag1``, ``acf_1h``, ``acf_1d`` are
    autocorrelations at 1 step, ``round(3600/step)`` and ``round(86400/step)`` steps (NaN when the
    series has at most lag+2 points or ``step_seconds`` is unknown).
    """
    x = np.asarray(values, dtype=np.float64).ravel()
    x = x[~np.isnan(x)]
    step_ok = bool(np.isfinite(step_seconds) and step_seconds > 0)
    nan = float("nan")
    stats = {"length": float(x.size), "duration_hours": x.size * step_seconds / 3600 if step_ok else nan}
    mean = float(x.mean()) if x.size else nan
    stats["pmr"] = float(x.max()) / mean if x.size and mean != 0 else nan
    stats["cv"] = float(x.std()) / mean if x.size and mean != 0 else nan
    span = float(x.max() - x.min()) if x.size else 0.0
    z = (x - x.min()) / span if span > 0 else None
    stats["mm_pmr"] = 1.0 / float(z.mean()) if z is not None else nan
    stats["mm_cv"] = float(z.std() / z.mean()) if z is not None else nan
    stats["acf_lag1"] = _acf(x, 1)
    stats["acf_1h"] = _acf(x, round(3600 / step_seconds)) if step_ok else nan
    stats["acf_1d"] = _acf(x, round(86400 / step_seconds)) if step_ok else nan
    return stats


def prepare_fleet(
    values: np.ndarray,
    name: str,
    fractions: tuple[float, float, float] = (0.6, 0.2, 0.2),
    *,
    min_length: int = 200,
    max_gap: int = MAX_FILLED_GAP,
) -> PreparedSeries:
    """A fleet of services on one time grid, ``values`` ``(T, services)``, as one :class:`PreparedSeries`:
    each service validated and split chronologically at the same ticks, one min-max scaler fitted on
    every service's training part (costs stay in one unit across the fleet), and each split the
    services' parts end to end (``services`` set)."""
    values = np.asarray(values, dtype=np.float64)
    if values.ndim != 2 or values.shape[1] < 1:
        raise UnusableSeriesError(f"fleet '{name}': values must have shape (ticks, services); got {values.shape}")
    filled: list[np.ndarray] = []
    notes: list[str] = []
    for j in range(values.shape[1]):
        column, column_notes = validate_series(values[:, j], f"{name}[{j}]", min_length=min_length, max_gap=max_gap)
        filled.append(column)
        notes.extend(f"service {j}: {note}" for note in column_notes)
    matrix = np.stack(filled)  # (services, T)
    parts = chronological_split(matrix.shape[1], fractions)
    scaler = MinMaxScaler.fit(matrix[:, parts[0]], name=f"fleet '{name}'")
    train, val, test = (scaler.transform(matrix[:, p]).ravel() for p in parts)
    return PreparedSeries(name, train, val, test, None, None, None, scaler, (), tuple(notes), services=matrix.shape[0])


def prepare_resource_fleet(
    values: Sequence[np.ndarray],
    resources: Sequence[Resource],
    name: str,
    fractions: tuple[float, float, float] = (0.6, 0.2, 0.2),
) -> PreparedSeries:
    """A fleet provisioned on several resources: ``values[r]`` is ``(T, N)``, resource ``r`` of the same N
    services on one time grid. Each resource is a :func:`prepare_fleet` (its own scaling); the splits hold
    the resources' blocks end to end (resource-major, ``services = R * N``), so every method trains one
    model over all of them and acts for every (resource, service) row at once."""
    resources = check_resources(resources)
    if len(values) != len(resources) or len({np.shape(v) for v in values}) != 1:
        raise UnusableSeriesError(
            f"fleet '{name}': {len(resources)} resources need as many value matrices of "
            f"one shape; got {[np.shape(v) for v in values]}"
        )
    parts = [prepare_fleet(v, f"{name}:{r.name}", fractions) for v, r in zip(values, resources)]

    def joined(split: str) -> np.ndarray:
        return np.concatenate([getattr(p, split) for p in parts])

    return PreparedSeries(
        name,
        joined("train"),
        joined("val"),
        joined("test"),
        None,
        None,
        None,
        parts[0].scaler,
        (),
        tuple(n for p in parts for n in p.notes),
        services=sum(p.services for p in parts),
        resources=resources,
    )


def development_series(series: PreparedSeries, fraction: float = 0.75) -> PreparedSeries:
    """The nested split on which design choices are made without the test split: the first ``fraction``
    of the training split trains, its rest validates (early stopping, calibration, knob selection) and
    the validation split plays the test split. The test split is dropped; the scaling stays the
    training split's, as in the paper."""
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"fraction must lie in (0, 1); got {fraction}")
    rows = series.by_service("train")
    cut = int(round(rows.shape[1] * fraction))

    def part(values: np.ndarray | None, lo: int | None, hi: int | None) -> np.ndarray | None:
        return None if values is None else values[lo:hi]

    return replace(
        series,
        name=f"{series.name} (development)",
        train=rows[:, :cut].ravel(),
        val=rows[:, cut:].ravel(),
        test=series.val,
        train_ctx=part(series.train_ctx, None, cut),
        val_ctx=part(series.train_ctx, cut, None),
        test_ctx=series.val_ctx,
    )
