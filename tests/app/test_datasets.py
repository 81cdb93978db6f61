"""Bundled datasets and user CSV loading (picrl.datasets)."""

from __future__ import annotations

import argparse
import gzip
from pathlib import Path

import numpy as np
import pytest

from picrl.commands.source import load_series
from picrl.datasets import (
    DATASETS,
    FLEETS,
    DatasetError,
    Trace,
    load_csv,
    load_dataset,
    load_pod_fleet,
    load_resource_csv,
)
from picrl_core.series import describe_series, prepare_series


@pytest.mark.parametrize(
    ("name", "length", "step", "context_names"),
    [
        ("dlrm", 44_640, 60.0, ()),
        ("genai-mem", 1_441, 57.0, ()),
        ("genai-ctx", 1_441, 57.0, ("duty_mean_pct", "n_pods_busy")),
    ],
)
def test_named_datasets_load_with_right_shape_and_step(
    name: str, length: int, step: float, context_names: tuple[str, ...]
) -> None:
    trace = load_dataset(name)
    assert trace.name == name
    assert trace.values.dtype == np.float64 and trace.values.shape == (length,)
    assert trace.step_seconds == step
    assert trace.context_names == context_names
    if context_names:
        assert trace.context is not None and trace.context.shape == (length, len(context_names))
    else:
        assert trace.context is None
    assert np.isfinite(trace.values).all()
    assert "alibaba/clusterdata" in trace.source
    prepare_series(trace.values, name, trace.context, trace.context_names)  # usable as is


def test_dataset_names_are_the_papers() -> None:
    assert list(DATASETS) == ["dlrm", "genai-mem", "genai-ctx"]


def test_genai_ctx_shares_genai_mem_values() -> None:
    np.testing.assert_array_equal(load_dataset("genai-ctx").values, load_dataset("genai-mem").values)


def test_dlrm_statistics_reproduce_the_readme_table() -> None:
    # README table: min-max PMR 2.83, CV 0.70 (paper Table 1: 2.99 / 0.69).
    trace = load_dataset("dlrm")
    stats = describe_series(trace.values, trace.step_seconds)
    assert stats["mm_pmr"] == pytest.approx(2.83, abs=0.02)
    assert stats["mm_cv"] == pytest.approx(0.70, abs=0.02)
    assert stats["duration_hours"] == pytest.approx(31 * 24)
    assert stats["acf_1d"] == pytest.approx(0.966, abs=0.005)


def test_genai_mem_statistics_reproduce_the_readme_table() -> None:
    trace = load_dataset("genai-mem")
    stats = describe_series(trace.values, trace.step_seconds)
    assert stats["pmr"] == pytest.approx(2.86, abs=0.02)
    assert stats["cv"] == pytest.approx(0.86, abs=0.02)
    assert np.isnan(stats["acf_1d"])  # shorter than a day


def test_unknown_dataset_lists_valid_names() -> None:
    with pytest.raises(DatasetError, match="unknown dataset 'genai'; valid names: dlrm, genai-mem, genai-ctx"):
        load_dataset("genai")


def test_trace_arrays_are_read_only() -> None:
    trace = load_dataset("genai-ctx")
    with pytest.raises(ValueError):
        trace.values[0] = 1.0
    with pytest.raises(ValueError):
        trace.context[0, 0] = 1.0  # type: ignore[index]


def test_pod_fleet_has_91_gap_free_pods() -> None:
    fleet = load_pod_fleet()
    assert len(fleet) == 91
    names = [t.name for t in fleet]
    assert names == sorted(names) and len(set(names)) == 91
    for trace in fleet:
        assert isinstance(trace, Trace)
        assert trace.values.shape == (1_441,) and np.isfinite(trace.values).all()
        assert trace.step_seconds == 57.0 and trace.unit == "bytes"
        if trace.context is not None:
            assert trace.context_names == ("duty_pct",) and np.isfinite(trace.context).all()
    with_duty = sum(t.context is not None for t in fleet)
    assert 0 < with_duty < 91


def test_pod_fleet_matches_raw_pivot_columns() -> None:
    fleet = {t.name: t for t in load_pod_fleet()}
    first = fleet["pod-00800b6d2cab"]
    assert first.values[0] == 21619802112.0  # first data cell of the bundled pivot file


# --- user CSV files ---------------------------------------------------------------------------


def write(path: Path, text: str) -> Path:
    if path.name.endswith(".gz"):
        with gzip.open(path, "wt") as handle:
            handle.write(text)
    else:
        path.write_text(text)
    return path


def test_csv_sorted_by_time_with_inferred_step(tmp_path: Path) -> None:
    path = write(tmp_path / "demand.csv", "t,load,temp\n120,3,30\n0,1,10\n60,2,\n180,4,40\n")
    trace = load_csv(path, "load", time_column="t", context_columns=("temp",))
    np.testing.assert_array_equal(trace.values, [1, 2, 3, 4])
    assert trace.context is not None
    np.testing.assert_array_equal(trace.context[:, 0], [10, np.nan, 30, 40])
    assert trace.step_seconds == 60.0 and trace.name == "demand:load"


def test_gzipped_csv_with_iso_times(tmp_path: Path) -> None:
    path = write(tmp_path / "d.csv.gz", "time,v\n2024-01-01T00:05:00,2\n2024-01-01T00:00:00,1\n2024-01-01T00:10:00,3\n")
    trace = load_csv(path, "v", time_column="time")
    np.testing.assert_array_equal(trace.values, [1, 2, 3])
    assert trace.step_seconds == 300.0


def test_csv_with_a_byte_order_mark_and_windows_line_ends(tmp_path: Path) -> None:
    path = tmp_path / "excel.csv"
    path.write_bytes(b"\xef\xbb\xbftime,v\r\n0,1\r\n60,2\r\n")
    trace = load_csv(path, "v", time_column="time")
    np.testing.assert_array_equal(trace.values, [1, 2])
    assert trace.step_seconds == 60.0


def test_a_negative_demand_reads_as_0_and_is_said_context_keeps_its_sign(tmp_path: Path) -> None:
    path = write(tmp_path / "x.csv", "v,w,temp\n1,2,-5\n-3,-1,-6\n-0.5,4,7\n")
    trace = load_csv(path, "v", context_columns=("temp",))
    np.testing.assert_array_equal(trace.values, [1, 0, 0])
    assert trace.context is not None and trace.context[:, 0].tolist() == [-5, -6, 7]
    assert trace.notes == (
        "read 2 values of 'v' below 0 as 0 (the lowest: -3): a demand cannot be negative, "
        "and a worker refuses negative usage",
    )
    pods = load_resource_csv(path, {"gpu_mem": "v", "gpu_compute": "w"})
    assert pods.values.tolist() == [[1, 2], [0, 0], [0, 4]] and len(pods.notes) == 2


@pytest.mark.parametrize(("unit", "per_second"), [("milliseconds", 10**3), ("nanoseconds", 10**9)])
def test_epoch_times_in_a_finer_unit_read_as_seconds_and_said(unit: str, per_second: int, tmp_path: Path) -> None:
    rows = "\n".join(f"{(1_764_000_000 + 60 * t) * per_second},{t}" for t in range(3))
    trace = load_csv(write(tmp_path / "x.csv", f"t,v\n{rows}\n"), "v", time_column="t")
    assert trace.step_seconds == 60.0
    assert trace.notes == (f"the time column read as epoch {unit} (as seconds it would run past the year 5000)",)


def test_csv_without_time_keeps_order_and_unknown_step(tmp_path: Path) -> None:
    trace = load_csv(write(tmp_path / "x.csv", "v\n3\n\n1\n2\n"), "v")
    np.testing.assert_array_equal(trace.values, [3, 1, 2])
    assert np.isnan(trace.step_seconds)


def test_csv_empty_cells_become_nan(tmp_path: Path) -> None:
    trace = load_csv(write(tmp_path / "x.csv", "a,b\n1,2\n,3\n4,5\n"), "a")
    assert np.isnan(trace.values[1]) and trace.values[2] == 4.0


def test_csv_outage_longer_than_the_filled_gap_is_left_out_and_said(tmp_path: Path) -> None:
    """A run of more than MAX_FILLED_GAP missing values in any column read (an outage) is left out; a shorter run
    stays for the series' interpolation; the notes say which rows went and where the file skips times."""
    rows = [f"{60 * t},{t},{'' if 3 <= t < 5 or 10 <= t < 16 else 1}" for t in range(20) if t not in (17, 18)]
    path = write(tmp_path / "x.csv", "t,load,ctx\n" + "\n".join(reversed(rows)) + "\n")
    trace = load_csv(path, "load", time_column="t", context_columns=("ctx",))
    np.testing.assert_array_equal(trace.values, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 16, 19])
    assert trace.context is not None and np.isnan(trace.context[3:5, 0]).all()  # 2 missing: filled later
    gap, outage = trace.notes
    assert gap.startswith("the time column has 1 gap longer than 1.5 steps of 60 s (the longest: 3 steps")
    assert outage.startswith("left out 6 rows: 1 run of more than 5 missing values (the longest: 6 in 'ctx'")
    unsorted = load_csv(path, "load", context_columns=("ctx",))  # in the file's order: the same rows go
    assert unsorted.notes[0].startswith("left out 6 rows") and unsorted.values.size == 12
    assert load_csv(path, "load", time_column="t").notes == (gap,)  # the context not read: nothing left out


def test_a_command_prints_what_reading_its_trace_left_out(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    values = ["" if 100 <= t < 130 else str(10 + t % 7) for t in range(400)]
    path = write(tmp_path / "x.csv", "t,v\n" + "\n".join(f"{60 * t},{v}" for t, v in enumerate(values)) + "\n")
    args = argparse.Namespace(dataset=None, trace=path, column="v", time_column="t", context_columns=())
    trace, series = load_series(args)
    assert trace.values.size == 370 and not np.isnan(series.train).any()
    assert capsys.readouterr().out.startswith("note: left out 30 rows: 1 run of more than 5 missing values")


def test_csv_missing_file_is_clear(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="CSV file not found: .*nope.csv"):
        load_csv(tmp_path / "nope.csv", "v")


def test_csv_missing_column_lists_available(tmp_path: Path) -> None:
    path = write(tmp_path / "x.csv", "time,cpu,mem\n0,1,2\n")
    with pytest.raises(DatasetError, match="no column 'gpu'; available columns: time, cpu, mem"):
        load_csv(path, "gpu")
    with pytest.raises(DatasetError, match="no column 'ctx'"):
        load_csv(path, "cpu", context_columns=("ctx",))


def test_csv_non_numeric_cell_names_line_and_value(tmp_path: Path) -> None:
    path = write(tmp_path / "x.csv", "v\n1\n2\nabc\n")
    with pytest.raises(DatasetError, match=r"line 4 \(data row 3\): value 'abc' in column 'v' is not a number"):
        load_csv(path, "v")


def test_csv_duplicate_timestamps_rejected(tmp_path: Path) -> None:
    path = write(tmp_path / "x.csv", "t,v\n0,1\n60,2\n60,3\n")
    with pytest.raises(DatasetError, match="duplicate timestamps \\(first: 60\\)"):
        load_csv(path, "v", time_column="t")


def test_csv_bad_time_and_ragged_rows_rejected(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="time 'noon' .* ISO 8601"):
        load_csv(write(tmp_path / "a.csv", "t,v\n0,1\nnoon,2\n"), "v", time_column="t")
    with pytest.raises(DatasetError, match="line 3: 1 fields but the header has 2"):
        load_csv(write(tmp_path / "b.csv", "t,v\n0,1\n5\n"), "v")
    with pytest.raises(DatasetError, match="empty"):
        load_csv(write(tmp_path / "c.csv", ""), "v")


@pytest.mark.parametrize("name, kills", [("pods-2r-oom", True), ("load-2r", False), ("load-2r-oom", True)])
def test_two_resource_fleets_say_what_a_memory_shortage_does(name: str, kills: bool) -> None:
    from picrl.datasets import prepare_trace

    trace = load_dataset(name)
    series = prepare_trace(trace)
    assert trace.resources == ("gpu_mem", "gpu_compute") and name in FLEETS
    assert [(r.name, r.hard, r.kills) for r in series.resources] == [
        ("gpu_mem", True, kills),
        ("gpu_compute", False, False),
    ]
    assert series.services == trace.values.shape[1]
    with pytest.raises(DatasetError, match="oom_kills needs several resources"):
        Trace(
            name="one",
            values=trace.values[:, 0],
            context=None,
            context_names=(),
            step_seconds=60.0,
            unit="",
            source="",
            oom_kills=True,
        )
