"""Shared offline training (picrl_core.training_memo): identical phases train once inside a block,
and sharing never changes a result."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

import picrl_core.pipeline as pipeline
from picrl_core.config import PicRLConfig
from picrl_core.methods import REGISTRY
from picrl_core.methods.evaluation import run_on_test_split
from picrl_core.series import PreparedSeries, prepare_series
from picrl_core.training_memo import memoized, series_fingerprint, shared_training


@pytest.fixture(scope="module")
def series(diurnal_series: np.ndarray) -> PreparedSeries:
    return prepare_series(diurnal_series[:900], "memo-diurnal")


def test_memoized_computes_once_inside_a_block_and_always_outside() -> None:
    calls: list[int] = []

    def compute() -> object:
        calls.append(1)
        return object()

    assert memoized("k", compute) is not memoized("k", compute)
    with shared_training():
        first = memoized("k", compute)
        with shared_training():  # a nested block shares the outer one
            assert memoized("k", compute) is first
        assert memoized("other", compute) is not first
    assert len(calls) == 4
    memoized("k", compute)  # the block is over: computed again
    assert len(calls) == 5


def test_fingerprint_follows_the_training_values_only(series: PreparedSeries) -> None:
    assert series_fingerprint(series) == series_fingerprint(replace(series, test=series.test[:10]))
    changed = replace(series, train=series.train + 1e-9)
    assert series_fingerprint(changed) != series_fingerprint(series)


def _count_trainings(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    counts = {"phase1": 0, "phase2": 0}
    train_predictor, pretrain = pipeline.train_predictor, pipeline.pretrain_policy

    def counted_predictor(*args, **kwargs):
        counts["phase1"] += 1
        return train_predictor(*args, **kwargs)

    def counted_pretrain(*args, **kwargs):
        counts["phase2"] += 1
        return pretrain(*args, **kwargs)

    monkeypatch.setattr(pipeline, "train_predictor", counted_predictor)
    monkeypatch.setattr(
        pipeline.train_offline,
        "__kwdefaults__",
        {**pipeline.train_offline.__kwdefaults__, "pretrainer": counted_pretrain},
    )
    return counts


def test_methods_share_phases_and_get_the_results_they_get_alone(
    series: PreparedSeries, tiny_config: PicRLConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    names = ["pic-rl", "a5", "a6", "conformal", "a2"]
    alone = {name: run_on_test_split(REGISTRY[name], series, tiny_config, 60.0) for name in names}
    counts = _count_trainings(monkeypatch)
    with shared_training():
        shared = {name: run_on_test_split(REGISTRY[name], series, tiny_config, 60.0) for name in names}
    # Phase 1 once for PIC-RL and its ablations (the incremental LSTM) and once for conformal (the windowed one the
    # baselines read); Phase 2 once for pic-rl/a5/a6 (online switches) and once for a2
    assert counts == {"phase1": 2, "phase2": 2}
    for name in names:
        np.testing.assert_array_equal(shared[name].actions, alone[name].actions, err_msg=name)
    assert not np.array_equal(shared["a5"].actions, shared["pic-rl"].actions) or not np.array_equal(
        shared["a6"].actions, shared["pic-rl"].actions
    )  # the online switches still act


def test_run_on_test_split_scores_the_test_demand(series: PreparedSeries, tiny_config: PicRLConfig) -> None:
    run = run_on_test_split(REGISTRY["vpa"], series, tiny_config, 57.0)
    assert run.demand.shape == run.actions.shape == run.censored.shape == series.test.shape
    np.testing.assert_array_equal(run.demand, series.test)
    np.testing.assert_array_equal(run.censored, run.demand > run.actions)
    assert run.metrics.steps == series.test.size
    assert run.metrics.mae == pytest.approx(np.mean(np.abs(run.actions - series.test)))


def test_timed_methods_get_the_trace_period(series: PreparedSeries, tiny_config: PicRLConfig) -> None:
    assert {name for name, m in REGISTRY.items() if m.timed} == {"vpa", "autopilot", "recent-max"}
    fast, slow = (REGISTRY["vpa"].fitted(series, tiny_config, step) for step in (1.0, 3600.0))
    assert fast.rule.half_life != slow.rule.half_life  # the 24 h half-life in ticks of the given period
