"""From a batch of usage events to controller calls, and from controller outputs to records.

This is the whole translation layer of a worker, free of Kafka so it can be tested alone: the
Faust agent (``stream.worker``) decodes messages, hands them here with the services' stored rows,
and sends back what comes out. All decisions come from the artifact's method, one deployable rule
(``picrl_core.deployable``: PIC-RL's controller by default) stepping every service of a batch at once.

Per service the worker keeps one fixed-size row (:attr:`DecisionEngine.row_dtype`): the rule's
state (its codec's row: ``picrl_core.state_codec`` for PIC-RL), the service's native range ``[low, high]`` and the
ticks it has stayed below the floor, the capacity it decided last, the tick it expects next and its warm-up buffer.

A batch is applied in rounds (each service's first event, then its second, ...), each round in the
stages of the controller (:meth:`DecisionEngine._process`):

1. check: refuse the events that cannot be applied (``stream.refusals``), skip redeliveries, hold the
   ticks refused for their value;
2. warm up: record the ticks of services still filling their window, and make the first decisions of
   those whose window is now full;
3. step the others: carry their state over to an operator's new range (``stream.ranges``), observe the
   tick in each service's range, one controller step, grow the ranges the tick showed outgrown and lower the
   floors its usage stayed below;
4. store the new states in the rows, with the operator's bounds on the capacity;
5. emit the actions and the replay transitions (``stream.outputs``).

Cold start (a service seen for the first time): the worker observes its first ``W`` ticks (the
predictor window) before PIC-RL acts. During that warm-up it emits ``phase="warmup"`` actions that
keep the capacity in force, raised by ``warmup_bump`` after a shortage so the window sees the real
demand. After the ``W``-th tick the range is set (``stream.ranges``: from the operator, the model
artifact, or the window widened by ``headroom`` on each side), the window becomes the controller's
history (Algorithm 1, line 17) and the first PIC-RL decision is emitted for the next tick. A range
that a service outgrows grows, a floor it stays below comes down, and an operator's range is followed
(``stream.ranges``); each change is reported in ``BatchOutcome.ranges``.

A tick's record refused for its value rather than its identity (a :class:`BadValue` from the
decoder, or an event missing a context channel the model reads) is dead-lettered and answered with a
hold: an action for the next tick with ``phase="hold"`` that keeps the capacity in force (and carries
the last decision's breakdown), so a scheduler waiting on that tick is not left without an answer.
The tick then counts as missing: the controller's state does not move (the next event moves its
clock), and a later record for the same tick is a ``duplicate_tick``. Only a tick the service may
still report (the expected one or a later one within ``max_tick_gap``) is held, once, and only for
services the worker already holds (there is no capacity in force to hold for a new one).

Services provisioned several resources decide one row per resource (``stream.resource_rows``).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import cast

import numpy as np

from picrl_core.artifact import ModelArtifact
from picrl_core.controller_state import ControllerState
from picrl_core.deployable import RuleState, deployed_rule
from picrl_core.noise import service_key
from picrl_core.policy import PolicyNetwork
from picrl_core.scaling import from_unit, to_unit
from picrl_core.series import MinMaxScaler
from stream.batch import REFUSAL_REASONS, BadValue, BatchOutcome, Incoming, RangeChange, Refusal, RefusalReason
from stream.engine_settings import EngineSettings, Scaling, ServiceOverride
from stream.outputs import control_actions, hold_action, replay_transitions, warmup_action
from stream.ranges import RangeKeeper
from stream.records import ResourceUsageEvent, UsageEvent
from stream.refusals import beyond_cap, check_tick
from stream.resource_rows import couple, gather, row_keys, split_records, split_rows

# the engine and the types of its input, output and settings, for the worker and picrl.settings
__all__ = [
    "REFUSAL_REASONS",
    "BadValue",
    "BatchOutcome",
    "DecisionEngine",
    "EngineSettings",
    "Incoming",
    "RangeChange",
    "Refusal",
    "RefusalReason",
    "Scaling",
    "ServiceOverride",
]

Queued = tuple[int, Incoming]  # an event and its service's place in the batch's rows
DEFAULT_SETTINGS = EngineSettings()


def _one_resource(event: UsageEvent | ResourceUsageEvent) -> UsageEvent:
    """The event of one row: one resource's usage. A schema-2 record (several resources) has none, so a
    row engine fails on it (the intake sets it aside as ``internal_error``); a multi-resource engine hands
    its rows one resource each (``stream.resource_rows``)."""
    if isinstance(event, ResourceUsageEvent):
        raise TypeError(f"a schema-2 usage record of {event.service!r} reached an engine of one resource")
    return event


@dataclass(frozen=True)
class _Observation:
    """One step's input to the controller: the normalised observations ``y`` and flags (coupled across a
    service's resources), the rows a killed pod left unobserved (None: one resource) and the scaled context."""

    y: np.ndarray
    censored: np.ndarray
    missing: np.ndarray | None
    context: np.ndarray | None

    @property
    def short(self) -> np.ndarray:
        """The ticks seen short (a killed tick is no sign of an outgrown range)."""
        return self.censored if self.missing is None else self.censored & ~self.missing


class DecisionEngine:
    """Applies batches of usage events to per-service rows with one vectorised controller."""

    def __init__(
        self, artifact: ModelArtifact, settings: EngineSettings = DEFAULT_SETTINGS, policy_version: int = 0
    ) -> None:
        config = artifact.config
        self.settings = settings
        self.config = config
        self.rule = deployed_rule(artifact, settings.method)  # refuses an artifact of another method
        if settings.resources and not self.rule.learns_policy:
            raise ValueError(f"{self.rule.method} decides one resource per service; only PIC-RL couples several")
        self.policy_version = policy_version
        self.window = config.predictor.window
        channels = config.predictor.context_channels
        self.context_names: tuple[str, ...] = tuple(artifact.scaling.get("context_names", ()))
        if len(self.context_names) != channels:
            raise ValueError(
                f"the model has {channels} context channel(s) but names {list(self.context_names)}; "
                "retrain it with this picrl version"
            )
        scalers = [MinMaxScaler.from_dict(s) for s in artifact.scaling.get("context", [])]
        self._context_low = np.array([s.low for s in scalers], dtype=np.float64)
        self._context_high = np.array([s.high for s in scalers], dtype=np.float64)
        series = artifact.scaling.get("series")
        self.ranges = RangeKeeper(settings, MinMaxScaler.from_dict(series) if series else None, self.rule.rescale)
        self.resources = settings.resources
        self.codec = self.rule.codec  # PIC-RL's: the incremental predictor's memory rides in the row
        self.row_dtype = np.dtype(
            [
                ("core", self.codec.dtype),
                ("low", "<f8"),
                ("high", "<f8"),
                ("floor_streak", "<i4"),  # ticks in a row seen below the floor (stream.ranges)
                ("capacity", "<f8"),
                ("expected_tick", "<i8"),
                ("policy_version", "<i8"),
                ("last_offset", "<i8"),
                ("warm_count", "<i8"),
                ("warm_usage", "<f8", (self.window,)),
                ("warm_context", "<f8", (self.window, channels)),
            ]
        )

    @property
    def row_bytes(self) -> int:
        """The bytes a service's table row holds (one row per resource, in :attr:`resources` order)."""
        return self.row_dtype.itemsize * max(1, len(self.resources))

    def row_keys(self, service: str) -> list[str]:
        """The keys of a service's controller rows: the service itself, or ``<service>/<resource>`` for each of
        :attr:`resources` (the rows' replay transitions and range changes carry these)."""
        return row_keys(service, self.resources)

    def set_policy(self, policy: PolicyNetwork, version: int) -> None:
        """Act with ``policy`` (stamped ``version``) from the next decision on."""
        self.rule.set_policy(policy)
        self.policy_version = version

    def decode_row(self, raw: bytes) -> np.ndarray:
        """A service's stored row (bytes) as a structured array of one element per resource (one for a
        single-resource engine); ValueError when it is not one."""
        if len(raw) != self.row_bytes:
            raise ValueError(f"stored state has {len(raw)} bytes, this model's rows have {self.row_bytes}")
        return np.frombuffer(raw, dtype=self.row_dtype).copy()

    def process(
        self, batch: Sequence[Incoming | BadValue], stored: Mapping[str, bytes | None], services_held: int = 0
    ) -> BatchOutcome:
        """Apply ``batch`` (in arrival order) to the services' ``stored`` rows (None: first seen);
        ``services_held`` is how many services the worker already keeps (for ``max_services``)."""
        room = None if self.settings.max_services is None else self.settings.max_services - services_held
        if self.resources:
            return self._process_resources(batch, stored, room)
        return self._process(batch, stored, room)

    def _process_resources(
        self, batch: Sequence[Incoming | BadValue], stored: Mapping[str, bytes | None], room: int | None
    ) -> BatchOutcome:
        """:meth:`process` for services provisioned :attr:`resources`: each record becomes one row per resource,
        decided together (the coupled flags in :meth:`_observe`), and the rows' outputs are gathered back into one
        record per service and tick (``stream.resource_rows``)."""
        parts, refused = split_records(batch, self.resources)
        rows = split_rows(stored, self.resources, self.row_dtype.itemsize)
        inner = self._process(parts, rows, None if room is None else room * len(self.resources))
        return gather(inner, refused, self.resources)

    # ------------------------------------------------------------------ a batch, round by round

    def _process(
        self, batch: Sequence[Incoming | BadValue], stored: Mapping[str, bytes | None], room: int | None
    ) -> BatchOutcome:
        """:meth:`process` on one row per key, ``room`` new rows allowed (None: any number)."""
        outcome = BatchOutcome()
        queues: dict[str, list[Incoming | BadValue]] = {}
        for item in batch:
            queues.setdefault(item.service, []).append(item)
        services = list(queues)
        rows, known = self._load(services, stored)
        now = time.time()
        for round_ in range(max(map(len, queues.values()), default=0)):
            present = [(i, queues[s][round_]) for i, s in enumerate(services) if round_ < len(queues[s])]
            warming, controlled, room = self._admit(rows, known, present, room, outcome, now)
            ready = [(i, item) for i, item in warming if self._warm(rows[i : i + 1], item, outcome, now)]
            if ready:
                self._first_decisions(rows, ready, outcome, now)
            if controlled:
                self._step(rows, controlled, outcome, now)
        outcome.rows = {service: rows[i : i + 1].tobytes() for i, service in enumerate(services) if known[i]}
        return outcome

    def _load(self, services: list[str], stored: Mapping[str, bytes | None]) -> tuple[np.ndarray, np.ndarray]:
        """The services' rows (zeros for a service first seen) and which of them the worker holds."""
        rows = np.zeros(len(services), dtype=self.row_dtype)
        known = np.zeros(len(services), dtype=bool)
        held = [(i, raw) for i, raw in enumerate(map(stored.get, services)) if raw is not None]
        if held:
            if any(len(raw) != self.row_dtype.itemsize for _, raw in held):
                raise ValueError(
                    f"stored state has {sorted({len(raw) for _, raw in held})} bytes, this model's "
                    f"rows have {self.row_bytes}"
                )
            index = [i for i, _ in held]
            rows[index] = np.frombuffer(b"".join(raw for _, raw in held), dtype=self.row_dtype)  # in one pass
            known[index] = True
        return rows, known

    # ------------------------------------------------------------------ stage 1: check

    def _admit(
        self,
        rows: np.ndarray,
        known: np.ndarray,
        present: list[tuple[int, Incoming | BadValue]],
        room: int | None,
        outcome: BatchOutcome,
        now: float,
    ) -> tuple[list[Queued], list[Queued], int | None]:
        """A round's events that are applied, as warm-up ticks and controlled ticks; the others are refused or
        skipped, and a held service's tick refused for its value is held. A new service starts its warm-up while
        there is ``room`` (None: no cap); returns the room left."""
        warming: list[Queued] = []
        controlled: list[Queued] = []
        for i, item in present:
            if isinstance(item, BadValue):
                if known[i]:
                    self._hold(rows[i : i + 1], item.service, item.tick, item.offset, 0.0, outcome, now)
                continue
            if not known[i]:
                if room is not None and room <= 0:
                    outcome.refused.append(beyond_cap(item, self.settings.max_services))
                    continue
                room = None if room is None else room - 1
                self._start_warmup(rows[i : i + 1], item)
                known[i] = True
            if self._accepted(rows[i : i + 1], item, outcome, now):
                (warming if rows[i]["warm_count"] < self.window else controlled).append((i, item))
        return warming, controlled, room

    def _accepted(self, row: np.ndarray, item: Incoming, outcome: BatchOutcome, now: float) -> bool:
        """Whether ``item`` follows its service's ``row`` (``stream.refusals``); a refusal goes to ``outcome``,
        and a tick refused for its value (a missing context channel) is held."""
        verdict = check_tick(row[0], item, self.settings.max_tick_gap, self.context_names)
        expected = int(row["expected_tick"][0])
        if verdict is None and item.event.tick > expected:  # ticks that never came: a gap moves the clock
            outcome.missed[item.service] = (expected, item.event.tick)
        if verdict == "redelivered":
            outcome.redelivered += 1
        elif verdict is not None:
            outcome.refused.append(verdict)
            if verdict.reason == "missing_context":  # about the value: the tick is still answered
                self._hold(row, item.service, item.event.tick, item.offset, item.event.produced_at, outcome, now)
        return verdict is None

    def _hold(
        self,
        row: np.ndarray,
        service: str,
        tick: int,
        offset: int,
        produced_at: float,
        outcome: BatchOutcome,
        now: float,
    ) -> None:
        """Answer the refused record of ``tick`` with the capacity in force for ``tick + 1``; the tick is missed."""
        expected = int(row["expected_tick"][0])
        if not expected <= tick <= expected + self.settings.max_tick_gap:
            return  # a tick already applied or held (or a redelivery), or one the engine would refuse anyway
        row["expected_tick"] = tick + 1
        row["last_offset"] = offset
        outcome.actions.append(
            hold_action(
                row[0], service, tick, produced_at, self.settings.advisory, self.config.ablation.use_k_sigma, now
            )
        )

    # ------------------------------------------------------------------ stage 2: warm-up and first decisions

    def _start_warmup(self, row: np.ndarray, item: Incoming) -> None:
        row["core"]["keys"] = service_key(item.event.service)
        row["expected_tick"] = item.event.tick
        row["last_offset"] = -1
        row["policy_version"] = self.policy_version

    def _warm(self, row: np.ndarray, item: Incoming, outcome: BatchOutcome, now: float) -> bool:
        """Record a warm-up tick; emit the warm-up action unless the window is now full (True)."""
        event = _one_resource(item.event)
        count = int(row["warm_count"][0])
        row["warm_usage"][0, count] = event.usage
        row["warm_context"][0, count] = self._context_vector(event)
        row["warm_count"] = count + 1
        row["last_offset"] = item.offset
        if count + 1 == self.window:
            return True
        capacity = event.capacity * (1.0 + self.settings.warmup_bump) if event.censored else event.capacity
        override = self.settings.overrides.get(event.service)
        clipped = "none"
        if override is not None and override.apply(capacity) != capacity:
            capacity, clipped = override.apply(capacity), "override"
        row["capacity"] = capacity
        row["expected_tick"] = event.tick + 1
        outcome.actions.append(
            warmup_action(event, capacity, clipped, self.policy_version, self.settings.advisory, now)
        )
        return False

    def _first_decisions(self, rows: np.ndarray, ready: list[Queued], outcome: BatchOutcome, now: float) -> None:
        """The first ranges, the windows as the controller's history (Algorithm 1, line 17), the first decisions."""
        index = np.array([i for i, _ in ready])
        items = [item for _, item in ready]
        sub = rows[index]
        low, high = self.ranges.first(sub["warm_usage"], items)
        history = to_unit(sub["warm_usage"], low[:, None], high[:, None])
        history_context = self._scale_context(sub["warm_context"]) if self.context_names else None
        ticks = np.array([item.event.tick for item in items], dtype=np.int64)
        state = self.rule.initial_state(sub["core"]["keys"], history, low, high, history_context, ticks + 1)
        sub["low"], sub["high"] = low, high
        clipped = self._store(sub, state, items)
        rows[index] = sub
        self._emit_actions(outcome, items, state, sub["capacity"], clipped, now)

    # ------------------------------------------------------------------ stage 3: ranges, observe, step

    def _step(self, rows: np.ndarray, controlled: list[Queued], outcome: BatchOutcome, now: float) -> None:
        """One controller step of the services past their warm-up, through every stage after the check."""
        index = np.array([i for i, _ in controlled])
        items = [item for _, item in controlled]
        sub = rows[index]
        state = self.ranges.follow_operator(sub, self.codec.unpack(sub["core"]), items, outcome.ranges)
        seen = self._observe(sub, state, items)
        new, transition = self.rule.step(state, seen.y, seen.censored, seen.context, seen.missing)
        usage = np.array([_one_resource(item.event).usage for item in items])
        new = self.ranges.move(sub, state, new, seen.short, seen.censored, usage, items, outcome.ranges)
        behaviour_versions = sub["policy_version"].copy()
        clipped = self._store(sub, new, items)
        rows[index] = sub
        self._emit_actions(outcome, items, new, sub["capacity"], clipped, now)
        if transition is not None:  # a rule that learns a policy: its replay
            outcome.transitions += replay_transitions(items, state, new, transition, seen.y, behaviour_versions)

    def _observe(self, sub: np.ndarray, state: RuleState, items: list[Incoming]) -> _Observation:
        """The tick's observations in each service's range: ``y_t = min(d_t, a_t)``, or ``a_t`` when censored
        (section 2). ``state`` moves to the action in force and to the events' tick (a gap moves the clock)."""
        low, high = sub["low"].copy(), sub["high"].copy()
        events = [_one_resource(item.event) for item in items]
        capacity = np.array([event.capacity for event in events])
        usage = np.array([event.usage for event in events])
        censored = np.array([event.censored for event in events])
        # The capacity in force is the one decided unless the scheduler applied another.
        state.action = np.where(capacity == sub["capacity"], state.action, to_unit(capacity, low, high))
        state.tick = np.array([event.tick for event in events], dtype=np.int64)
        y = np.where(censored, state.action, to_unit(usage, low, high))  # censored: y_t = a_t exactly
        missing = None
        if self.resources:
            y, censored, missing = couple(items, cast(ControllerState, state), y, censored, low, high, self.resources)
        context = (
            self._scale_context(np.stack([self._context_vector(event) for event in events]))
            if self.context_names
            else None
        )
        return _Observation(y, censored, missing, context)

    def _context_vector(self, event: UsageEvent) -> np.ndarray:
        context = event.context or {}
        return np.array([context[name] for name in self.context_names], dtype=np.float64)

    def _scale_context(self, context: np.ndarray) -> np.ndarray:
        return to_unit(context, self._context_low, self._context_high)

    # ------------------------------------------------------------------ stages 4 and 5: store, emit

    def _store(self, sub: np.ndarray, state: RuleState, items: list[Incoming]) -> np.ndarray:
        """Write the new states into ``sub`` (native capacities in its ranges, within the operator's bounds);
        returns a per-service clipping label for the actions."""
        low, high = sub["low"].copy(), sub["high"].copy()
        raw = self.rule.unclipped(state)
        clipped = np.where(raw < 0.0, "low", np.where(raw > 1.0, "high", "none")).astype(object)
        capacity = from_unit(state.action, low, high)
        for j, item in enumerate(items):
            override = self.settings.overrides.get(item.event.service)
            if override is not None and override.apply(capacity[j]) != capacity[j]:
                # the capacity an operator imposes is the action in force (learning sees what really ran)
                capacity[j] = override.apply(capacity[j])
                state.action[j] = to_unit(capacity[j], low[j], high[j])
                clipped[j] = "override"
        sub["core"] = self.codec.pack(state)
        sub["last_offset"] = [item.offset for item in items]
        sub["capacity"] = capacity
        sub["expected_tick"] = state.tick
        sub["policy_version"] = self.policy_version
        return clipped

    def _emit_actions(
        self,
        outcome: BatchOutcome,
        items: list[Incoming],
        state: RuleState,
        capacity: np.ndarray,
        clipped: np.ndarray,
        now: float,
    ) -> None:
        outcome.actions += control_actions(
            items,
            state,
            capacity,
            clipped,
            self.policy_version,
            self.settings.advisory,
            self.config.ablation.use_k_sigma,
            now,
            self.rule.choice(state),
        )
