"""From a batch of usage events to controller calls, and from controller outputs to records.

This is the whole translation layer of a worker, free of Kafka so it can be tested alone: the
Faust agent (``stream.worker``) decodes messages, hands them here with the services' stored rows,
and sends back what comes out. All decisions come from :class:`picrl_core.PicRLController`.

Per service the worker keeps one fixed-size row (:attr:`DecisionEngine.row_dtype`): the controller
state (``picrl_core.state_codec``), the service's native range ``[low, high]``, the capacity it
decided last, the tick it expects next and its warm-up buffer.

Cold start (a service seen for the first time): the worker observes its first ``W`` ticks (the
predictor window) before PIC-RL acts. During that warm-up it emits ``phase="warmup"`` actions that
keep the capacity in force, raised by ``warmup_bump`` after a shortage so the window sees the real
demand. After the ``W``-th tick the range is set (from the model artifact, or from the window
widened by ``headroom`` on each side), the window becomes the controller's history (Algorithm 1,
line 17) and the first PIC-RL decision is emitted for the next tick.

Ranges that grow: capacities stay within the service's range, so a service that outgrows it would be
short for ever with the capacity pinned at the top. When a tick is short with the capacity in force at
the top of the range and makes a run of ``grow_after`` short ticks, the range grows upward to
``range_growth`` times its span (``picrl_core.scaling.outgrown`` and ``grown_high``) and the controller
state is carried over to it (``rescale_state``: same native history, prediction, calibrator offsets
and capacity in force), so the next decisions can go above the old top. An operator can set a
service's range instead (``ServiceOverride.low``/``high``): the state is carried over to it at the
service's next event and that range never grows. Each change is reported in ``BatchOutcome.ranges``.

A tick's record refused for its value rather than its identity (a :class:`BadValue` from the
decoder, or an event missing a context channel the model reads) is dead-lettered and answered with a
hold: an action for the next tick with ``phase="hold"`` that keeps the capacity in force (and carries
the last decision's breakdown), so a scheduler waiting on that tick is not left without an answer.
The tick then counts as missing: the controller's state does not move (the next event moves its
clock), and a later record for the same tick is a ``duplicate_tick``. Only a tick the service may
still report (the expected one or a later one within ``max_tick_gap``) is held, once, and only for
services the worker already holds (there is no capacity in force to hold for a new one).
"""
from __future__ import annotations

import copy
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, get_args

import numpy as np

from picrl_core.artifact import ModelArtifact
from picrl_core.controller import ControllerState, PicRLController, Transition
from picrl_core.noise import service_key
from picrl_core.policy import PolicyNetwork
from picrl_core.resources import Resource, check_resources, coupled_flags, impute_served_share, unobserved
from picrl_core.scaling import from_unit, grown_high, outgrown, rescale_state, to_unit, window_range
from picrl_core.series import MinMaxScaler
from picrl_core.state_codec import StateCodec
from stream.records import (MAX_ID_LENGTH, Action, ResourceAction, ResourceDecision, ResourceUsageEvent,
                            TransitionRecord, UsageEvent)

# Why the worker refuses a well-formed event (on top of the decoder's reasons in stream.records).
RefusalReason = Literal["duplicate_tick", "tick_out_of_range", "missing_context", "service_limit",
                        "unknown_resource", "missing_resource", "resource_id_too_long"]
REFUSAL_REASONS: frozenset[str] = frozenset(get_args(RefusalReason))

Scaling = Literal["window", "artifact"]


@dataclass(frozen=True)
class ServiceOverride:
    """An operator's bounds on one service's capacity (native unit), or a frozen capacity."""

    min_capacity: float | None = None
    max_capacity: float | None = None
    freeze: float | None = None  # hold exactly this capacity; PIC-RL keeps learning but does not act
    low: float | None = None  # the service's range [low, high], set by the operator (it never grows)
    high: float | None = None

    def __post_init__(self) -> None:
        values = [v for v in (self.min_capacity, self.max_capacity, self.freeze, self.low, self.high) if v is not None]
        if any(not np.isfinite(v) or v < 0 for v in values):
            raise ValueError("override capacities must be finite and >= 0")
        if self.min_capacity is not None and self.max_capacity is not None and self.min_capacity > self.max_capacity:
            raise ValueError(f"min_capacity {self.min_capacity} > max_capacity {self.max_capacity}")
        if (self.low is None) != (self.high is None) or (self.low is not None and self.low >= self.high):
            raise ValueError(f"a range needs both low and high with low < high; got [{self.low}, {self.high}]")

    def apply(self, capacity: float) -> float:
        if self.freeze is not None:
            return self.freeze
        low = -np.inf if self.min_capacity is None else self.min_capacity
        high = np.inf if self.max_capacity is None else self.max_capacity
        return float(min(max(capacity, low), high))


@dataclass(frozen=True)
class EngineSettings:
    """How the worker scales services and treats their first ticks."""

    scaling: Scaling = "window"  # per-service range from the first window, or the artifact's range for all
    headroom: float = 0.5  # "window" scaling: range widened by this many spans on each side
    warmup_bump: float = 0.5  # warm-up: capacity raised by this fraction after a shortage
    max_tick_gap: int = 1_000  # a tick further ahead or behind than this is refused (lost clock, bad producer)
    max_services: int | None = None  # new services beyond this many are refused (None: no cap)
    advisory: bool = False  # label actions advisory (recommend mode)
    overrides: Mapping[str, ServiceOverride] = field(default_factory=dict)  # per service id
    range_growth: float = 2.0  # an outgrown range grows to this many times its span (1: ranges never grow)
    grow_after: int = 3  # short ticks in a row, the last at the top of the range, before it grows
    # several resources per service (picrl_core.resources): usage records carry a ``resources`` map (schema 2) and
    # each resource is a row ``<service>/<resource>`` (the key of its overrides and of its replay transitions)
    resources: tuple[Resource, ...] = ()

    def __post_init__(self) -> None:
        if self.resources:
            check_resources(self.resources)
        if self.scaling not in get_args(Scaling):
            raise ValueError(f"scaling must be one of {get_args(Scaling)}; got {self.scaling!r}")
        if self.headroom < 0 or self.warmup_bump < 0 or self.max_tick_gap < 1:
            raise ValueError("headroom and warmup_bump must be >= 0 and max_tick_gap >= 1")
        if self.range_growth < 1 or self.grow_after < 1:
            raise ValueError("range_growth must be >= 1 (1: never) and grow_after >= 1")
        if self.max_services is not None and self.max_services < 1:
            raise ValueError("max_services must be >= 1 (or None for no cap)")


@dataclass(frozen=True)
class Incoming:
    """A decoded usage event (one resource, or several: a schema-2 record) and where it came from."""

    event: UsageEvent | ResourceUsageEvent
    partition: int
    offset: int

    @property
    def service(self) -> str:
        return self.event.service


@dataclass(frozen=True)
class _Part(Incoming):
    """One resource's row of a schema-2 usage record (``event`` is that resource's observation, keyed
    ``<service>/<resource>``): the record it came from and the resource's place in the engine's list."""

    origin: Incoming | None = None
    parent: str = ""
    resource: int = 0


@dataclass(frozen=True)
class BadValue:
    """A usage record refused for its values (already a dead letter) whose service and tick are valid."""

    service: str
    tick: int
    partition: int
    offset: int


@dataclass(frozen=True)
class Refusal:
    incoming: Incoming
    reason: RefusalReason
    detail: str


@dataclass(frozen=True)
class RangeChange:
    """A service's range moved from ``[low, high]`` to ``[new_low, new_high]`` at ``tick``."""

    service: str
    tick: int
    reason: Literal["outgrown", "operator"]
    low: float
    high: float
    new_low: float
    new_high: float


@dataclass
class BatchOutcome:
    """What one batch produced: updated rows per service, records to send, events refused."""

    rows: dict[str, bytes] = field(default_factory=dict)
    actions: list[Action] = field(default_factory=list)
    transitions: list[TransitionRecord] = field(default_factory=list)
    refused: list[Refusal] = field(default_factory=list)
    redelivered: int = 0  # events already applied (at-least-once redelivery), skipped silently
    ranges: list[RangeChange] = field(default_factory=list)


class DecisionEngine:
    """Applies batches of usage events to per-service rows with one vectorised controller."""

    def __init__(self, artifact: ModelArtifact, settings: EngineSettings = EngineSettings(),
                 policy_version: int = 0) -> None:
        config = artifact.config
        self.settings = settings
        self.config = config
        self.controller = PicRLController(artifact.predictor, copy.deepcopy(artifact.policy), config)
        self.policy_version = policy_version
        self.window = config.predictor.window
        channels = config.predictor.context_channels
        self.context_names: tuple[str, ...] = tuple(artifact.scaling.get("context_names", ()))
        if len(self.context_names) != channels:
            raise ValueError(f"the model has {channels} context channel(s) but names {list(self.context_names)}; "
                             "retrain it with this picrl version")
        scalers = [MinMaxScaler.from_dict(s) for s in artifact.scaling.get("context", [])]
        self._context_low = np.array([s.low for s in scalers], dtype=np.float64)
        self._context_high = np.array([s.high for s in scalers], dtype=np.float64)
        series = artifact.scaling.get("series")
        if settings.scaling == "artifact" and not series:
            raise ValueError("scaling 'artifact' needs a model whose artifact records its series range")
        self._series = MinMaxScaler.from_dict(series) if series else None
        self.resources = settings.resources
        self.codec = StateCodec.for_config(config)  # the incremental predictor's memory rides in the row
        self.row_dtype = np.dtype([
            ("core", self.codec.dtype), ("low", "<f8"), ("high", "<f8"), ("capacity", "<f8"),
            ("expected_tick", "<i8"), ("policy_version", "<i8"), ("last_offset", "<i8"),
            ("warm_count", "<i8"), ("warm_usage", "<f8", (self.window,)),
            ("warm_context", "<f8", (self.window, channels)),
        ])

    @property
    def row_bytes(self) -> int:
        """The bytes a service's table row holds (one row per resource, in :attr:`resources` order)."""
        return self.row_dtype.itemsize * max(1, len(self.resources))

    def row_keys(self, service: str) -> list[str]:
        """The keys of a service's controller rows: the service itself, or ``<service>/<resource>`` for each of
        :attr:`resources` (the rows' replay transitions and range changes carry these)."""
        return [f"{service}/{r.name}" for r in self.resources] if self.resources else [service]

    def set_policy(self, policy: PolicyNetwork, version: int) -> None:
        """Act with ``policy`` (stamped ``version``) from the next decision on."""
        self.controller.set_policy(policy)
        self.policy_version = version

    def decode_row(self, raw: bytes) -> np.ndarray:
        """A service's stored row (bytes) as a structured array of one element per resource (one for a
        single-resource engine); ValueError when it is not one."""
        if len(raw) != self.row_bytes:
            raise ValueError(f"stored state has {len(raw)} bytes, this model's rows have {self.row_bytes}")
        return np.frombuffer(raw, dtype=self.row_dtype).copy()

    def process(self, batch: Sequence[Incoming | BadValue], stored: Mapping[str, bytes | None],
                services_held: int = 0) -> BatchOutcome:
        """Apply ``batch`` (in arrival order) to the services' ``stored`` rows (None: first seen);
        ``services_held`` is how many services the worker already keeps (for ``max_services``)."""
        room = None if self.settings.max_services is None else self.settings.max_services - services_held
        if self.resources:
            return self._process_resources(batch, stored, room)
        return self._process(batch, stored, room)

    def _process(self, batch: Sequence[Incoming | BadValue], stored: Mapping[str, bytes | None],
                 room: int | None) -> BatchOutcome:
        """:meth:`process` on one row per key, ``room`` new rows allowed (None: any number)."""
        outcome = BatchOutcome()
        queues: dict[str, list[Incoming | BadValue]] = {}
        for item in batch:
            queues.setdefault(item.service, []).append(item)
        services = list(queues)
        rows = np.zeros(len(services), dtype=self.row_dtype)
        known = np.zeros(len(services), dtype=bool)
        held = [(i, raw) for i, raw in enumerate(map(stored.get, services)) if raw is not None]
        if held:
            index = [i for i, _ in held]
            if all(len(raw) == self.row_dtype.itemsize for _, raw in held):  # all the rows in one pass
                rows[index] = np.frombuffer(b"".join(raw for _, raw in held), dtype=self.row_dtype)
            else:
                raise ValueError(f"stored state has {sorted({len(raw) for _, raw in held})} bytes, this model's "
                                 f"rows have {self.row_bytes}")
            known[index] = True
        now = time.time()
        for round_ in range(max(map(len, queues.values()), default=0)):
            present = [(i, queues[s][round_]) for i, s in enumerate(services) if round_ < len(queues[s])]
            warming, controlled, ready = [], [], []
            for i, item in present:
                if isinstance(item, BadValue):
                    if known[i]:
                        self._hold(rows[i:i + 1], item.service, item.tick, item.offset, 0.0, outcome, now)
                    continue
                if not known[i]:
                    if room is not None and room <= 0:
                        outcome.refused.append(Refusal(item, "service_limit", f"new service {item.event.service!r} "
                                                       f"beyond the cap of {self.settings.max_services} services"))
                        continue
                    room = None if room is None else room - 1
                    self._start_warmup(rows[i:i + 1], item)
                    known[i] = True
                refusal = self._check(rows[i], item)
                if refusal == "redelivered":
                    outcome.redelivered += 1
                elif refusal is not None:
                    outcome.refused.append(refusal)
                    if refusal.reason == "missing_context":  # about the value: the tick is still answered
                        self._hold(rows[i:i + 1], item.service, item.event.tick, item.offset,
                                   item.event.produced_at, outcome, now)
                elif rows[i]["warm_count"] < self.window:
                    warming.append((i, item))
                else:
                    controlled.append((i, item))
            for i, item in warming:
                if self._warm(rows[i:i + 1], item, outcome, now):
                    ready.append((i, item))
            if ready:
                self._first_decisions(rows, ready, outcome, now)
            if controlled:
                self._step(rows, controlled, outcome, now)
        outcome.rows = {service: rows[i:i + 1].tobytes() for i, service in enumerate(services) if known[i]}
        return outcome

    # ------------------------------------------------------------------ several resources per service

    def _process_resources(self, batch: Sequence[Incoming | BadValue], stored: Mapping[str, bytes | None],
                           room: int | None) -> BatchOutcome:
        """:meth:`process` for services provisioned :attr:`resources`: each record becomes one row per resource
        (``<service>/<resource>``, moving in lock-step: same ticks, same offsets), decided together (the coupled
        flags in :meth:`_step`), and the rows' outputs are gathered back into one record per service and tick."""
        names = [r.name for r in self.resources]
        parts: list[Incoming | BadValue] = []
        refused: list[Refusal] = []
        for item in batch:
            if isinstance(item, BadValue):
                parts += [BadValue(key, item.tick, item.partition, item.offset) for key in self.row_keys(item.service)]
                continue
            refusal = self._check_resources(item, names)
            if refusal is not None:
                refused.append(refusal)
                continue
            event = item.event
            assert isinstance(event, ResourceUsageEvent)
            for r, (name, key) in enumerate(zip(names, self.row_keys(event.service))):
                usage = event.resources[name]
                parts.append(_Part(UsageEvent(key, event.tick, usage.usage, usage.censored,
                                              usage.capacity, event.context, event.produced_at),
                                   item.partition, item.offset, origin=item, parent=event.service, resource=r))
        width = self.row_dtype.itemsize
        split: dict[str, bytes | None] = {}
        for service, raw in stored.items():
            if raw is not None and len(raw) != self.row_bytes:
                raise ValueError(f"stored state has {len(raw)} bytes, this model's rows have {self.row_bytes}")
            for r, key in enumerate(self.row_keys(service)):
                split[key] = None if raw is None else raw[r * width:(r + 1) * width]
        inner = self._process(parts, split, None if room is None else room * len(names))
        return self._gather(inner, refused)

    def _check_resources(self, item: Incoming, names: list[str]) -> Refusal | None:
        """Why a record cannot be decided as this engine's resources (None: it can)."""
        event = item.event
        given = list(event.resources) if isinstance(event, ResourceUsageEvent) else []
        if not given:
            return Refusal(item, "missing_resource", f"{event.service!r} sent a single-resource record (schema 1); "
                                                     f"this worker decides {names} per service (schema 2)")
        if set(given) - set(names):
            return Refusal(item, "unknown_resource", f"resource(s) {sorted(set(given) - set(names))} of "
                                                     f"{event.service!r}: this worker decides {names}")
        if set(names) - set(given):
            return Refusal(item, "missing_resource", f"resource(s) {sorted(set(names) - set(given))} absent from "
                                                     f"{event.service!r}'s record; the model decides {names}")
        if len(event.service) + 1 + max(map(len, names)) > MAX_ID_LENGTH:
            return Refusal(item, "resource_id_too_long", f"{event.service[:40]!r}...: a resource's row id "
                                                         f"<service>/<resource> must fit {MAX_ID_LENGTH} characters")
        return None

    def _gather(self, inner: BatchOutcome, refused: list[Refusal]) -> BatchOutcome:
        """One output per service and tick from the resources' rows: the table row (the rows in resource
        order), one :class:`ResourceAction`, each refusal once; transitions and range changes stay per row."""
        names = [r.name for r in self.resources]
        outcome = BatchOutcome(transitions=inner.transitions, ranges=inner.ranges,
                               redelivered=inner.redelivered // len(names))
        for service in dict.fromkeys(key.rpartition("/")[0] for key in inner.rows):
            keys = self.row_keys(service)
            if all(key in inner.rows for key in keys):
                outcome.rows[service] = b"".join(inner.rows[key] for key in keys)
        seen: set[int] = set()
        outcome.refused = refused
        for refusal in inner.refused:
            origin = refusal.incoming.origin if isinstance(refusal.incoming, _Part) else refusal.incoming
            if id(origin) not in seen:
                seen.add(id(origin))
                outcome.refused.append(Refusal(origin, refusal.reason, refusal.detail.replace(
                    f"{refusal.incoming.service!r}", f"{origin.service!r}")))
        grouped: dict[tuple[str, int], dict[str, Action]] = {}
        for action in inner.actions:
            service, _, name = action.service.rpartition("/")
            grouped.setdefault((service, action.tick), {})[name] = action
        for (service, tick), parts in grouped.items():
            first = next(iter(parts.values()))
            outcome.actions.append(ResourceAction(
                service, tick, {name: ResourceDecision(a.capacity, a.capacity_norm, a.mu, a.sigma, a.k, a.eta,
                                                       a.margin, a.bias, a.censor_streak, a.k_sigma, a.clipped,
                                                       a.escape)
                                for name, a in sorted(parts.items(), key=lambda kv: names.index(kv[0]))},
                first.policy_version, first.advisory, first.decided_at, first.source_produced_at, first.phase))
        return outcome

    def _couple(self, items: list[Incoming], state: ControllerState, y: np.ndarray, own: np.ndarray,
                low: np.ndarray, high: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The observations and flags a service's resources learn from (``picrl_core.resources``): a hard
        resource that ran short censors every resource of the tick (:func:`coupled_flags`), and behind it each
        soft observation is lifted by the served share the forecast expects (:func:`impute_served_share`); and
        which rows went unobserved (a hard shortage that killed the pod, :func:`unobserved`)."""
        column: dict[str, int] = {}
        groups = np.empty((len(self.resources), len(items) // len(self.resources)), dtype=np.int64)
        for j, item in enumerate(items):
            assert isinstance(item, _Part)  # the rows of one record move together: all are here
            groups[item.resource, column.setdefault(item.parent, len(column))] = j
        flags = coupled_flags(own[groups], self.resources)
        missing = np.zeros(y.shape, dtype=bool)
        missing[groups] = unobserved(y[groups], flags, state.action[groups], self.resources)
        lifted, censored = impute_served_share(y[groups], flags, state.action[groups], state.mu[groups],
                                               state.sigma[groups], self.resources,
                                               ranges=(low[groups], high[groups]))
        y, own = y.copy(), own.copy()
        y[groups], own[groups] = lifted, censored
        return y, own, missing

    # ------------------------------------------------------------------ per-event checks and warm-up

    def _start_warmup(self, row: np.ndarray, item: Incoming) -> None:
        row["core"]["keys"] = service_key(item.event.service)
        row["expected_tick"] = item.event.tick
        row["last_offset"] = -1
        row["policy_version"] = self.policy_version

    def _check(self, row: np.ndarray, item: Incoming) -> Refusal | Literal["redelivered"] | None:
        event, expected = item.event, int(row["expected_tick"])
        if event.tick < expected and item.offset <= row["last_offset"]:
            return "redelivered"
        if abs(event.tick - expected) > self.settings.max_tick_gap:
            return Refusal(item, "tick_out_of_range", f"tick {event.tick} of {event.service!r} is more than "
                                                      f"{self.settings.max_tick_gap} ticks from the expected {expected}")
        if event.tick < expected:
            return Refusal(item, "duplicate_tick", f"tick {event.tick} of {event.service!r} was already "
                                                   f"applied; expected tick {expected}")
        missing = self.context_names and set(self.context_names) - set(event.context or {})  # extras are ignored
        if missing:
            return Refusal(item, "missing_context", f"context channel(s) {sorted(missing)} absent; the model reads "
                                                    f"{list(self.context_names)}")
        return None

    def _hold(self, row: np.ndarray, service: str, tick: int, offset: int, produced_at: float,
              outcome: BatchOutcome, now: float) -> None:
        """Answer the refused record of ``tick`` with the capacity in force for ``tick + 1``; the tick is missed."""
        expected = int(row["expected_tick"][0])
        if not expected <= tick <= expected + self.settings.max_tick_gap:
            return  # a tick already applied or held (or a redelivery), or one the engine would refuse anyway
        row["expected_tick"] = tick + 1
        row["last_offset"] = offset
        core = row["core"][0]
        k, sigma = float(core["k"]), float(core["sigma"])
        outcome.actions.append(Action(
            service, tick + 1, float(row["capacity"][0]), float(core["action"]), float(core["mu"]), sigma, k,
            float(core["eta"]), float(core["margin"]), float(core["bias"]), int(row["policy_version"][0]),
            int(core["censor_streak"]), self.settings.advisory, now, produced_at, phase="hold",
            k_sigma=k * sigma if self.config.ablation.use_k_sigma else 0.0, escape=float(core["escape"])))

    def _context_vector(self, event: UsageEvent) -> np.ndarray:
        context = event.context or {}
        return np.array([context[name] for name in self.context_names], dtype=np.float64)

    def _warm(self, row: np.ndarray, item: Incoming, outcome: BatchOutcome, now: float) -> bool:
        """Record a warm-up tick; emit the hold action unless the window is now full (True)."""
        event = item.event
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
        outcome.actions.append(Action(
            event.service, event.tick + 1, capacity, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, self.policy_version,
            0, self.settings.advisory, now, event.produced_at, phase="warmup", clipped=clipped))
        return False

    # ------------------------------------------------------------------ controller calls

    def _ranges(self, warm_usage: np.ndarray, items: list[Incoming]) -> tuple[np.ndarray, np.ndarray]:
        """The first ranges: the operator's, else the model's (``scaling="artifact"``) or the window's."""
        if self.settings.scaling == "artifact":
            assert self._series is not None
            n = warm_usage.shape[0]
            low, high = np.full(n, self._series.low), np.full(n, self._series.high)
        else:
            low, high = window_range(warm_usage, self.settings.headroom)
        return self._operator_ranges(items, low, high)

    def _operator_ranges(self, items: list[Incoming], low: np.ndarray, high: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(low, high)`` with the operator's range where one is set."""
        low, high = low.copy(), high.copy()
        for j, item in enumerate(items):
            override = self.settings.overrides.get(item.service)
            if override is not None and override.low is not None:
                low[j], high[j] = override.low, override.high
        return low, high

    def _move_ranges(self, sub: np.ndarray, state: ControllerState, new_low: np.ndarray, new_high: np.ndarray,
                     items: list[Incoming], reason: Literal["outgrown", "operator"],
                     outcome: BatchOutcome) -> ControllerState:
        """Carry ``state`` over to the new ranges (identical ones are left exactly as they are)."""
        low, high = sub["low"].copy(), sub["high"].copy()
        moved = (new_low != low) | (new_high != high)
        if not moved.any():
            return state
        for j in np.flatnonzero(moved):
            outcome.ranges.append(RangeChange(items[j].service, int(items[j].event.tick), reason, float(low[j]),
                                              float(high[j]), float(new_low[j]), float(new_high[j])))
        sub["low"], sub["high"] = new_low, new_high
        return rescale_state(state, low, high, new_low, new_high)

    def _scale_context(self, context: np.ndarray) -> np.ndarray:
        return to_unit(context, self._context_low, self._context_high)

    def _first_decisions(self, rows: np.ndarray, ready: list[tuple[int, Incoming]], outcome: BatchOutcome,
                         now: float) -> None:
        index = np.array([i for i, _ in ready])
        sub = rows[index]
        low, high = self._ranges(sub["warm_usage"], [item for _, item in ready])
        history = to_unit(sub["warm_usage"], low[:, None], high[:, None])
        history_context = self._scale_context(sub["warm_context"]) if self.context_names else None
        ticks = np.array([item.event.tick for _, item in ready], dtype=np.int64)
        state = self.controller.initial_state(sub["core"]["keys"], history, history_context, ticks + 1)
        sub["low"], sub["high"] = low, high
        clipped = self._store(sub, state, low, high, [item for _, item in ready])
        rows[index] = sub
        self._emit_actions(outcome, [item for _, item in ready], state, sub["capacity"], clipped, now)

    def _step(self, rows: np.ndarray, controlled: list[tuple[int, Incoming]], outcome: BatchOutcome,
              now: float) -> None:
        index = np.array([i for i, _ in controlled])
        items = [item for _, item in controlled]
        sub = rows[index]
        state = self.codec.unpack(sub["core"])
        state = self._move_ranges(sub, state, *self._operator_ranges(items, sub["low"], sub["high"]), items,
                                  "operator", outcome)
        low, high = sub["low"].copy(), sub["high"].copy()
        capacity = np.array([item.event.capacity for item in items])
        usage = np.array([item.event.usage for item in items])
        censored = np.array([item.event.censored for item in items])
        # The capacity in force is the one decided unless the scheduler applied another.
        state.action = np.where(capacity == sub["capacity"], state.action, to_unit(capacity, low, high))
        state.tick = np.array([item.event.tick for item in items], dtype=np.int64)  # a gap moves the clock
        y = np.where(censored, state.action, to_unit(usage, low, high))  # censored: y_t = a_t exactly
        missing = None
        if self.resources:
            y, censored, missing = self._couple(items, state, y, censored, low, high)
        context = (self._scale_context(np.stack([self._context_vector(item.event) for item in items]))
                   if self.context_names else None)
        new, transition = self.controller.step(state, y, censored, context, missing)
        if self.settings.range_growth > 1:
            seen = censored if missing is None else censored & ~missing  # a killed tick is no sign of an outgrown range
            grow = outgrown(state.action, seen, new.censor_streak, self.settings.grow_after)
            grow &= np.array([getattr(self.settings.overrides.get(item.service), "low", None) is None
                              for item in items])  # an operator's range stays
            new_high = np.where(grow, grown_high(low, high, self.settings.range_growth), high)
            new = self._move_ranges(sub, new, low, new_high, items, "outgrown", outcome)
        behaviour_versions = sub["policy_version"].copy()
        clipped = self._store(sub, new, sub["low"].copy(), sub["high"].copy(), items)
        rows[index] = sub
        self._emit_actions(outcome, items, new, sub["capacity"], clipped, now)
        self._emit_transitions(outcome, items, state, new, transition, y, behaviour_versions)

    def _store(self, sub: np.ndarray, state: ControllerState, low: np.ndarray, high: np.ndarray,
               items: list[Incoming]) -> np.ndarray:
        """Write the new states into ``sub``; returns a per-service clipping label for the actions."""
        raw = self.controller.unclipped(state)
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

    def _emit_actions(self, outcome: BatchOutcome, items: list[Incoming], state: ControllerState,
                      capacity: np.ndarray, clipped: np.ndarray, now: float) -> None:
        advisory = self.settings.advisory
        k_sigma = state.k * state.sigma if self.config.ablation.use_k_sigma else np.zeros_like(state.k)
        columns = zip(state.tick.tolist(), capacity.tolist(), state.action.tolist(), state.mu.tolist(),
                      state.sigma.tolist(), state.k.tolist(), state.eta.tolist(), state.margin.tolist(),
                      state.bias.tolist(), state.censor_streak.tolist(), k_sigma.tolist(), clipped.tolist(),
                      state.escape.tolist())
        for item, (tick, cap, norm, mu, sigma, k, eta, margin, bias, streak, ks, clip, esc) in zip(items, columns):
            outcome.actions.append(Action(item.event.service, tick, cap, norm, mu, sigma, k, eta, margin, bias,
                                          self.policy_version, streak, advisory, now, item.event.produced_at,
                                          k_sigma=ks, clipped=clip, escape=esc))

    def _emit_transitions(self, outcome: BatchOutcome, items: list[Incoming], before: ControllerState,
                          after: ControllerState, transition: Transition, y: np.ndarray,
                          versions: np.ndarray) -> None:
        columns = zip(before.tick.tolist(), transition.features.tolist(), transition.pre.tolist(),  # Python values,
                      transition.log_prob.tolist(), transition.reward.tolist(),  # converted column by column
                      transition.next_features.tolist(), transition.censored.tolist(), transition.action.tolist(),
                      versions.tolist(), y.tolist(), before.mu.tolist(), before.sigma.tolist(),
                      after.censor_streak.tolist())
        for item, (tick, features, pre, log_prob, reward, next_features, censored, action, version, observed, mu,
                   sigma, streak) in zip(items, columns):
            outcome.transitions.append(TransitionRecord(
                item.event.service, tick, features, pre, log_prob, reward, next_features, censored, action, version,
                observed=observed, mu=mu, sigma=sigma, censor_streak=streak))
