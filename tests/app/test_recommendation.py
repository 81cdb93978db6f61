"""The recommendation that ends ``picrl compare``: lowest validation regret (a tie to the simpler method), never
test, references excluded, and the note on the other budget."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest

from picrl.cli import main
from picrl.comparison.recommendation import candidates, markdown_recommendation, recommend
from picrl.comparison.runner import FULL, QUICK
from picrl.comparison.tables import METRICS, Summary
from picrl_core.methods import REGISTRY


def summary(method: str, val: float, test: float, std: float = 0.0, n: int = 1) -> Summary:
    mean = {"mae": 0.1, "regret": test, "shortage_rate": 0.3, "val_regret": val}
    return Summary(method, "d", mean, {m: std if m == "val_regret" else 0.0 for m in METRICS}, n, 0)


def test_the_recommendation_reads_validation_regret_only_and_skips_every_reference() -> None:
    summaries = {
        ("pic-rl", "d"): summary("pic-rl", val=5.0, test=9.0),
        ("recent-max", "d"): summary("recent-max", val=6.0, test=1.0),  # lowest test regret: must not matter
        ("spo", "d"): summary("spo", val=4.0, test=2.0),  # compare only: no worker runs it
        ("pic-rl-fi", "d"): summary("pic-rl-fi", val=1.0, test=1.0),  # full information
        ("oracle", "d"): summary("oracle", val=0.5, test=0.5),  # reads the test split
        ("a1", "d"): summary("a1", val=0.1, test=0.1),  # an ablation
    }
    methods = list(m for m, _ in summaries)
    assert candidates(methods) == ["pic-rl", "recent-max"]
    rec = recommend(summaries, methods, "d")
    assert rec is not None and (rec.method, rec.runner_up, rec.regret, rec.runner_up_regret) == (
        "pic-rl",
        "recent-max",
        5.0,
        6.0,
    )
    text = markdown_recommendation({"d": rec}, {}, QUICK, FULL, {"d": "product"})
    assert (
        "**PIC-RL (Ours) (`pic-rl`)**" in text
        and "1.00 below the next, Recent max + headroom (6.00, 16.7% lower)" in text
    )
    assert text.startswith("Recommendation (quick budget, product protocol)")
    assert "full budget's winner is unknown" in text and "without --quick" in text
    # a validation regret left NaN (a cell that has none) is no candidate; none left: no recommendation
    nan = {k: summary(k[0], val=float("nan"), test=1.0) for k in summaries}
    assert recommend(nan, methods, "d") is None
    assert "no method has a validation regret" in markdown_recommendation({"d": None}, {}, FULL, QUICK, {"d": "paper"})


def test_the_note_says_when_the_budgets_disagree_and_when_a_margin_is_within_the_seed_spread() -> None:
    full = {("pic-rl", "d"): summary("pic-rl", 5.0, 1.0, std=2.0, n=5), ("tft", "d"): summary("tft", 5.5, 1.0)}
    quick = {("pic-rl", "d"): summary("pic-rl", 6.0, 1.0), ("recent-max", "d"): summary("recent-max", 4.0, 1.0)}
    this, other = recommend(full, ["pic-rl", "tft"], "d"), recommend(quick, ["pic-rl", "recent-max"], "d")
    text = markdown_recommendation({"d": this}, {"d": other}, FULL, QUICK, {"d": "paper"})
    assert "The budgets disagree: the quick budget" in text and "names Recent max + headroom (`recent-max`" in text
    assert "prefer its answer, `pic-rl`" in text and "treat the two as tied" in text
    agree = markdown_recommendation({"d": this}, {"d": this}, FULL, QUICK, {"d": "paper"})
    assert "The quick budget agrees" in agree and "disagree" not in agree


def test_a_tie_goes_to_the_simpler_method_and_a_clear_win_to_the_portfolio() -> None:
    methods = ["pic-rl", "portfolio", "conformal"]
    tied = {
        ("pic-rl", "d"): summary("pic-rl", 10.0, 1.0),
        ("portfolio", "d"): summary("portfolio", 9.96, 1.0),  # 0.4% lower: within the tie
        ("conformal", "d"): summary("conformal", 12.0, 1.0),
    }
    rec = recommend(tied, methods, "d")
    assert rec is not None and (rec.method, rec.runner_up, rec.runner_up_regret) == ("pic-rl", "portfolio", 9.96)
    text = markdown_recommendation({"d": rec}, {}, FULL, QUICK, {"d": "product"})
    assert "tied with Portfolio" in text and "the simpler method is named" in text
    exact = tied | {("portfolio", "d"): summary("portfolio", 10.0, 1.0)}
    text = markdown_recommendation({"d": recommend(exact, methods, "d")}, {}, FULL, QUICK, {"d": "product"})
    assert "**PIC-RL (Ours) (`pic-rl`)**" in text and "tied with Portfolio" in text
    clear = tied | {("portfolio", "d"): summary("portfolio", 9.9, 1.0)}  # 1% lower: the portfolio
    rec = recommend(clear, methods, "d")
    assert rec is not None and (rec.method, rec.runner_up) == ("portfolio", "pic-rl")


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A daily wave sampled every 5 minutes for 30 days, with noise."""
    t = np.arange(30 * 288)
    usage = 50 + 20 * np.sin(2 * np.pi * t / 288) + np.random.default_rng(3).normal(0, 2, t.size)
    path = tmp_path_factory.mktemp("trace") / "wave.csv"
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["time", "usage"])
        writer.writerows(zip(300 * t, usage))
    return path


def test_compare_ends_with_a_recommendation_and_reads_the_other_budget_from_the_cache(
    trace: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    common = ["compare", "--trace", str(trace), "--column", "usage", "--time-column", "time", "--jobs", "1"]
    methods = ["recent-max", "sgd", "kaplan-meier", "vpa", "tobit"]
    common += ["--methods", *methods, "oracle", "--cache", str(tmp_path / "cache")]
    assert main([*common, "--quick", "--out", str(tmp_path / "quick")]) == 0
    quick = capsys.readouterr().out
    results = json.loads((tmp_path / "quick" / "results.json").read_text())
    cells = {c["method"]: c["metrics"] for c in results["cells"]}
    assert "oracle" not in cells  # the product protocol (the default) leaves the hindsight references out
    assert all(cells[m]["val_regret"] > 0 for m in ("sgd", "vpa"))
    [(dataset, rec)] = results["recommendation"].items()
    best = min((m for m in methods if REGISTRY[m].deployable), key=lambda m: cells[m]["val_regret"])
    assert rec["method"] == best and rec["regret"] == pytest.approx(cells[best]["val_regret"])
    assert quick.rstrip().endswith("may differ; run `picrl compare` without --quick and the same options to check.")
    with (tmp_path / "quick" / "table2.csv").open() as handle:
        rows = {r["method"]: r for r in csv.DictReader(handle)}
    assert float(rows[best]["val_regret_mean"]) == pytest.approx(rec["regret"], rel=1e-5)
    table2 = (tmp_path / "quick" / "table2.md").read_text()
    assert "| Tobit newsvendor (compare only) |" in table2 and "| Recent max + headroom |" in table2
    # the full budget finds the quick one's cells in the cache and compares (these methods train nothing)
    assert main([*common, "--out", str(tmp_path / "full")]) == 0
    text = (tmp_path / "full" / "recommendation.md").read_text()
    assert "Recommendation (full budget, product protocol)" in text
    assert "The quick budget agrees (cached, 1 seed(s))" in text
    # the other budget's verdict is read from the cache of the run's protocol only
    assert main([*common, "--protocol", "paper", "--out", str(tmp_path / "paper")]) == 0
    assert "The quick budget's winner is unknown" in (tmp_path / "paper" / "recommendation.md").read_text()
