"""The comparison's product protocol decides as a stream worker does, bit for bit, on demand that outgrows its range
and on demand that falls below its floor (in process, and over a real broker)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import numpy as np
import pytest

from picrl.datasets import Trace
from picrl.workloads import copies_of
from picrl_core.artifact import ModelArtifact
from picrl_core.methods.growth import STREAM_GROWTH, GrowthLoopResult, RangeGrowth, run_growth_loop
from picrl_core.methods.pic_rl import PicRLProvisioner
from picrl_core.noise import service_key
from picrl_core.scaling import to_unit
from producers.closed_loop import ClosedLoopEnvironment
from producers.workload import Workload
from stream.decisions import DecisionEngine, EngineSettings
from stream.topics import TopicNames, ensure_topics, topic_specs
from tests.stream.conftest import WINDOW
from tests.stream.test_decisions import Loop
from tests.support.kafka import unique
from tests.support.processes import picrl_process, tail, worker_args
from tests.support.reference import quietened, tripled


def _simulated(artifact: ModelArtifact, workload: Workload, growth: RangeGrowth) -> GrowthLoopResult:
    """The growth protocol's loop over ``workload`` after its warm-up window, from the artifact's range."""
    low, high = artifact.scaling["series"]["low"], artifact.scaling["series"]["high"]
    provisioner = PicRLProvisioner.from_artifact(artifact, slow_updates=False)
    provisioner.keys = np.array([service_key(s) for s in workload.services], dtype=np.uint64)
    provisioner.start_tick = WINDOW
    history = to_unit(workload.demand[:WINDOW].T, low, high)
    return run_growth_loop(provisioner, workload.demand[WINDOW:], history, low, high, growth)


def test_the_product_protocol_equals_the_worker_on_a_series_that_outgrows_its_range(
    tiny_artifact: ModelArtifact, native_trace: Trace
) -> None:
    workload = tripled(copies_of(native_trace, 3, WINDOW + 60, start=900, seed=3), WINDOW)
    settings = EngineSettings(scaling="artifact", range_growth=2.0, grow_after=3)
    loop = Loop(DecisionEngine(tiny_artifact, settings), workload).run()
    run = _simulated(tiny_artifact, workload, RangeGrowth(2.0, 3))
    high = tiny_artifact.scaling["series"]["high"]
    assert (run.high[-1] > high).all() and (run.capacity.max(axis=0) > high).all()  # every service grew past it
    assert np.array_equal(run.capacity, loop.capacity[WINDOW:-1])
    assert np.array_equal(run.actions, loop.normalised("capacity_norm"))
    assert np.array_equal(run.censored, workload.demand[WINDOW:] > loop.capacity[WINDOW:-1])


@pytest.mark.parametrize("floor_share", [0.5, 0.0])
def test_the_growth_protocol_equals_the_worker_on_a_series_that_falls_below_its_floor(
    tiny_artifact: ModelArtifact, native_trace: Trace, floor_share: float
) -> None:
    workload = quietened(copies_of(native_trace, 3, WINDOW + 50, start=900, seed=3), WINDOW)
    settings = EngineSettings(scaling="artifact", shrink_after=3, floor_share=floor_share)
    engine = DecisionEngine(tiny_artifact, settings)
    loop = Loop(engine, workload).run()
    run = _simulated(tiny_artifact, workload, RangeGrowth(shrink_after=3, floor_share=floor_share))
    low = tiny_artifact.scaling["series"]["low"]
    assert (run.low[-1] < low).all() and (run.capacity.min(axis=0) < low).all()  # every floor came down
    assert np.array_equal(run.capacity, loop.capacity[WINDOW:-1])
    assert np.array_equal(run.actions, loop.normalised("capacity_norm"))
    rows = {s: engine.decode_row(raw)[0] for s, raw in loop.rows.items()}
    assert [rows[s]["low"] for s in workload.services] == run.low[-1].tolist()  # the stored rows hold the ranges


def test_a_worker_over_kafka_lowers_the_floors_as_the_growth_protocol_does(
    kafka_bootstrap: str, tiny_model_dir: Path, tiny_artifact: ModelArtifact, native_trace: Trace, tmp_path: Path
) -> None:
    """The worker process, with the artifact's range and the default range rules, in closed loop over a broker on
    a night of usage far below the range's floor, then the day again: the capacities it decides equal the growth
    protocol's, and each range change is logged (a lowered floor with reason ``underused``)."""
    prefix = unique("e2e-floor")
    asyncio.run(ensure_topics(kafka_bootstrap, topic_specs(prefix, 2)))
    workload = quietened(copies_of(native_trace, 2, WINDOW + 45, start=900, seed=5), WINDOW)
    log = tmp_path / "worker.log"
    args = worker_args(tiny_model_dir, kafka_bootstrap, prefix, "--scaling", "artifact", partitions=2)
    with picrl_process(args, log) as worker:
        env = ClosedLoopEnvironment(kafka_bootstrap, TopicNames(prefix), workload, action_timeout=120.0)
        record = asyncio.run(env.run())
        assert worker.poll() is None, tail(log)
    run = _simulated(tiny_artifact, workload, STREAM_GROWTH)
    low = tiny_artifact.scaling["series"]["low"]
    assert (run.low[-1] < low).all()
    assert np.array_equal(record.capacity[WINDOW:], run.capacity)  # bit for bit
    lowered = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{") and "range of" in line]
    assert {entry["service"] for entry in lowered if entry["reason"] == "underused"} == set(workload.services)
    assert len(lowered) == int((np.diff(run.low, axis=0) != 0).sum() + (np.diff(run.high, axis=0) != 0).sum())
