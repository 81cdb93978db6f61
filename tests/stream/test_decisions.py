"""The worker's translation layer without Kafka: warm-up, decisions equal to the simulator's, refusals."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import numpy as np
import pytest

from picrl.datasets import Trace
from picrl.workloads import copies_of
from picrl_core.artifact import ModelArtifact
from picrl_core.deployable import DeployError
from picrl_core.reward import step_reward
from picrl_core.rules.portfolio import CANDIDATES
from producers.workload import Workload
from stream.decisions import DecisionEngine, EngineSettings, Incoming, ServiceOverride
from stream.records import Action, UsageEvent
from tests.stream.conftest import WINDOW
from tests.support.reference import reference_run, rule_reference_run, tripled


class Loop:
    """The closed loop of producers.closed_loop, in process: capacities in force come from the engine."""

    def __init__(self, engine: DecisionEngine, workload: Workload, one_event_per_batch: bool = False) -> None:
        self.engine, self.workload, self.single = engine, workload, one_event_per_batch
        self.rows: dict[str, bytes | None] = {}
        self.offset = 0
        ticks, n = workload.demand.shape
        self.capacity = np.zeros((ticks + 1, n))
        self.capacity[0] = workload.demand.max(axis=0) * 1.1
        self.actions: dict[tuple[str, int], Action] = {}
        self.transitions = []

    def event(self, t: int, j: int) -> Incoming:
        w = self.workload
        d, a = w.demand[t, j], self.capacity[t, j]
        context = None if w.context is None else dict(zip(w.context_names, w.context[t, j].tolist()))
        self.offset += 1
        return Incoming(UsageEvent(w.services[j], t, float(min(d, a)), bool(d > a), float(a), context), 0, self.offset)

    def feed(self, batch: list[Incoming]) -> None:
        outcome = self.engine.process(batch, {i.event.service: self.rows.get(i.event.service) for i in batch})
        self.rows.update(outcome.rows)
        assert not outcome.refused
        for action in outcome.actions:
            self.actions[action.service, action.tick] = action
            self.capacity[action.tick, self.workload.services.index(action.service)] = action.capacity
        self.transitions += outcome.transitions

    def run(self) -> Loop:
        ticks, n = self.workload.demand.shape
        for t in range(ticks):
            batch = [self.event(t, j) for j in range(n)]
            for part in [[e] for e in batch] if self.single else [batch]:
                self.feed(part)
        return self

    def normalised(self, field: str) -> np.ndarray:
        ticks, _ = self.workload.demand.shape
        return np.array(
            [[getattr(self.actions[s, t], field) for s in self.workload.services] for t in range(WINDOW, ticks)]
        )


@pytest.fixture()
def workload(native_trace: Trace) -> Workload:
    return copies_of(native_trace, 4, WINDOW + 40, start=900, seed=3)


@pytest.mark.parametrize("one_event_per_batch", [False, True])
def test_decisions_equal_the_simulator_whatever_the_batching(
    tiny_artifact: ModelArtifact, workload: Workload, one_event_per_batch: bool
) -> None:
    loop = Loop(DecisionEngine(tiny_artifact, EngineSettings(headroom=0.5)), workload, one_event_per_batch).run()
    reference = reference_run(tiny_artifact, workload.demand, workload.services, headroom=0.5).trajectory
    assert np.array_equal(loop.normalised("capacity_norm"), reference.action)
    assert np.array_equal(loop.normalised("mu"), reference.mu)
    assert np.array_equal(loop.normalised("margin"), reference.margin)
    assert np.array_equal(loop.normalised("escape"), reference.escape) and (reference.escape > 0).any()
    # the replay transitions carry Eq. 9/10 rewards, equal to the simulator's
    rewards = {(tr.service, tr.tick): tr for tr in loop.transitions}
    for j, service in enumerate(workload.services):
        for t in range(WINDOW, workload.ticks):
            tr = rewards[service, t]
            assert tr.reward == reference.reward[t - WINDOW, j]
            cfg = tiny_artifact.config
            assert tr.reward == step_reward(
                tr.action, tr.observed, tr.censored, tr.mu, tr.sigma, tr.censor_streak, cfg.cost, cfg.reward
            )


def test_every_deployed_rule_decides_as_the_comparison_simulates_it(
    rule_artifacts: dict[str, ModelArtifact], native_trace: Trace
) -> None:
    workload = _tripling(native_trace)  # the ranges grow too
    for name, artifact in rule_artifacts.items():
        loop = Loop(DecisionEngine(artifact, EngineSettings(headroom=0.5)), workload, one_event_per_batch=True).run()
        reference = rule_reference_run(artifact, workload.demand, workload.services, headroom=0.5)
        assert np.array_equal(loop.normalised("capacity_norm"), reference.actions), name  # bit for bit
        assert np.array_equal(loop.normalised("capacity"), reference.capacity), name
        assert (reference.high[-1] > reference.high[0]).all(), name
        assert not loop.transitions, name  # no policy learnt, no replay
        control = [a for a in loop.actions.values() if a.phase == "control"]
        if name == "portfolio":  # each action names the candidate it is and its weight
            assert {a.candidate for a in control} <= set(CANDIDATES) and all(0 < a.weight <= 1 for a in control)
        else:
            assert all(a.candidate is None and a.weight == 1.0 for a in control), name


@pytest.mark.parametrize("method", ["tft", "informer", "autoformer"])
def test_a_predictor_variant_decides_as_the_simulator(
    method: str, variant_artifact: Callable[[str], ModelArtifact], workload: Workload
) -> None:
    artifact = variant_artifact(method)
    assert artifact.method == method and artifact.config.predictor.kind == "windowed"
    loop = Loop(DecisionEngine(artifact, EngineSettings(headroom=0.5, method=method)), workload).run()
    reference = reference_run(artifact, workload.demand, workload.services, headroom=0.5).trajectory
    assert np.array_equal(loop.normalised("capacity_norm"), reference.action)
    assert np.array_equal(loop.normalised("mu"), reference.mu)


def test_an_artifact_for_another_method_is_refused(
    tiny_artifact: ModelArtifact, rule_artifacts: dict[str, ModelArtifact]
) -> None:
    with pytest.raises(DeployError, match="serves 'pic-rl', not 'recent-max'"):
        DecisionEngine(tiny_artifact, EngineSettings(method="recent-max"))
    with pytest.raises(DeployError, match="serves 'recent-max', not 'pic-rl'"):
        DecisionEngine(rule_artifacts["recent-max"], EngineSettings(method="pic-rl"))


def test_warmup_holds_the_capacity_and_raises_it_after_a_shortage(tiny_artifact: ModelArtifact) -> None:
    engine = DecisionEngine(tiny_artifact, EngineSettings(warmup_bump=0.5))
    rows: dict[str, bytes | None] = {}
    events = [UsageEvent("svc", 0, 5.0, False, 8.0), UsageEvent("svc", 1, 8.0, True, 8.0)]
    capacities = []
    for offset, event in enumerate(events):
        outcome = engine.process([Incoming(event, 0, offset)], {"svc": rows.get("svc")})
        rows.update(outcome.rows)
        (action,) = outcome.actions
        assert action.phase == "warmup" and action.tick == event.tick + 1
        capacities.append(action.capacity)
    assert capacities == [8.0, 12.0]
    assert engine.row_bytes == len(rows["svc"]) < 2048


def _warm(engine: DecisionEngine, service: str = "svc") -> dict[str, bytes | None]:
    rows: dict[str, bytes | None] = {}
    outcome = engine.process(
        [Incoming(UsageEvent(service, t, 4.0 + t % 3, False, 10.0), 0, t) for t in range(WINDOW)], {service: None}
    )
    rows.update(outcome.rows)
    assert outcome.actions[-1].phase == "control" and outcome.actions[-1].tick == WINDOW
    return rows


def test_duplicates_are_refused_and_redeliveries_skipped(tiny_artifact: ModelArtifact) -> None:
    engine = DecisionEngine(tiny_artifact)
    rows = _warm(engine)
    again = engine.process([Incoming(UsageEvent("svc", 3, 5.0, False, 10.0), 0, 3)], rows)  # same offset: redelivery
    assert again.redelivered == 1 and not again.refused and not again.actions
    duplicate = engine.process([Incoming(UsageEvent("svc", 3, 5.0, False, 10.0), 0, 99)], rows)
    assert [r.reason for r in duplicate.refused] == ["duplicate_tick"] and not duplicate.actions
    assert duplicate.rows["svc"] == rows["svc"]  # nothing changed


def test_far_future_tick_and_wrong_context_are_refused(
    tiny_artifact: ModelArtifact, tiny_context_artifact: ModelArtifact
) -> None:
    engine = DecisionEngine(tiny_artifact, EngineSettings(max_tick_gap=10))
    rows = _warm(engine)
    far = engine.process([Incoming(UsageEvent("svc", WINDOW + 11, 5.0, False, 10.0), 0, 50)], rows)
    assert [r.reason for r in far.refused] == ["tick_out_of_range"]
    gap = engine.process([Incoming(UsageEvent("svc", WINDOW + 10, 5.0, False, 10.0), 0, 51)], rows)
    assert not gap.refused and gap.actions[0].tick == WINDOW + 11  # a gap within bounds moves the clock
    assert gap.missed == {"svc": (WINDOW, WINDOW + 10)} and not far.missed  # reported (a metric and a warning)
    with_context = DecisionEngine(tiny_context_artifact)
    missing = with_context.process([Incoming(UsageEvent("svc", 0, 5.0, False, 10.0), 0, 0)], {"svc": None})
    assert [r.reason for r in missing.refused] == ["missing_context"]
    fine = with_context.process(
        [Incoming(UsageEvent("svc", 0, 5.0, False, 10.0, {"duty_pct": 40.0}), 0, 1)], {"svc": None}
    )
    assert not fine.refused


def test_a_missing_context_channel_is_refused_and_the_tick_held(tiny_context_artifact: ModelArtifact) -> None:
    engine = DecisionEngine(tiny_context_artifact)
    warm = [Incoming(UsageEvent("svc", t, 4.0 + t % 3, False, 10.0, {"duty_pct": 40.0}), 0, t) for t in range(WINDOW)]
    decided = engine.process(warm, {"svc": None})
    outcome = engine.process([Incoming(UsageEvent("svc", WINDOW, 5.0, False, 10.0), 0, WINDOW)], decided.rows)
    assert [r.reason for r in outcome.refused] == ["missing_context"]
    (hold,) = outcome.actions
    assert (hold.phase, hold.tick, hold.capacity) == ("hold", WINDOW + 1, decided.actions[-1].capacity)


def test_a_capacity_applied_by_the_scheduler_replaces_the_decided_one(tiny_artifact: ModelArtifact) -> None:
    engine = DecisionEngine(tiny_artifact)
    rows = _warm(engine)
    outcome = engine.process([Incoming(UsageEvent("svc", WINDOW, 3.0, True, 3.0), 0, 100)], rows)
    (transition,) = outcome.transitions
    row = engine.decode_row(rows["svc"])[0]
    assert transition.action == pytest.approx((3.0 - row["low"]) / (row["high"] - row["low"]))
    assert transition.observed == transition.action  # censored: y = a in force


def test_context_services_match_the_simulator(tiny_context_artifact: ModelArtifact, native_trace: Trace) -> None:
    workload = copies_of(native_trace, 3, WINDOW + 20, start=900, seed=4)
    loop = Loop(DecisionEngine(tiny_context_artifact), workload).run()
    reference = reference_run(
        tiny_context_artifact, workload.demand, workload.services, 0.5, workload.context
    ).trajectory
    assert np.array_equal(loop.normalised("capacity_norm"), reference.action)


def test_artifact_scaling_uses_the_training_range(tiny_artifact: ModelArtifact) -> None:
    engine = DecisionEngine(tiny_artifact, EngineSettings(scaling="artifact"))
    row = engine.decode_row(_warm(engine)["svc"])[0]
    series = tiny_artifact.scaling["series"]
    assert (row["low"], row["high"]) == (series["low"], series["high"])
    with pytest.raises(ValueError, match="scaling must be one of"):
        replace(EngineSettings(), scaling="bogus")


def test_far_past_ticks_and_services_beyond_the_cap_are_refused(tiny_artifact: ModelArtifact) -> None:
    engine = DecisionEngine(tiny_artifact, EngineSettings(max_tick_gap=5, max_services=2))
    rows = _warm(engine)
    past = engine.process([Incoming(UsageEvent("svc", 0, 5.0, False, 10.0), 0, 500)], rows)
    assert [r.reason for r in past.refused] == ["tick_out_of_range"]
    batch = [Incoming(UsageEvent(name, 0, 5.0, False, 10.0), 0, 600 + i) for i, name in enumerate(("b", "c"))]
    capped = engine.process(batch, {"b": None, "c": None}, services_held=1)
    assert [(r.incoming.event.service, r.reason) for r in capped.refused] == [("c", "service_limit")]
    assert set(capped.rows) == {"b"} and [a.service for a in capped.actions] == ["b"]


def test_operator_overrides_bound_or_freeze_a_service(tiny_artifact: ModelArtifact, native_trace: Trace) -> None:
    workload = copies_of(native_trace, 2, WINDOW + 20, start=900, seed=5)
    first, second = workload.services
    overrides = {first: ServiceOverride(freeze=33.0), second: ServiceOverride(min_capacity=40.0, max_capacity=41.0)}
    loop = Loop(DecisionEngine(tiny_artifact, EngineSettings(overrides=overrides)), workload).run()
    frozen = [a for (s, _), a in loop.actions.items() if s == first]
    bounded = [a for (s, _), a in loop.actions.items() if s == second]
    assert all(a.capacity == 33.0 for a in frozen) and any(a.clipped == "override" for a in frozen)
    assert all(40.0 <= a.capacity <= 41.0 for a in bounded)
    control = [a for a in bounded if a.phase == "control"]
    assert control and all(a.k_sigma == pytest.approx(a.k * a.sigma) for a in control)
    with pytest.raises(ValueError, match="min_capacity"):
        ServiceOverride(min_capacity=5.0, max_capacity=1.0)


def _tripling(native_trace: Trace, services: int = 3) -> Workload:
    return tripled(copies_of(native_trace, services, WINDOW + 100, start=900, seed=3), WINDOW)


def test_an_outgrown_range_grows_in_the_stream_as_in_the_simulator(
    tiny_artifact: ModelArtifact, native_trace: Trace
) -> None:
    workload = _tripling(native_trace)
    engine = DecisionEngine(tiny_artifact, EngineSettings(headroom=0.5, range_growth=2.0, grow_after=3))
    changes = []
    original = engine.process

    def process(*args, **kwargs):  # keep the range changes the batches report
        outcome = original(*args, **kwargs)
        changes.extend(outcome.ranges)
        return outcome

    engine.process = process  # type: ignore[method-assign]
    loop = Loop(engine, workload).run()
    reference = reference_run(
        tiny_artifact, workload.demand, workload.services, headroom=0.5, range_growth=2.0, grow_after=3
    )
    assert np.array_equal(loop.normalised("capacity_norm"), reference.trajectory.action)  # bit for bit
    assert np.array_equal(loop.normalised("capacity"), reference.capacity)
    first_high = reference.high[0]
    above = loop.normalised("capacity") > first_high * (1 + 1e-9)
    first_above = above.argmax(axis=0)
    assert above.any(axis=0).all() and (first_above < 40).all(), first_above  # within 40 ticks of the ramp's end
    assert changes and {c.reason for c in changes} == {"outgrown"}
    assert all(c.new_low == c.low and c.new_high == pytest.approx(c.low + 2 * (c.high - c.low)) for c in changes)
    late = slice(-20, None)  # the range has caught up: the shortage rate is back below one half
    assert (workload.demand[WINDOW:][late] > loop.normalised("capacity")[late]).mean() < 0.5
    fixed = Loop(DecisionEngine(tiny_artifact, EngineSettings(headroom=0.5, range_growth=1.0)), workload).run()
    assert (fixed.normalised("capacity") <= first_high * (1 + 1e-9)).all()  # without growth: pinned for ever


def test_an_operator_sets_a_range_that_the_state_follows_and_that_never_grows(
    tiny_artifact: ModelArtifact, native_trace: Trace
) -> None:
    workload = _tripling(native_trace, services=1)
    service = workload.services[0]
    engine = DecisionEngine(tiny_artifact, EngineSettings(overrides={service: ServiceOverride(low=0.0, high=90.0)}))
    loop = Loop(engine, workload).run()
    row = engine.decode_row(loop.rows[service])[0]
    assert (row["low"], row["high"]) == (0.0, 90.0)  # from the first decision on, and never grown
    assert (loop.normalised("capacity") <= 90.0).all() and loop.normalised("capacity").max() > 80.0
    later = DecisionEngine(tiny_artifact, EngineSettings(overrides={service: ServiceOverride(low=0.0, high=300.0)}))
    tick = workload.ticks
    event = Incoming(UsageEvent(service, tick, 90.0, True, 90.0), 0, 10_000)
    before = engine.decode_row(loop.rows[service])[0]
    outcome = later.process([event], {service: loop.rows[service]})  # the operator widened it: a restart applies it
    (change,) = outcome.ranges
    assert (change.reason, change.low, change.high, change.new_low, change.new_high) == (
        "operator",
        0.0,
        90.0,
        0.0,
        300.0,
    )
    after = later.decode_row(outcome.rows[service])[0]
    assert (after["low"], after["high"]) == (0.0, 300.0)
    np.testing.assert_allclose(
        after["core"]["observations"][:-1] * 300.0, before["core"]["observations"][1:] * 90.0, rtol=1e-5
    )  # the same native history, one tick later
