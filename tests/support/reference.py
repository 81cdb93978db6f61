"""The embedded runner's view of a stream workload: what the worker must reproduce tick for tick."""

from __future__ import annotations

import copy
from dataclasses import dataclass, fields, replace

import numpy as np

from picrl_core.artifact import ModelArtifact
from picrl_core.controller import PicRLController
from picrl_core.controller_state import ControllerState
from picrl_core.deployable import deployed_rule
from picrl_core.methods.deployed import RuleProvisioner
from picrl_core.methods.growth import GrowthLoopResult, RangeGrowth, run_growth_loop
from picrl_core.noise import service_key
from picrl_core.resources import coupled_flags, impute_served_share, observe, unobserved
from picrl_core.scaling import floor_streak, from_unit, next_high, next_low, to_unit, window_range
from picrl_core.series import MinMaxScaler
from picrl_core.simulator import DECISION_FIELDS, Trajectory, censor
from producers.workload import Workload


@dataclass
class ReferenceRun:
    """The simulator's trajectory (normalised, in each tick's range) and each tick's range and capacity."""

    trajectory: Trajectory
    low: np.ndarray  # (T, N) range in force at each tick
    high: np.ndarray
    capacity: np.ndarray  # (T, N) native capacity in force


def reference_run(
    artifact: ModelArtifact,
    demand: np.ndarray,
    services: tuple[str, ...],
    headroom: float,
    context: np.ndarray | None = None,
    range_growth: float = 2.0,
    grow_after: int = 3,
    shrink_after: int = 3,
    floor_share: float = 0.5,
) -> ReferenceRun:
    """The simulator's closed loop (``picrl_core.simulator``) over the ticks after the warm-up window,
    with each service scaled by the range a worker derives from its first window, the warm-up as
    uncensored history, and the worker's range rules (``range_growth`` 1: no growth, ``shrink_after`` 0: floors
    stay).

    Demand above a service's range stays above 1 (no capacity in range covers it: the tick is short, as
    on the cluster); below it, it is 0, as the worker sees usage under its range."""
    window = artifact.config.predictor.window
    low, high = window_range(demand[:window].T, headroom)
    scaled_context = None
    if context is not None:
        scalers = [MinMaxScaler.from_dict(s) for s in artifact.scaling["context"]]
        scaled_context = to_unit(context, np.array([s.low for s in scalers]), np.array([s.high for s in scalers]))
    controller = PicRLController(artifact.predictor, copy.deepcopy(artifact.policy), artifact.config)
    keys = np.array([service_key(s) for s in services], dtype=np.uint64)
    state = controller.initial_state(
        keys,
        _unit(demand[:window], low, high).T,
        None if scaled_context is None else scaled_context[:window].transpose(1, 0, 2),
        window,
    )
    ticks = demand.shape[0] - window
    record = {
        f.name: np.empty((ticks, len(services)), dtype=bool if f.name == "censored" else np.float64)
        for f in fields(Trajectory)
    }
    lows, highs, capacity = (np.empty((ticks, len(services))) for _ in range(3))
    rules = _Rules(range_growth, grow_after, shrink_after, floor_share, np.zeros(len(services), dtype=np.int64))
    for t in range(ticks):
        unit = _unit(demand[window + t], low, high)
        observed, censored = censor(unit, state.action)
        for name in DECISION_FIELDS:
            record[name][t] = getattr(state, name)
        record["demand"][t], record["observed"][t], record["censored"][t] = unit, observed, censored
        lows[t], highs[t], capacity[t] = low, high, from_unit(state.action, low, high)
        state, low, high, record["reward"][t] = _advance(
            controller,
            state,
            observed,
            censored,
            None if scaled_context is None else scaled_context[window + t],
            np.minimum(demand[window + t], capacity[t]),
            low,
            high,
            rules,
        )
    return ReferenceRun(Trajectory(**record), lows, highs, capacity)


def rule_reference_run(
    artifact: ModelArtifact, demand: np.ndarray, services: tuple[str, ...], headroom: float
) -> GrowthLoopResult:
    """The comparison's view of a worker running ``artifact``'s deployed rule: its provisioner
    (:class:`~picrl_core.methods.deployed.RuleProvisioner`, keyed as the worker keys the services) in the growth
    protocol's loop over the ticks after the warm-up window, each service in the range a worker derives from its
    first window, grown as the worker's defaults grow it."""
    window = artifact.config.predictor.window
    low, high = window_range(demand[:window].T, headroom)
    keys = np.array([service_key(s) for s in services], dtype=np.uint64)
    provisioner = RuleProvisioner(deployed_rule(artifact), low, high, keys=keys, start_tick=window)
    history = to_unit(demand[:window].T, low[:, None], high[:, None])
    return run_growth_loop(provisioner, demand[window:], history, low, high, RangeGrowth())


def coupled_reference_run(
    artifact: ModelArtifact,
    workload: Workload,
    headroom: float,
    range_growth: float = 2.0,
    grow_after: int = 3,
    shrink_after: int = 3,
    floor_share: float = 0.5,
    coupled: bool = True,
) -> ReferenceRun:
    """:func:`reference_run` for services provisioned several resources at once (``workload.resources``, its
    demand ``(T, R * N)`` native, resource-major), each (resource, service) a row keyed ``<service>/<resource>``
    (resource-major), the
    cluster's observation is :func:`~picrl_core.resources.observe` on the native values (a memory shortage
    fails requests, so compute is observed on the served load), and the controller reads the coupled flags
    with the soft observations lifted by :func:`~picrl_core.resources.impute_served_share`, as the
    simulator's joint PIC-RL does (``coupled=False``: each row reads its own flag and observation, as one
    learner per resource would). The trajectory's columns are the rows."""
    window = artifact.config.predictor.window
    services, resources, flat = workload.services, workload.resources, workload.demand
    steps, r, n = flat.shape[0], len(resources), len(services)
    demand = flat.reshape(steps, r, n)
    low, high = window_range(flat[:window].T, headroom)
    controller = PicRLController(artifact.predictor, copy.deepcopy(artifact.policy), artifact.config)
    keys = np.array([service_key(f"{s}/{res.name}") for res in resources for s in services], dtype=np.uint64)
    state = controller.initial_state(keys, _unit(flat[:window], low, high).T, None, window)
    ticks = steps - window
    record = {
        f.name: np.empty((ticks, r * n), dtype=bool if f.name == "censored" else np.float64) for f in fields(Trajectory)
    }
    lows, highs, capacity = (np.empty((ticks, r * n)) for _ in range(3))
    rules = _Rules(range_growth, grow_after, shrink_after, floor_share, np.zeros(r * n, dtype=np.int64))
    for t in range(ticks):
        native = from_unit(state.action, low, high)
        y_native, _, own, _ = observe(demand[window + t], native.reshape(r, n), resources)
        own = own.ravel()
        y = np.where(own, state.action, np.clip((y_native.ravel() - low) / (high - low), 0.0, 1.0))
        shape = (r, n)
        flags = coupled_flags(own.reshape(shape), resources)
        lifted, censored = impute_served_share(
            y.reshape(shape),
            flags,
            state.action.reshape(shape),
            state.mu.reshape(shape),
            state.sigma.reshape(shape),
            resources,
            ranges=(low.reshape(shape), high.reshape(shape)),
        )
        missing = (
            unobserved(y.reshape(shape), flags, state.action.reshape(shape), resources).ravel() if coupled else None
        )
        observed, censored = (lifted.ravel(), censored.ravel()) if coupled else (y, own)
        for name in DECISION_FIELDS:
            record[name][t] = getattr(state, name)
        record["demand"][t], record["observed"][t], record["censored"][t] = (
            _unit(flat[window + t], low, high),
            observed,
            censored,
        )
        lows[t], highs[t], capacity[t] = low, high, native
        state, low, high, record["reward"][t] = _advance(
            controller, state, observed, censored, None, y_native.ravel(), low, high, rules, missing
        )
    return ReferenceRun(Trajectory(**record), lows, highs, capacity)


@dataclass
class _Rules:
    """The worker's range rules and each row's run of ticks below its floor."""

    range_growth: float
    grow_after: int
    shrink_after: int
    floor_share: float
    below: np.ndarray


def _advance(
    controller: PicRLController,
    state: ControllerState,
    observed: np.ndarray,
    censored: np.ndarray,
    context: np.ndarray | None,
    usage: np.ndarray,
    low: np.ndarray,
    high: np.ndarray,
    rules: _Rules,
    missing: np.ndarray | None = None,
) -> tuple[ControllerState, np.ndarray, np.ndarray, np.ndarray]:
    """One controller step and the worker's range rules on the tick's native ``usage``: the next state, the
    ranges and the transition's rewards."""
    new, transition = controller.step(state, observed, censored, context, missing)
    short = censored if missing is None else censored & ~missing
    new_high = next_high(
        low, high, state.action, short, new.censor_streak, after=rules.grow_after, factor=rules.range_growth
    )
    new_low, rules.below = next_low(
        low,
        usage,
        floor_streak(rules.below, usage, low, censored),
        after=rules.shrink_after,
        share=rules.floor_share,
    )
    if (new_high != high).any() or (new_low != low).any():
        new, low, high = controller.rescale(new, low, high, new_low, new_high), new_low, new_high
    return new, low, high, transition.reward


def _unit(demand: np.ndarray, low: np.ndarray, high: np.ndarray) -> np.ndarray:
    return np.maximum((demand - low) / (high - low), 0.0)


def tripled(workload: Workload, window: int) -> Workload:
    """``workload`` with demand rising to three times its level over 20 ticks, 5 ticks after the warm-up
    window: every service outgrows the range its first window gave it."""
    ramp = np.clip((np.arange(workload.ticks) - window - 5) / 20.0, 0.0, 1.0)[:, None]
    return replace(workload, demand=workload.demand * (1.0 + 2.0 * ramp))


def quietened(workload: Workload, window: int) -> Workload:
    """``workload`` with demand at a tenth of its level for 20 ticks from 5 ticks after the warm-up window (a night:
    every service's usage falls below the floor of its range), then back."""
    t = np.arange(workload.ticks)[:, None]
    night = (t >= window + 5) & (t < window + 25)
    return replace(workload, demand=np.where(night, 0.1 * workload.demand, workload.demand))
