"""Services provisioned GPU memory and GPU compute at once (schema-2 records): the worker decides both with
one controller call, reads the coupled flags (a memory shortage censors compute too), and its decisions equal
the embedded loop's bit for bit whatever the batching; records that do not carry the model's resources are
refused with a reason and the tick is not lost."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from picrl.datasets import Trace
from picrl_core.artifact import ModelArtifact
from picrl_core.resources import GPU_POD, killing, observe
from producers.workload import Workload
from stream.decisions import REFUSAL_REASONS, BadValue, DecisionEngine, EngineSettings, Incoming, ServiceOverride
from stream.records import ResourceAction, ResourceUsage, ResourceUsageEvent, UsageEvent, decode_action
from tests.stream.conftest import WINDOW, two_resource_workload
from tests.support.reference import coupled_reference_run

NAMES = tuple(r.name for r in GPU_POD)


class CoupledLoop:
    """The closed loop of a 2-resource fleet in process: the cluster observes by ``picrl_core.resources.observe``
    on native values and reports each resource's own flag; capacities in force come from the engine's actions."""

    def __init__(self, engine: DecisionEngine, workload: Workload, one_event_per_batch: bool = False) -> None:
        self.engine, self.single, self.services = engine, one_event_per_batch, workload.services
        self.resources = workload.resources
        self.demand = workload.demand.reshape(workload.ticks, len(NAMES), -1)
        ticks, r, n = self.demand.shape
        self.capacity = np.zeros((ticks + 1, r, n))
        self.capacity[0] = self.demand.max(axis=0) * 1.1
        self.rows: dict[str, bytes | None] = {}
        self.actions: dict[tuple[str, int], ResourceAction] = {}
        self.transitions: list = []
        self.offset = 0
        self.hard_short = 0

    def events(self, t: int) -> list[Incoming]:
        y, _, own, short = observe(self.demand[t], self.capacity[t], self.resources)
        self.hard_short += int(short[0].sum())
        batch = []
        for j, service in enumerate(self.services):
            self.offset += 1
            resources = {
                name: ResourceUsage(float(y[r, j]), float(self.capacity[t, r, j]), bool(own[r, j]))
                for r, name in enumerate(NAMES)
            }
            batch.append(Incoming(ResourceUsageEvent(service, t, resources), 0, self.offset))
        return batch

    def run(self) -> CoupledLoop:
        for t in range(self.demand.shape[0]):
            batch = self.events(t)
            for part in [[e] for e in batch] if self.single else [batch]:
                outcome = self.engine.process(part, {i.service: self.rows.get(i.service) for i in part})
                assert not outcome.refused
                self.rows.update(outcome.rows)
                for action in outcome.actions:
                    assert isinstance(action, ResourceAction) and decode_action(action.to_bytes()) == action
                    self.actions[action.service, action.tick] = action
                    for r, name in enumerate(NAMES):
                        self.capacity[action.tick, r, self.services.index(action.service)] = action.resources[
                            name
                        ].capacity
                self.transitions += outcome.transitions
        return self

    def normalised(self, field: str) -> np.ndarray:
        """``(T - W, R * N)``: the field of every resource's decision, resource-major."""
        return np.array(
            [
                [getattr(self.actions[s, t].resources[name], field) for name in NAMES for s in self.services]
                for t in range(WINDOW, self.demand.shape[0])
            ]
        )


@pytest.mark.parametrize("one_event_per_batch, kills", [(False, False), (True, False), (False, True)])
def test_coupled_decisions_equal_the_embedded_loop_whatever_the_batching(
    tiny_artifact: ModelArtifact, native_trace: Trace, one_event_per_batch: bool, kills: bool
) -> None:
    """``kills``: a memory shortage kills the pod (``--hard-shortage pod``), so compute is observed at 0."""
    workload = two_resource_workload(native_trace, 3, WINDOW + 40)
    if kills:
        workload = replace(workload, resources=killing(workload.resources))
    engine = DecisionEngine(tiny_artifact, EngineSettings(headroom=0.5, resources=workload.resources))
    loop = CoupledLoop(engine, workload, one_event_per_batch).run()
    reference = coupled_reference_run(tiny_artifact, workload, headroom=0.5).trajectory
    services, demand = workload.services, loop.demand
    assert loop.hard_short > 0  # memory ran short: the coupling was exercised
    assert np.array_equal(loop.normalised("capacity_norm"), reference.action)
    assert np.array_equal(loop.normalised("mu"), reference.mu)
    assert np.array_equal(loop.normalised("margin"), reference.margin)
    # one transition per resource row and tick, keyed <service>/<resource>, with the reference's rewards
    rewards = {(tr.service, tr.tick): tr.reward for tr in loop.transitions}
    for r, name in enumerate(NAMES):
        for j, service in enumerate(services):
            got = [rewards[f"{service}/{name}", t] for t in range(WINDOW, demand.shape[0])]
            assert np.array_equal(got, reference.reward[:, r * len(services) + j])
    assert engine.decode_row(loop.rows[services[0]]).shape == (len(NAMES),)


def test_a_memory_shortage_moves_the_compute_decisions_and_nothing_moves_memory(
    tiny_artifact: ModelArtifact, native_trace: Trace
) -> None:
    """Against one learner per resource (each row reading its own flag), the coupled worker's memory decisions
    are the same and its compute decisions differ, from the first tick after a memory shortage on."""
    workload = two_resource_workload(native_trace, 3, WINDOW + 40)
    services = workload.services
    coupled = (
        CoupledLoop(DecisionEngine(tiny_artifact, EngineSettings(headroom=0.5, resources=GPU_POD)), workload)
        .run()
        .normalised("capacity_norm")
    )
    alone = coupled_reference_run(tiny_artifact, workload, headroom=0.5, coupled=False)
    memory, compute = slice(None, len(services)), slice(len(services), None)
    assert np.array_equal(coupled[:, memory], alone.trajectory.action[:, memory])
    differs = (coupled[:, compute] != alone.trajectory.action[:, compute]).any(axis=0)
    memory_short = (alone.trajectory.demand[:, memory] > alone.trajectory.action[:, memory]).any(axis=0)
    assert memory_short.any() and np.array_equal(differs, memory_short)


def _record(service: str, tick: int, resources: dict[str, tuple[float, float, bool]]) -> ResourceUsageEvent:
    return ResourceUsageEvent(service, tick, {name: ResourceUsage(*values) for name, values in resources.items()})


def test_records_without_the_models_resources_are_refused_with_a_reason(tiny_artifact: ModelArtifact) -> None:
    engine = DecisionEngine(tiny_artifact, EngineSettings(resources=GPU_POD))
    full = {"gpu_mem": (10.0, 20.0, False), "gpu_compute": (30.0, 50.0, False)}
    batch = [
        Incoming(UsageEvent("single", 0, 1.0, False, 2.0), 0, 1),
        Incoming(_record("partial", 0, {"gpu_mem": (10.0, 20.0, False)}), 0, 2),
        Incoming(_record("extra", 0, {**full, "net": (1.0, 2.0, False)}), 0, 3),
        Incoming(_record("x" * 195, 0, full), 0, 4),
        Incoming(_record("good", 0, full), 0, 5),
    ]
    outcome = engine.process(batch, {})
    reasons = {r.incoming.service[:10]: r.reason for r in outcome.refused}
    assert reasons == {
        "single": "missing_resource",
        "partial": "missing_resource",
        "extra": "unknown_resource",
        "x" * 10: "resource_id_too_long",
    }
    assert set(reasons.values()) <= REFUSAL_REASONS
    assert all(r.incoming is batch[i] for r, i in zip(outcome.refused, range(4)))  # the record as it came
    assert [a.service for a in outcome.actions] == ["good"] and outcome.actions[0].phase == "warmup"
    assert set(outcome.rows) == {"good"} and len(outcome.rows["good"]) == engine.row_bytes


def test_a_bad_value_is_answered_with_one_hold_for_every_resource(
    tiny_artifact: ModelArtifact, native_trace: Trace
) -> None:
    workload = two_resource_workload(native_trace, 1, WINDOW + 2)
    services = workload.services
    loop = CoupledLoop(DecisionEngine(tiny_artifact, EngineSettings(headroom=0.5, resources=GPU_POD)), workload).run()
    decided = loop.actions[services[0], WINDOW + 2]
    outcome = loop.engine.process([BadValue(services[0], WINDOW + 2, 0, 10_000)], {services[0]: loop.rows[services[0]]})
    (hold,) = outcome.actions
    assert isinstance(hold, ResourceAction) and hold.phase == "hold" and hold.tick == WINDOW + 3
    assert {name: d.capacity for name, d in hold.resources.items()} == {
        name: d.capacity for name, d in decided.resources.items()
    }
    assert not outcome.transitions
    (later,) = loop.events(WINDOW + 1)
    ahead = replace(later, event=replace(later.event, tick=WINDOW + 5), offset=10_001)  # 3 ticks never came
    assert loop.engine.process([ahead], {services[0]: loop.rows[services[0]]}).missed == {
        services[0]: (WINDOW + 2, WINDOW + 5)
    }


def test_the_service_cap_counts_pods_and_overrides_are_keyed_by_resource_row(
    tiny_artifact: ModelArtifact, native_trace: Trace
) -> None:
    """``max_services`` caps pods, not rows; an operator's override of ``<pod>/gpu_compute`` bounds that resource
    only; a redelivered record is skipped once, not once per resource."""
    full = {"gpu_mem": (10.0, 20.0, False), "gpu_compute": (30.0, 50.0, False)}
    settings = EngineSettings(resources=GPU_POD, max_services=2)
    engine = DecisionEngine(tiny_artifact, settings)
    outcome = engine.process([Incoming(_record(f"pod-{j}", 0, full), 0, j) for j in range(3)], {}, services_held=0)
    assert sorted(outcome.rows) == ["pod-0", "pod-1"] and [r.reason for r in outcome.refused] == ["service_limit"]
    assert outcome.refused[0].incoming.service == "pod-2"
    again = engine.process([Incoming(_record("pod-0", 0, full), 0, 0)], {"pod-0": outcome.rows["pod-0"]})
    assert again.redelivered == 1 and not again.actions

    workload = two_resource_workload(native_trace, 1, WINDOW + 6)
    cap = 0.5 * float(workload.demand[:, 1].min())
    frozen = EngineSettings(
        headroom=0.5, resources=GPU_POD, overrides={"pod-0/gpu_compute": ServiceOverride(max_capacity=cap)}
    )
    loop = CoupledLoop(DecisionEngine(tiny_artifact, frozen), workload).run()
    decided = [loop.actions["pod-0", t] for t in range(WINDOW, workload.ticks)]
    assert all(
        a.resources["gpu_compute"].capacity == cap and a.resources["gpu_compute"].clipped == "override" for a in decided
    )
    assert all(a.resources["gpu_mem"].clipped != "override" for a in decided)


def test_the_service_view_shows_each_resources_row(tiny_artifact: ModelArtifact, native_trace: Trace) -> None:
    """``GET /services/<id>`` of a worker deciding two resources: one entry per resource, each its own range."""
    from stream.views import service_view

    workload = two_resource_workload(native_trace, 1, WINDOW + 4)
    engine = DecisionEngine(tiny_artifact, EngineSettings(headroom=0.5, resources=GPU_POD))
    loop = CoupledLoop(engine, workload).run()
    last = loop.actions["pod-0", WINDOW + 4]
    view = service_view(engine, "pod-0", loop.rows["pod-0"], [last])
    assert view["service"] == "pod-0" and set(view["resources"]) == set(NAMES)
    assert view["last_decisions"] == [last.to_dict()]
    memory, compute = view["resources"]["gpu_mem"], view["resources"]["gpu_compute"]
    assert memory["phase"] == compute["phase"] == "control" and memory["next_tick"] == WINDOW + 4
    assert memory["range"] != compute["range"]
    assert compute["capacity"] == last.resources["gpu_compute"].capacity
