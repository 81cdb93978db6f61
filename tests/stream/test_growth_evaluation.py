"""The comparison's product protocol decides as a stream worker does, bit for bit, on demand that outgrows its range."""

from __future__ import annotations

import numpy as np

from picrl.datasets import Trace
from picrl.workloads import copies_of
from picrl_core.artifact import ModelArtifact
from picrl_core.methods.growth import RangeGrowth, run_growth_loop
from picrl_core.methods.pic_rl import PicRLProvisioner
from picrl_core.noise import service_key
from picrl_core.scaling import to_unit
from stream.decisions import DecisionEngine, EngineSettings
from tests.stream.conftest import WINDOW
from tests.stream.test_decisions import Loop
from tests.support.reference import tripled


def test_the_product_protocol_equals_the_worker_on_a_series_that_outgrows_its_range(
    tiny_artifact: ModelArtifact, native_trace: Trace
) -> None:
    workload = tripled(copies_of(native_trace, 3, WINDOW + 60, start=900, seed=3), WINDOW)
    settings = EngineSettings(scaling="artifact", range_growth=2.0, grow_after=3)
    loop = Loop(DecisionEngine(tiny_artifact, settings), workload).run()
    low, high = tiny_artifact.scaling["series"]["low"], tiny_artifact.scaling["series"]["high"]
    provisioner = PicRLProvisioner.from_artifact(tiny_artifact, slow_updates=False)
    provisioner.keys = np.array([service_key(s) for s in workload.services], dtype=np.uint64)
    provisioner.start_tick = WINDOW
    history = to_unit(workload.demand[:WINDOW].T, low, high)
    run = run_growth_loop(provisioner, workload.demand[WINDOW:], history, low, high, RangeGrowth(2.0, 3))
    assert (run.high[-1] > high).all() and (run.capacity.max(axis=0) > high).all()  # every service grew past it
    assert np.array_equal(run.capacity, loop.capacity[WINDOW:-1])
    assert np.array_equal(run.actions, loop.normalised("capacity_norm"))
    assert np.array_equal(run.censored, workload.demand[WINDOW:] > loop.capacity[WINDOW:-1])
