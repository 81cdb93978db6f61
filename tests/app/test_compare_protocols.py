"""``picrl compare --protocol clipped|growth`` on a user's trace whose test part outgrows its training range."""

from __future__ import annotations

import csv
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from picrl.cli import main
from picrl.comparison import runner
from picrl.comparison.runner import QUICK, native_test
from picrl.datasets import Trace
from picrl_core.config import PicRLConfig
from picrl_core.methods import REGISTRY
from picrl_core.methods.evaluation import run_on_test_split

METHODS = ("vpa", "recent-max")


@pytest.fixture(scope="module")
def growing(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, np.ndarray]:
    """A daily wave (period 48 ticks) whose level doubles over the test part: its test lies above training."""
    t = np.arange(600)
    values = 100.0 + 20.0 * np.sin(2 * np.pi * t / 48) + np.where(t >= 480, (t - 480) * 1.0, 0.0)
    path = tmp_path_factory.mktemp("trace") / "growing.csv"
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["time", "usage"])
        writer.writerows([60 * i, v] for i, v in enumerate(values))
    return path, values


def _compare(path: Path, out: Path, cache: Path, *protocol: str) -> dict:
    args = ["compare", "--trace", str(path), "--column", "usage", "--time-column", "time", "--quick"]
    assert main([*args, "--jobs", "1", "--methods", *METHODS, "--out", str(out), "--cache", str(cache), *protocol]) == 0
    return json.loads((out / "results.json").read_text())


def test_the_clipped_preset_is_the_default_and_reproduces_the_papers_protocol(
    growing: tuple[Path, np.ndarray], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path, values = growing
    results = _compare(path, tmp_path / "a", tmp_path / "cache", "--protocol", "clipped")
    assert results["protocol"] == "clipped" and not (tmp_path / "a" / "growth.md").exists()
    trace = Trace("growing", values, None, (), 60.0, "", "test")
    series = runner.test_series(trace, QUICK)
    config = replace(QUICK.apply(PicRLConfig()), seed=0)
    for cell in results["cells"]:
        direct = run_on_test_split(REGISTRY[cell["method"]], series, config, 60.0).metrics.to_dict()
        assert {k: cell["metrics"][k] for k in direct} == pytest.approx(direct, rel=1e-12), cell["method"]
    capsys.readouterr()
    again = _compare(path, tmp_path / "b", tmp_path / "cache")  # no --protocol: the same cells, from the cache
    assert "2 cells (0 computed, 2 from the cache)" in capsys.readouterr().out
    assert again["protocol"] == "clipped" and [c["metrics"] for c in again["cells"]] == [
        c["metrics"] for c in results["cells"]
    ]


def test_the_growth_protocol_reports_native_and_growth_metrics(
    growing: tuple[Path, np.ndarray], tmp_path: Path
) -> None:
    path, values = growing
    results = _compare(path, tmp_path / "out", tmp_path / "cache", "--protocol", "growth")
    trace = Trace("growing", values, None, (), 60.0, "", "test")
    native = native_test(trace, QUICK)[:, 0]
    peak = values[:360].max()
    assert native.max() > 1.5 * peak  # the test outgrows the training range
    for cell in results["cells"]:
        m = cell["metrics"]
        assert m["ticks_above_peak"] == float((native > peak).sum()) and m["shortfall_above_peak"] > 0
        assert m["catch_up_ticks"] >= 0 and m["over_cost_native"] > 0
        span = peak - values[:360].min()
        assert m["regret_native"] == pytest.approx(m["regret"] * span, rel=1e-9)  # the same episode in two units
    assert "| Recent max + headroom |" in (tmp_path / "out" / "growth.md").read_text()
    with (tmp_path / "out" / "growth.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert {r["method"] for r in rows} == set(METHODS)


def test_the_figures_read_the_demand_each_protocol_scores(growing: tuple[Path, np.ndarray]) -> None:
    """Under growth the trajectories and cumulative regret are drawn against the unclipped demand in units of the
    training range, the demand the cells' regret is scored on; clipped, against the paper's clipped split."""
    _, values = growing
    trace = Trace("growing", values, None, (), 60.0, "", "test")
    series = runner.test_series(trace, QUICK)
    growth = runner.scored_demand(trace, series, QUICK, "growth")
    clipped = runner.scored_demand(trace, series, QUICK, "clipped")
    low, high = values[:360].min(), values[:360].max()
    np.testing.assert_allclose(growth, (native_test(trace, QUICK)[:, 0] - low) / (high - low), rtol=1e-12)
    assert growth.shape == clipped.shape and growth.max() > 1.5 and clipped.max() <= 1.0
    np.testing.assert_allclose(np.clip(growth, 0.0, 1.0), clipped, atol=1e-6)
