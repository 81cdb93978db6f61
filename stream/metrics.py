"""Prometheus metrics of a worker, the trainer and the Prometheus producer (naming conventions: ``_total``
counters, seconds as the unit).

Each worker has its own registry, served by the worker's web server at ``/metrics``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from stream.records import Action, ResourceAction

disable_created_metrics()  # no *_created series next to every counter

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
IN_STREAK = 3  # consecutive censored ticks from which a service counts as in a censoring streak


class CensorStreaks:
    """Each service's current run of consecutive censored ticks (from its newest action) and its usage
    partition, so that the streak gauges cover every service the worker decides for, not one batch."""

    def __init__(self) -> None:
        self._by_service: dict[str, tuple[int, int]] = {}  # service -> (partition, streak)

    def update(self, service: str, partition: int, streak: int) -> None:
        self._by_service[service] = (partition, streak)

    def current(self, partitions: Collection[int]) -> list[int]:
        """The streaks of the services on ``partitions``; services of other partitions (moved to another
        worker by a rebalance) are forgotten."""
        for service in [s for s, (p, _) in self._by_service.items() if p not in partitions]:
            del self._by_service[service]
        return [streak for _, streak in self._by_service.values()]


class DecidedCapacities(Collector):
    """``picrl_decided_capacity{service, resource}``: the capacity each service's newest action decided (native
    unit; ``resource`` empty for a single resource), for up to ``cap`` services of the partitions the worker holds:
    a label value per service, so opt-in and capped. Actions of services beyond the cap are counted instead."""

    def __init__(self, cap: int, held_partitions: Callable[[], Collection[int]], registry: CollectorRegistry) -> None:
        self.cap = cap
        self._held = held_partitions
        self._by_service: dict[str, tuple[int, dict[str, float]]] = {}  # service -> (partition, resource -> capacity)
        self.beyond_cap = Counter(
            "picrl_decided_capacity_beyond_cap_total",
            "Actions not exported as picrl_decided_capacity: their service is beyond the gauge's cap",
            registry=registry,
        )
        registry.register(self)

    def update(self, action: Action | ResourceAction, partition: int) -> None:
        if action.service not in self._by_service and len(self._by_service) >= self.cap:
            self.beyond_cap.inc()
            return
        capacities = (
            {"": action.capacity}
            if isinstance(action, Action)
            else {name: r.capacity for name, r in action.resources.items()}
        )
        self._by_service[action.service] = (partition, capacities)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        held = self._held()
        for service in [s for s, (p, _) in self._by_service.items() if p not in held]:
            del self._by_service[service]  # moved to another worker by a rebalance: its slot is free again
        family = GaugeMetricFamily(
            "picrl_decided_capacity",
            "Capacity of each service's newest action (native unit), for the first services up to the cap",
            labels=["service", "resource"],
        )
        for service, (_, capacities) in self._by_service.items():
            for resource, capacity in capacities.items():
                family.add_metric([service, resource], capacity)
        yield family

    def describe(self) -> Iterator[GaugeMetricFamily]:
        return iter(())  # collected on each scrape (services come and go): nothing to check at registration


class WorkerMetrics:
    """Counters, gauges and the decision-latency histogram of one stream worker; ``held_partitions``
    returns the usage partitions the worker holds when the streak gauges are read. ``capacity_gauge`` > 0
    exports each service's decided capacity for up to that many services (:class:`DecidedCapacities`)."""

    def __init__(self, held_partitions: Callable[[], Collection[int]], capacity_gauge: int = 0) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.decided = DecidedCapacities(capacity_gauge, held_partitions, r) if capacity_gauge > 0 else None
        self.events = Counter("picrl_events_total", "Usage events consumed", registry=r)
        self.censored = Counter(
            "picrl_censored_events_total",
            "Usage events reporting a shortage (censored: demand above capacity)",
            registry=r,
        )
        self.actions = Counter("picrl_actions_total", "Actions emitted", ["phase"], registry=r)
        self.transitions = Counter("picrl_transitions_total", "Transitions sent to the replay topic", registry=r)
        self.redelivered = Counter(
            "picrl_redelivered_events_total",
            "Events already applied (redelivered after a restart), skipped",
            registry=r,
        )
        self.missed_ticks = Counter(
            "picrl_missed_ticks_total",
            "Ticks a service never reported before a later one (decided on: the gap moves its clock)",
            registry=r,
        )
        self.dead_letters = Counter(
            "picrl_dead_letters_total", "Messages sent to the dead-letter topic", ["reason"], registry=r
        )
        self.policy_refusals = Counter(
            "picrl_policy_refusals_total", "Published policy versions refused", ["reason"], registry=r
        )
        self.policy_version = Gauge("picrl_policy_version", "Version of the acting policy", registry=r)
        self.policy_age = Gauge("picrl_policy_age_seconds", "Seconds since the acting policy was adopted", registry=r)
        self.services = Gauge("picrl_services", "Services whose state this worker holds", registry=r)
        self.streaks = CensorStreaks()
        streak_max = Gauge(
            "picrl_censor_streak_max",
            "Longest current run of consecutive censored ticks among the services this worker holds",
            registry=r,
        )
        streak_max.set_function(lambda: max(self.streaks.current(held_partitions()), default=0))
        in_streak = Gauge(
            "picrl_services_in_censor_streak",
            f"Services this worker holds whose last {IN_STREAK} or more ticks were censored",
            registry=r,
        )
        in_streak.set_function(lambda: sum(s >= IN_STREAK for s in self.streaks.current(held_partitions())))
        self.latency = Histogram(
            "picrl_decision_latency_seconds",
            "From a usage event's production to its action's decision",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.lag = Gauge("picrl_consumer_lag", "Usage messages not yet consumed", ["partition"], registry=r)
        self.range_changes = Counter(
            "picrl_range_changes_total",
            "Service ranges moved: outgrown (grown at the top), underused (floor lowered) or operator (settings file)",
            ["reason"],
            registry=r,
        )
        self.state_missing = Gauge(
            "picrl_partition_state_missing",
            "1 while a usage partition is held because its services' rows were not restored",
            ["partition"],
            registry=r,
        )
        self.stall_rejoins = Counter(
            "picrl_stall_rejoins_total",
            "Group rejoins because a usage partition had records "
            "waiting and nothing committed for stall_timeout seconds",
            registry=r,
        )
        self._adopted_at = time.time()
        self.policy_age.set_function(lambda: time.time() - self._adopted_at)

    def adopted(self, version: int) -> None:
        self.policy_version.set(version)
        self._adopted_at = time.time()


class TrainerMetrics:
    """What the trainer has consumed and published."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.transitions = Counter("picrl_trainer_transitions_total", "Replay transitions consumed", registry=r)
        self.refused = Counter(
            "picrl_trainer_refused_transitions_total", "Replay messages that did not decode", registry=r
        )
        self.versions = Counter("picrl_trainer_versions_total", "Policy versions published", registry=r)
        self.skipped = Counter(
            "picrl_trainer_skipped_total",
            "Candidates not published (too close to their parent, or no better)",
            registry=r,
        )
        self.policy_version = Gauge("picrl_trainer_policy_version", "Newest version published", registry=r)
        self.kl = Gauge("picrl_trainer_kl_to_parent", "KL of the newest version to its parent", registry=r)
        self.score = Gauge("picrl_trainer_validation_score", "Validation score of the newest version", registry=r)
        self.update_seconds = Histogram(
            "picrl_trainer_update_seconds",
            "Wall time of one slow update and publish",
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
            registry=r,
        )


class SourceMetrics:
    """What ``picrl produce prometheus`` has read and produced, and the health of its Prometheus server."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.up = Gauge("picrl_source_up", "1 while the Prometheus server answers, 0 during an outage", registry=r)
        self.failures = Counter(
            "picrl_source_query_failures_total", "Queries the Prometheus server did not answer", registry=r
        )
        self.outages = Counter(
            "picrl_source_outages_total", "Outages of the Prometheus server (failed queries in a row)", registry=r
        )
        self.tick = Gauge("picrl_source_tick", "Last tick produced", registry=r)
        self.events = Counter("picrl_source_events_total", "Usage events produced", registry=r)
        self.missing = Counter(
            "picrl_source_missing_total",
            "Services read at a tick and without usage or limit at the next (no event: the worker holds)",
            registry=r,
        )
        self.dead_letters = Counter(
            "picrl_source_dead_letters_total", "Readings sent to the dead-letter topic", ["reason"], registry=r
        )
