"""The stream with the paper's windowed predictor (``predictor.kind = "windowed"``, the paper preset's): its
decisions equal the simulator's bit for bit whatever the batching, with context and with range growth, as the
default incremental one's."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from picrl.datasets import Trace
from picrl.workloads import copies_of
from picrl_core.artifact import ModelArtifact
from picrl_core.pipeline import train_offline
from picrl_core.series import prepare_series
from stream.decisions import DecisionEngine, EngineSettings
from tests.stream.conftest import WINDOW, tiny_stream_config
from tests.stream.test_decisions import Loop
from tests.support.reference import reference_run, tripled


def _windowed_config():
    base = tiny_stream_config()
    return replace(base, predictor=replace(base.predictor, kind="windowed"))


@pytest.fixture(scope="module")
def windowed_artifact(native_trace: Trace) -> ModelArtifact:
    artifact = train_offline(prepare_series(native_trace.values, native_trace.name), _windowed_config())
    assert artifact.config.predictor.kind == "windowed"
    return artifact


@pytest.mark.parametrize("one_event_per_batch", [False, True])
def test_windowed_decisions_equal_the_simulator_whatever_the_batching(
    windowed_artifact: ModelArtifact, native_trace: Trace, one_event_per_batch: bool
) -> None:
    workload = copies_of(native_trace, 4, WINDOW + 40, start=900, seed=3)
    engine = DecisionEngine(windowed_artifact, EngineSettings(headroom=0.5))
    loop = Loop(engine, workload, one_event_per_batch).run()
    reference = reference_run(windowed_artifact, workload.demand, workload.services, headroom=0.5).trajectory
    assert np.array_equal(loop.normalised("capacity_norm"), reference.action)
    assert np.array_equal(loop.normalised("mu"), reference.mu)
    assert np.array_equal(loop.normalised("margin"), reference.margin)


def test_windowed_context_services_and_range_growth_match_the_simulator(native_trace: Trace) -> None:
    series = prepare_series(native_trace.values, native_trace.name, native_trace.context, native_trace.context_names)
    artifact = train_offline(series, _windowed_config())
    workload = copies_of(native_trace, 3, WINDOW + 20, start=900, seed=4)
    loop = Loop(DecisionEngine(artifact), workload).run()
    reference = reference_run(artifact, workload.demand, workload.services, 0.5, workload.context).trajectory
    assert np.array_equal(loop.normalised("capacity_norm"), reference.action)
    grown = tripled(copies_of(native_trace, 3, WINDOW + 60, start=900, seed=3), WINDOW)
    settings = EngineSettings(headroom=0.5, range_growth=2.0, grow_after=3)
    loop = Loop(DecisionEngine(artifact, settings), grown).run()
    reference = reference_run(
        artifact, grown.demand, grown.services, headroom=0.5, context=grown.context, range_growth=2.0, grow_after=3
    ).trajectory
    assert np.array_equal(loop.normalised("capacity_norm"), reference.action)
