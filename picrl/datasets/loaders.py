"""Reading demand traces from CSV files (plain or gzipped) into :class:`Trace` objects.

Standard library ``csv``/``gzip`` plus numpy only. The bundled Alibaba files live in ``files/``
next to this module; their origin and derivation are described in ``files/README.md``.
"""

from __future__ import annotations

import csv
import gzip
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from picrl_core.series import MAX_FILLED_GAP, missing_runs, plural

if TYPE_CHECKING:
    from picrl_core.resources import Resource
    from picrl_core.series import PreparedSeries

FILES = Path(__file__).resolve().parent / "files"
_CLUSTERDATA = "alibaba/clusterdata@7a6c496e4f4b6ce6150be8f881cb051bf2abff42"


class DatasetError(ValueError):
    """A trace file or dataset request that cannot be read as asked."""


@dataclass(frozen=True, eq=False)
class Trace:
    """One demand series in native units, optionally with aligned context channels, or a fleet of
    services on one time grid.

    ``values`` is ``(T,)`` float64, or ``(T, N)`` for a fleet of N services (without context), or
    ``(T, R * N)`` for a fleet provisioned on the ``resources`` named (one block of N columns each);
    ``context`` is ``(T, C)`` float64 or ``None``;
    ``step_seconds`` is NaN when the file has no time column. Arrays are read-only.
    """

    name: str
    values: np.ndarray
    context: np.ndarray | None
    context_names: tuple[str, ...]
    step_seconds: float
    unit: str
    source: str
    resources: tuple[str, ...] = ()
    oom_kills: bool = False  # a hard resource's shortage kills the pod (picrl_core.resources.Resource.kills)
    notes: tuple[str, ...] = ()  # what reading the file left out or joined (:func:`load_csv`)

    def feed(self, update: Callable[[bytes], object]) -> None:
        """Feed what a run on the trace depends on to a digest's ``update``: the values, the context and the tick
        length (the windows of the methods timed in seconds), for the caches of cells and models."""
        update(np.ascontiguousarray(self.values).tobytes())
        if self.context is not None:
            update(np.ascontiguousarray(self.context).tobytes())
        update(repr(self.step_seconds).encode())

    def __post_init__(self) -> None:
        if self.oom_kills and not self.resources:
            raise DatasetError(f"trace '{self.name}': oom_kills needs several resources (a hard one to kill the pod)")
        values = _frozen_copy(self.values)
        if values.ndim != 1 and not (values.ndim == 2 and self.context is None):
            raise DatasetError(
                f"trace '{self.name}': values must be 1-D (or 2-D for a fleet without context), "
                f"got shape {values.shape}"
            )
        object.__setattr__(self, "values", values)
        if self.context is None:
            if self.context_names:
                raise DatasetError(f"trace '{self.name}': context names given without context")
            return
        context = _frozen_copy(self.context)
        if context.shape != (values.size, len(self.context_names)):
            raise DatasetError(
                f"trace '{self.name}': context shape {context.shape} does not match "
                f"{values.size} values and {len(self.context_names)} channel names"
            )
        object.__setattr__(self, "context", context)


def _frozen_copy(array: np.ndarray) -> np.ndarray:
    out = np.array(array, dtype=np.float64)
    out.setflags(write=False)
    return out


DATASETS: dict[str, str] = {
    "dlrm": "Alibaba DLRM inference (Prism, NSDI'25): GPUs requested by live GPU-node instances, 31 days at 60 s",
    "genai-mem": "Alibaba GenAI Stable-Diffusion serving: GPU memory of busy pods (duty > 0), bytes, 22.8 h at 57 s",
    "genai-ctx": "genai-mem plus context channels duty_mean_pct (mean GPU duty cycle, %) and "
    "n_pods_busy (pods with duty > 0)",
}

# Fleets: many services on one time grid, one service per column (``picrl compare`` runs them together).
FLEETS: dict[str, str] = {
    "pods": "Alibaba GenAI Stable-Diffusion serving: GPU memory of each of the 91 pods reporting at every "
    "stamp, one service per pod, bytes, 22.8 h at 57 s",
    "pods-2r": "the 72 of those pods whose GPU duty cycle is complete, each provisioned on two resources at once: "
    "GPU memory (bytes; hard: a shortage fails requests) and GPU compute (duty cycle, %; soft)",
    "pods-2r-oom": "pods-2r where a GPU memory shortage kills the pod (an OOM kill: none of that tick's load is "
    "served, so its compute is unobserved) instead of failing the requests that do not fit",
    "load-2r": "24 synthetic pods whose GPU memory and GPU compute follow one load (a daily wave with surges; "
    "picrl_core.synthetic.shared_load_pods), 1,440 ticks: memory runs short exactly when compute is busy",
    "load-2r-oom": "load-2r where a GPU memory shortage kills the pod",
}
SYNTHETIC_SEED = 2026  # of load-2r: drawn once, used for no choice of the method

# name -> (file, value column, context columns, unit, upstream source)
_SPECS: dict[str, tuple[str, str, tuple[str, ...], str, str]] = {
    "dlrm": (
        "dlrm_gpu_demand_60s.csv.gz",
        "gpus_active",
        (),
        "GPUs",
        f"{_CLUSTERDATA}:cluster-trace-gpu-v2025/disaggregated_DLRM_trace.csv",
    ),
    "genai-mem": (
        "genai_series_57s.csv.gz",
        "gpu_mem_busy_pods_sum_bytes",
        (),
        "bytes",
        f"{_CLUSTERDATA}:cluster-trace-v2026-GenAI/pod_gpu_memory_used_bytes_anon.tar.gz",
    ),
    "genai-ctx": (
        "genai_series_57s.csv.gz",
        "gpu_mem_busy_pods_sum_bytes",
        ("duty_mean_pct", "n_pods_busy"),
        "bytes",
        f"{_CLUSTERDATA}:cluster-trace-v2026-GenAI/pod_gpu_memory_used_bytes_anon.tar.gz "
        "+ pod_gpu_duty_cycle_anon.tar.gz",
    ),
}


def _read_rows(path: Path) -> tuple[list[str], list[list[str]]]:
    """Header and data rows of a CSV (gzipped when the name ends in ``.gz``); blank lines skipped."""
    if not path.is_file():
        raise FileNotFoundError(f"CSV file not found: {path}")
    opener = gzip.open if path.name.endswith(".gz") else open
    try:
        with opener(path, "rt", newline="", encoding="utf-8-sig") as handle:  # a BOM (Excel) is no header text
            rows = [row for row in csv.reader(handle) if row]
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise DatasetError(f"{path}: cannot be read as a CSV file ({exc})") from exc
    if not rows:
        raise DatasetError(f"{path}: the file is empty (no header row)")
    header = [h.strip() for h in rows[0]]
    for number, row in enumerate(rows[1:], start=2):
        if len(row) != len(header):
            raise DatasetError(f"{path}, line {number}: {len(row)} fields but the header has {len(header)}")
    return header, rows[1:]


def _column_index(path: Path, header: list[str], column: str) -> int:
    if column not in header:
        raise DatasetError(f"{path}: no column '{column}'; available columns: {', '.join(header)}")
    if header.count(column) > 1:
        raise DatasetError(f"{path}: column '{column}' appears more than once in the header")
    return header.index(column)


def _numbers(path: Path, rows: list[list[str]], index: int, column: str) -> np.ndarray:
    """Column ``index`` as float64; an empty cell is NaN, anything else non-numeric is an error."""
    out = np.empty(len(rows))
    for i, row in enumerate(rows):
        cell = row[index].strip()
        try:
            out[i] = float(cell) if cell else np.nan
        except ValueError:
            raise DatasetError(
                f"{path}, line {i + 2} (data row {i + 1}): value {cell!r} in column '{column}' is not a number"
            ) from None
    return out


def _timestamps(path: Path, rows: list[list[str]], index: int, column: str) -> np.ndarray:
    """Time column as seconds: numbers are taken as seconds, otherwise ISO 8601 date-times."""
    out = np.empty(len(rows))
    for i, row in enumerate(rows):
        cell = row[index].strip()
        try:
            out[i] = float(cell)
        except ValueError:
            try:
                out[i] = datetime.fromisoformat(cell).timestamp()
            except ValueError:
                raise DatasetError(
                    f"{path}, line {i + 2} (data row {i + 1}): time {cell!r} in column '{column}' is "
                    "neither a number of seconds nor an ISO 8601 date-time"
                ) from None
    if not np.isfinite(out).all():
        raise DatasetError(f"{path}: time column '{column}' holds a non-finite value")
    return out


_EPOCH_UNITS = (("milliseconds", 1e3), ("microseconds", 1e6), ("nanoseconds", 1e9))
_LATEST_SECONDS = 1e11  # year 5138 as epoch seconds; epoch milliseconds passed it in 1973


def _in_seconds(times: np.ndarray) -> tuple[np.ndarray, list[str]]:
    """``times`` in seconds: numbers too large to be seconds are epoch milliseconds, microseconds or nanoseconds
    (exporters write all three), read as the first unit that brings them below ``_LATEST_SECONDS``; and a note
    naming that unit (none when the numbers were seconds)."""
    latest = float(np.max(np.abs(times)))
    if latest < _LATEST_SECONDS:
        return times, []
    for unit, per_second in _EPOCH_UNITS:
        if latest / per_second < _LATEST_SECONDS:
            return times / per_second, [
                f"the time column read as epoch {unit} (as seconds it would run past the year 5000)"
            ]
    return times, []


def _step_from_times(path: Path, times: np.ndarray, column: str) -> float:
    """Median spacing of sorted ``times``; duplicates and a single row are errors."""
    if times.size < 2:
        raise DatasetError(f"{path}: at least two rows are needed to infer the step from '{column}'")
    diffs = np.diff(times)
    duplicate = np.flatnonzero(diffs == 0)
    if duplicate.size:
        raise DatasetError(f"{path}: time column '{column}' has duplicate timestamps (first: {times[duplicate[0]]:g})")
    return float(np.median(diffs))


def _stem(path: Path) -> str:
    name = path.name
    for suffix in (".gz", ".csv"):
        name = name.removesuffix(suffix)
    return name


def load_csv(
    path: str | Path, column: str, time_column: str | None = None, context_columns: Sequence[str] = ()
) -> Trace:
    """Read ``column`` (and optional context columns) of a user CSV into a :class:`Trace`.

    Empty cells become NaN: a run of at most ``MAX_FILLED_GAP`` of them is filled later
    (``picrl_core.series.validate_series``), and the rows of a longer run in any column read are left out, a
    telemetry outage that nothing could fill honestly (:func:`_outages`). With ``time_column`` the rows are
    sorted by time, ``step_seconds`` is the median spacing and the times the file skips are noted
    (:func:`_skipped_times`); without it ``step_seconds`` is NaN. Either way the rows around a gap follow each
    other as consecutive ticks, as a worker's next event follows the last one it saw; ``notes`` says so.
    """
    path = Path(path)
    header, rows = _read_rows(path)
    names = (column, *context_columns)
    columns = np.column_stack([_numbers(path, rows, _column_index(path, header, c), c) for c in names])
    lines = np.arange(len(rows)) + 2  # the file's line of each row (the header is line 1)
    step = float("nan")
    notes: list[str] = []
    if time_column is not None:
        times, unit = _in_seconds(_timestamps(path, rows, _column_index(path, header, time_column), time_column))
        notes += unit
        order = np.argsort(times, kind="stable")
        columns, lines, times = columns[order], lines[order], times[order]
        step = _step_from_times(path, times, time_column)
        notes += _skipped_times(times, step, lines)
    kept, left_out = _outages(columns, names, lines)
    values, negative = _no_negative_demand(columns[kept, 0], column)
    return Trace(
        name=f"{_stem(path)}:{column}",
        values=values,
        context=columns[kept, 1:] if context_columns else None,
        context_names=tuple(context_columns),
        step_seconds=step,
        unit="",
        source=str(path),
        notes=tuple(notes + left_out + negative),
    )


def _no_negative_demand(values: np.ndarray, column: str) -> tuple[np.ndarray, list[str]]:
    """``values`` with a demand below 0 read as 0, as capacity cannot be negative and a worker refuses such usage
    (``negative_usage``); and a note saying how many there were (none when none)."""
    below = values < 0
    if not below.any():
        return values, []
    return np.where(below, 0.0, values), [
        f"read {plural(int(below.sum()), 'value')} of '{column}' below 0 as 0 (the lowest: {values.min():g}): a "
        "demand cannot be negative, and a worker refuses negative usage"
    ]


def _outages(columns: np.ndarray, names: Sequence[str], lines: np.ndarray) -> tuple[np.ndarray, list[str]]:
    """The rows to keep (``(T,)`` bool): all but those in a run of more than ``MAX_FILLED_GAP`` missing values of
    any column; and a note on what was left out (none when nothing was)."""
    cut = np.zeros(len(columns), dtype=bool)
    runs = []
    for j, name in enumerate(names):
        for start, stop in missing_runs(np.isnan(columns[:, j])):
            if stop - start > MAX_FILLED_GAP:
                cut[start:stop] = True
                runs.append((stop - start, start, name))
    if not runs:
        return ~cut, []
    length, start, name = max(runs, key=lambda run: (run[0], -run[1]))  # the longest, the first of those
    return ~cut, [
        f"left out {plural(int(cut.sum()), 'row')}: {plural(len(runs), 'run')} of more than {MAX_FILLED_GAP} "
        f"missing values (the longest: {length} in '{name}' from line {lines[start]}); the rows on either side "
        "follow each other as consecutive ticks"
    ]


def _skipped_times(times: np.ndarray, step: float, lines: np.ndarray) -> list[str]:
    """A note on the spacings of sorted ``times`` longer than 1.5 steps (rows missing from the file), if any."""
    spacing = np.diff(times)
    skips = np.flatnonzero(spacing > 1.5 * step)
    if not skips.size:
        return []
    longest = skips[np.argmax(spacing[skips])]
    return [
        f"the time column has {plural(skips.size, 'gap')} longer than 1.5 steps of {step:g} s (the longest: "
        f"{spacing[longest] / step:.0f} steps, after line {lines[longest]}); the rows on either side follow each "
        "other as consecutive ticks"
    ]


def load_resource_csv(
    path: str | Path, columns: dict[str, str], time_column: str | None = None, oom_kills: bool = False
) -> Trace:
    """One service provisioned on several resources from a user CSV: ``columns`` maps each resource name (one
    ``picrl_core.resources.KNOWN`` defines) to its demand column, read as :func:`load_csv` reads one; the trace
    is a fleet of one service, ``(T, R)`` resource-major like ``pods-2r``."""
    from picrl_core.resources import KNOWN

    unknown = [name for name in columns if name not in KNOWN]
    if unknown or len(columns) < 2:
        raise DatasetError(
            f"--resources needs at least two of {', '.join(sorted(KNOWN))} as NAME=COLUMN; got "
            f"{', '.join(columns) or 'none'}"
        )
    names, heads = list(columns), list(columns.values())
    read = load_csv(path, heads[0], time_column=time_column, context_columns=heads[1:])
    assert read.context is not None  # context_columns given
    demands = [(read.values, [])] + [_no_negative_demand(read.context[:, j], h) for j, h in enumerate(heads[1:])]
    values = np.column_stack([column for column, _ in demands])
    return Trace(
        name=f"{_stem(Path(path))}:{'+'.join(heads)}{'-oom' if oom_kills else ''}",
        values=values,
        context=None,
        context_names=(),
        step_seconds=read.step_seconds,
        unit="",
        source=str(path),
        resources=tuple(names),
        oom_kills=oom_kills,
        notes=read.notes + tuple(note for _, notes in demands for note in notes),
    )


def prepare_trace(trace: Trace) -> PreparedSeries:
    """The trace split and scaled as in the paper: a series (:func:`~picrl_core.series.prepare_series`), a fleet
    (:func:`~picrl_core.series.prepare_fleet`) or a fleet provisioned on several resources
    (:func:`~picrl_core.series.prepare_resource_fleet`)."""
    from picrl_core.series import prepare_fleet, prepare_resource_fleet, prepare_series

    if trace.resources:
        return prepare_resource_fleet(
            np.split(trace.values, len(trace.resources), axis=1), trace_resources(trace), trace.name
        )
    if trace.values.ndim == 2:
        return prepare_fleet(trace.values, trace.name)
    return prepare_series(trace.values, trace.name, trace.context, trace.context_names)


def trace_resources(trace: Trace) -> tuple[Resource, ...]:
    """The resources a multi-resource trace is provisioned on (``picrl_core.resources.KNOWN`` by name; with
    ``oom_kills``, a hard resource's shortage kills the pod)."""
    from picrl_core.resources import resources_named

    return resources_named(trace.resources, trace.oom_kills)


def load_dataset(name: str) -> Trace:
    """One of the bundled datasets listed in :data:`DATASETS` or :data:`FLEETS`, in native units."""
    if name == "pods":
        pods = load_pod_fleet()
        return Trace(
            name="pods",
            values=np.column_stack([p.values for p in pods]),
            context=None,
            context_names=(),
            step_seconds=pods[0].step_seconds,
            unit="bytes",
            source=pods[0].source,
        )
    if name in ("pods-2r", "pods-2r-oom"):
        pods = [p for p in load_pod_fleet() if p.context is not None]
        values = np.column_stack([p.values for p in pods] + [p.context[:, 0] for p in pods])
        return Trace(
            name=name,
            values=values,
            context=None,
            context_names=(),
            step_seconds=pods[0].step_seconds,
            unit="bytes | duty %",
            source=f"{pods[0].source} + pod_gpu_duty_cycle_anon.tar.gz",
            resources=("gpu_mem", "gpu_compute"),
            oom_kills=name == "pods-2r-oom",
        )
    if name in ("load-2r", "load-2r-oom"):
        from picrl_core.synthetic import shared_load_pods

        memory, compute = shared_load_pods(1440, seed=SYNTHETIC_SEED)
        return Trace(
            name=name,
            values=np.column_stack([memory, compute]),
            context=None,
            context_names=(),
            step_seconds=60.0,
            unit="share of a GPU",
            source="picrl_core.synthetic.shared_load_pods",
            resources=("gpu_mem", "gpu_compute"),
            oom_kills=name == "load-2r-oom",
        )
    if name not in _SPECS:
        raise DatasetError(f"unknown dataset '{name}'; valid names: {', '.join([*DATASETS, *FLEETS])}")
    file, column, context_columns, unit, source = _SPECS[name]
    trace = load_csv(FILES / file, column, time_column="t_sec", context_columns=context_columns)
    return replace(trace, name=name, unit=unit, source=source)


def load_pod_fleet() -> list[Trace]:
    """Per-pod GPU memory (bytes, 57 s) of the 91 GenAI pods that report at every stamp.

    Each pod's duty cycle (%) is its context channel ``duty_pct`` when the duty file has that pod
    without gaps; otherwise ``context`` is ``None``. Sorted by pod id (first 12 hex digits of the
    anonymised container IP).
    """
    mem_path = FILES / "genai_gpu_mem_bytes_by_pod_57s.csv.gz"
    duty_path = FILES / "genai_duty_pct_by_pod_57s.csv.gz"
    mem_header, mem_rows = _read_rows(mem_path)
    duty_header, duty_rows = _read_rows(duty_path)
    time_column = "timestamp_anon"
    mem_times = _numbers(mem_path, mem_rows, _column_index(mem_path, mem_header, time_column), time_column)
    duty_times = _numbers(duty_path, duty_rows, _column_index(duty_path, duty_header, time_column), time_column)
    if not np.array_equal(mem_times, duty_times):
        raise DatasetError(f"{mem_path.name} and {duty_path.name} are not on the same time grid")
    step = _step_from_times(mem_path, mem_times, time_column)
    source = f"{_CLUSTERDATA}:cluster-trace-v2026-GenAI/pod_gpu_memory_used_bytes_anon.tar.gz"
    fleet = []
    for pod in sorted(set(mem_header) - {time_column, "step"}):
        memory = _numbers(mem_path, mem_rows, _column_index(mem_path, mem_header, pod), pod)
        if np.isnan(memory).any():
            continue
        context = None
        if pod in duty_header:
            duty = _numbers(duty_path, duty_rows, _column_index(duty_path, duty_header, pod), pod)
            context = None if np.isnan(duty).any() else duty[:, None]
        fleet.append(
            Trace(
                name=f"pod-{pod}",
                values=memory,
                context=context,
                context_names=("duty_pct",) if context is not None else (),
                step_seconds=step,
                unit="bytes",
                source=source,
            )
        )
    return fleet
