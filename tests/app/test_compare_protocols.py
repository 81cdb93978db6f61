"""``picrl compare --protocol product|paper`` on a user's trace whose test part outgrows its training range."""

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
from picrl_core.methods.evaluation import growth_episode, run_growth_test_split, run_on_test_split

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


def test_the_paper_preset_reproduces_the_papers_protocol(
    growing: tuple[Path, np.ndarray], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path, values = growing
    results = _compare(path, tmp_path / "a", tmp_path / "cache", "--protocol", "paper")
    assert results["protocol"] == "paper" and not (tmp_path / "a" / "product.md").exists()
    assert results["datasets"]["growing:usage"]["protocol"] == "paper"
    trace = Trace("growing", values, None, (), 60.0, "", "test")
    series = runner.test_series(trace, QUICK)
    config = replace(QUICK.apply(PicRLConfig()), seed=0)
    for cell in results["cells"]:
        direct = run_on_test_split(REGISTRY[cell["method"]], series, config, 60.0).metrics.to_dict()
        assert {k: cell["metrics"][k] for k in direct} == pytest.approx(direct, rel=1e-12), cell["method"]
    capsys.readouterr()
    again = _compare(path, tmp_path / "b", tmp_path / "cache", "--protocol", "paper")  # the same cells, cached
    assert "2 cells (0 computed, 2 from the cache)" in capsys.readouterr().out
    assert [c["metrics"] for c in again["cells"]] == [c["metrics"] for c in results["cells"]]
    assert "(quick budget, paper protocol)" in (tmp_path / "b" / "recommendation.md").read_text()


def test_the_product_protocol_is_the_default_and_reports_native_metrics_first(
    growing: tuple[Path, np.ndarray], tmp_path: Path
) -> None:
    path, values = growing
    results = _compare(path, tmp_path / "out", tmp_path / "cache")  # no --protocol: the product's
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
    assert results["protocol"] == "product" and results["datasets"]["growing:usage"]["protocol"] == "product"
    table = (tmp_path / "out" / "product.md").read_text()
    assert "| Recent max + headroom |" in table
    assert table.index("regret (native)") < table.index("regret (training range)")  # native units first
    with (tmp_path / "out" / "product.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert {r["method"] for r in rows} == set(METHODS)
    assert "(quick budget, product protocol)" in (tmp_path / "out" / "recommendation.md").read_text()


def test_the_recommendation_ranks_by_the_validation_episode_of_the_runs_protocol() -> None:
    """Under the product protocol a cell's validation regret is its validation episode run unclipped in a range
    the worker's rules keep: on a trace whose validation part outgrows training, another number than the paper's
    clipped episode gives (its recommendation was word for word the paper's when both ran the clipped one)."""
    t = np.arange(600)
    values = 100.0 + 20.0 * np.sin(2 * np.pi * t / 48) + np.where(t >= 360, (t - 360) * 0.5, 0.0)
    trace = Trace("growing", values, None, (), 60.0, "", "test")
    series = runner.test_series(trace, QUICK)
    config = replace(QUICK.apply(PicRLConfig()), seed=0)
    method = REGISTRY["recent-max"]
    product = run_growth_test_split(
        method, series, native_test(trace, QUICK), runner.native_validation(trace), config, 60.0
    )
    paper = run_on_test_split(method, series, config, 60.0)
    provisioner = method.fitted(series, config, 60.0)
    validation = growth_episode(provisioner, series, runner.native_validation(trace), config, split="val")
    assert product.validation_regret == validation.metrics.regret
    assert paper.validation_regret is not None and product.validation_regret != paper.validation_regret


def test_the_figures_read_the_demand_each_protocol_scores(growing: tuple[Path, np.ndarray]) -> None:
    """Under the product protocol the trajectories and cumulative regret are drawn against the unclipped demand in
    units of the training range, the demand the cells' regret is scored on; under the paper's, its clipped split."""
    _, values = growing
    trace = Trace("growing", values, None, (), 60.0, "", "test")
    series = runner.test_series(trace, QUICK)
    growth = runner.scored_demand(trace, series, QUICK, "product")
    clipped = runner.scored_demand(trace, series, QUICK, "paper")
    low, high = values[:360].min(), values[:360].max()
    np.testing.assert_allclose(growth, (native_test(trace, QUICK)[:, 0] - low) / (high - low), rtol=1e-12)
    assert growth.shape == clipped.shape and growth.max() > 1.5 and clipped.max() <= 1.0
    np.testing.assert_allclose(np.clip(growth, 0.0, 1.0), clipped, atol=1e-6)
