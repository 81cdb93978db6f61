"""One typed settings object for the worker and the trainer, and where each value came from.

Sources, later ones winning: the defaults below, a JSON settings file (``--settings FILE`` or
``$PICRL_SETTINGS``), environment variables ``PICRL_<NAME>`` (upper case), then command-line flags.
``picrl config show`` prints the effective values with their source. Every value is checked when it
is read; an invalid one fails at start with a message naming the setting and its source.

Per-service overrides live only in the file, under ``"services"``::

    {"bootstrap": "kafka-1:9092", "partitions": 16, "mode": "recommend",
     "services": {"web-frontend": {"min_capacity": 4, "max_capacity": 64}, "batch": {"freeze": 8},
                  "gpu-pool": {"low": 0, "high": 512}}}
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # imported where used: the worker's modules load torch and Faust, `picrl config` needs neither
    from stream.decisions import ServiceOverride
    from stream.topics import Replication
    from stream.worker import WorkerSettings


class SettingsError(ValueError):
    """An invalid setting, named with where it came from."""


def _positive_int(value: Any) -> int:
    if isinstance(value, bool):
        raise ValueError("expected an integer >= 1")
    number = value if isinstance(value, int) else int(str(value).strip())  # "3.5" and 3.5 are refused
    if number < 1:
        raise ValueError("expected an integer >= 1")
    return number


def _count(value: Any) -> int:
    if isinstance(value, bool):
        raise ValueError("expected an integer >= 0")
    number = value if isinstance(value, int) else int(str(value).strip())
    if number < 0:
        raise ValueError("expected an integer >= 0")
    return number


def _share(value: Any) -> float:
    number = float(value)
    if not 0 <= number <= 1:
        raise ValueError("expected a number from 0 to 1")
    return number


def _choice(*allowed: str) -> Callable[[Any], str]:
    def parse(value: Any) -> str:
        if value not in allowed:
            raise ValueError(f"expected one of {', '.join(allowed)}")
        return str(value)

    return parse


def _guarantee(value: Any) -> str:
    from stream.worker import GUARANTEES  # only when one is set: the worker module loads Faust

    return _choice(*GUARANTEES)(value)


def _growth(value: Any) -> float:
    number = float(value)
    if not number >= 1:
        raise ValueError("expected a number >= 1")
    return number


def _non_negative(value: Any) -> float:
    number = float(value)
    if not number >= 0:
        raise ValueError("expected a number >= 0")
    return number


def _port(value: Any) -> int:
    if isinstance(value, bool):
        raise ValueError("expected a port number from 0 to 65535")
    number = value if isinstance(value, int) else int(str(value).strip())
    if not 0 <= number <= 65_535:
        raise ValueError("expected a port number from 0 to 65535")
    return number


def _positive(value: Any) -> float:
    number = float(value)
    if not number > 0:
        raise ValueError("expected a number > 0")
    return number


def _optional(parse: Callable[[Any], Any]) -> Callable[[Any], Any]:
    return lambda value: None if value in (None, "", "none") else parse(value)


def resource_names(value: Any) -> tuple[str, ...]:
    """Resource names, comma separated (or a list), each one ``picrl_core.resources.KNOWN`` defines."""
    from picrl_core.resources import KNOWN

    names = tuple(n.strip() for n in (value.split(",") if isinstance(value, str) else value) if n.strip())
    unknown = [n for n in names if n not in KNOWN]
    if unknown or len(set(names)) != len(names):
        raise ValueError(f"expected distinct names among {sorted(KNOWN)}; got {list(names)}")
    return names


@dataclass(frozen=True)
class Spec:
    """One setting: its parser, default and meaning."""

    parse: Callable[[Any], Any]
    default: Any
    help: str


SPECS: dict[str, Spec] = {
    "bootstrap": Spec(
        _optional(str), None, "Kafka bootstrap HOST:PORT (none: the local broker of `picrl kafka start`)"
    ),
    "bootstrap_timeout": Spec(
        _positive,
        15.0,
        "seconds a command that needs Kafka waits for it to answer before it exits with an error (code 2)",
    ),
    "replication_factor": Spec(
        _optional(_positive_int), None, "replicas of each topic picrl or Faust creates (none: min(3, live brokers))"
    ),
    "min_insync_replicas": Spec(
        _optional(_positive_int),
        None,
        "min.insync.replicas of each topic picrl or Faust creates (none: replication factor - 1, at least 1)",
    ),
    "prefix": Spec(str, "picrl", "topic name prefix"),
    "partitions": Spec(_positive_int, 8, "partitions of the keyed topics"),
    "app_id": Spec(str, "picrl-worker", "Faust app id of the workers (consumer group, changelog names)"),
    "guarantee": Spec(_guarantee, "exactly_once", "processing guarantee"),
    "mode": Spec(
        _choice("enforce", "recommend"),
        "enforce",
        "enforce: actions are to be applied; recommend: actions are labelled advisory",
    ),
    "policy_name": Spec(str, "default", "policy followed on <prefix>.policy"),
    "batch_max": Spec(_positive_int, 1_000, "most events decided in one batch"),
    "batch_within": Spec(_non_negative, 0.005, "seconds to wait for more events before deciding"),
    "commit_interval": Spec(_non_negative, 0.05, "seconds between commits (transactions)"),
    "session_timeout": Spec(_non_negative, 6.0, "seconds after which a silent worker's partitions move"),
    "instance_id": Spec(
        _optional(str),
        "auto",
        "static group membership: a worker restarted with the same id gets its partitions back at once, without a "
        "rebalance (auto: host name and the lowest worker slot free on this host; none: dynamic membership)",
    ),
    "stall_timeout": Spec(
        _non_negative,
        30.0,
        "seconds a usage partition may have records waiting and nothing "
        "committed before its worker rejoins the group (0: never)",
    ),
    "scaling": Spec(_choice("window", "artifact"), "window", "service ranges from the first window or the model"),
    "headroom": Spec(_non_negative, 0.5, "window scaling: spans added on each side of the first window's range"),
    "range_growth": Spec(_growth, 2.0, "an outgrown range grows upward to this many times its span (1: never)"),
    "grow_after": Spec(_positive_int, 3, "short ticks in a row, the last at the top of the range, before it grows"),
    "shrink_after": Spec(_count, 3, "ticks in a row seen below a range's floor before it comes down (0: never)"),
    "floor_share": Spec(_share, 0.5, "a floor comes down to this share of the usage of the tick that lowers it"),
    "max_services": Spec(_optional(_positive_int), None, "cap on services per worker (none: no cap)"),
    "max_tick_gap": Spec(_positive_int, 1_000, "ticks further than this from the expected one are refused"),
    "resources": Spec(
        resource_names,
        (),
        "resources decided together per service, e.g. gpu_mem,gpu_compute (schema-2 "
        "usage records; empty: one resource per service)",
    ),
    "hard_shortage": Spec(
        _choice("requests", "pod"),
        "requests",
        "what a shortage of a hard resource (gpu_mem) does: "
        "requests (the requests that do not fit fail) or pod (the pod is OOM-killed: nothing of the "
        "tick is served, its other resources go unobserved)",
    ),
    "max_kl": Spec(_non_negative, 0.5, "policy guardrail: largest KL to the parent accepted"),
    "score_margin": Spec(_non_negative, 0.05, "policy guardrail: largest validation-score drop below the parent"),
    "c_under": Spec(_non_negative, None, "cost of a unit short (none: the model's, 2)"),
    "c_over": Spec(_non_negative, None, "cost of a unit idle (none: the model's, 1)"),
    "web_port": Spec(
        _port,
        6066,
        "worker web server port (/healthz, /metrics, /services/<id>; 0: off); when the "
        "default is taken, the next free port",
    ),
    "capacity_gauge": Spec(
        _optional(_positive_int),
        None,
        "export each service's decided capacity as the gauge picrl_decided_capacity on /metrics, for up to this "
        "many services (a label value each; none: off)",
    ),
    "log_format": Spec(_choice("json", "text"), "json", "log lines as JSON objects or plain text"),
    "respawn": Spec(
        _choice("auto", "on", "off"),
        "auto",
        "on: the worker runs in a forked process, forked again at once when a signal kills it (auto: on where the "
        "kernel can end the worker with its command, Linux; off elsewhere)",
    ),
}


@dataclass(frozen=True)
class Settings:
    """The effective settings and the source of each (``default``, ``file FILE``, ``env PICRL_X``, ``flag``)."""

    values: dict[str, Any]
    sources: dict[str, str]
    services: dict[str, ServiceOverride] = field(default_factory=dict)

    def __getitem__(self, name: str) -> Any:
        return self.values[name]

    def worker(
        self,
        bootstrap: str,
        replication: Replication | None = None,
        web_port: int | None = None,
        instance_id: str | None = None,
    ) -> WorkerSettings:
        """The worker's settings, with the replication of the topics it creates (default: 1 replica), the port of
        its web server (None: off) and its static membership id, as resolved against the cluster and the host."""
        from picrl_core.resources import resources_named
        from stream.decisions import EngineSettings
        from stream.topics import Replication
        from stream.worker import WorkerSettings

        v = self.values
        if v["hard_shortage"] == "pod" and not v["resources"]:
            raise SettingsError(
                f"setting hard_shortage = pod (from {self.sources['hard_shortage']}) needs resources "
                "(e.g. gpu_mem,gpu_compute): with one resource per service there is none to kill the pod"
            )
        resources = resources_named(v["resources"], v["hard_shortage"] == "pod") if v["resources"] else ()
        engine = EngineSettings(
            scaling=v["scaling"],
            headroom=v["headroom"],
            max_services=v["max_services"],
            max_tick_gap=v["max_tick_gap"],
            advisory=v["mode"] == "recommend",
            overrides=dict(self.services),
            range_growth=v["range_growth"],
            grow_after=v["grow_after"],
            shrink_after=v["shrink_after"],
            floor_share=v["floor_share"],
            resources=resources,
        )
        return WorkerSettings(
            bootstrap=bootstrap,
            prefix=v["prefix"],
            app_id=v["app_id"],
            partitions=v["partitions"],
            guarantee=v["guarantee"],
            policy_name=v["policy_name"],
            batch_max=v["batch_max"],
            batch_within=v["batch_within"],
            commit_interval=v["commit_interval"],
            session_timeout=v["session_timeout"],
            instance_id=instance_id,
            stall_timeout=v["stall_timeout"],
            web_port=web_port,
            capacity_gauge=v["capacity_gauge"] or 0,
            replication=replication or Replication(),
            max_policy_kl=v["max_kl"],
            policy_score_margin=v["score_margin"],
            engine=engine,
        )

    def replication(self, brokers: int) -> Replication:
        """The replication of the topics to create on a cluster of ``brokers`` live brokers: the settings'
        ``replication_factor`` and ``min_insync_replicas``, each by default as :meth:`Replication.for_brokers`."""
        from stream.topics import Replication

        try:
            return Replication.for_brokers(
                brokers, self.values["replication_factor"], self.values["min_insync_replicas"]
            )
        except ValueError as exc:
            raise SettingsError(
                f"settings replication_factor (from {self.sources['replication_factor']}) and "
                f"min_insync_replicas (from {self.sources['min_insync_replicas']}): {exc}"
            ) from None


def _parse(name: str, raw: Any, source: str) -> Any:
    try:
        return SPECS[name].parse(raw)
    except (TypeError, ValueError) as exc:
        raise SettingsError(f"setting {name} = {raw!r} (from {source}) is invalid: {exc}") from None


def _services(raw: Any, source: str) -> dict[str, ServiceOverride]:
    if not isinstance(raw, Mapping):
        raise SettingsError(f"setting services (from {source}) must map service ids to overrides")
    from stream.decisions import ServiceOverride

    allowed = {f.name for f in fields(ServiceOverride)}
    out = {}
    for service, override in raw.items():
        if not isinstance(override, Mapping) or set(override) - allowed:
            raise SettingsError(
                f"setting services.{service} (from {source}) must be an object with keys among "
                f"{sorted(allowed)}; got {override!r}"
            )
        try:
            out[str(service)] = ServiceOverride(**{k: None if v is None else float(v) for k, v in override.items()})
        except (TypeError, ValueError) as exc:
            raise SettingsError(f"setting services.{service} (from {source}) is invalid: {exc}") from None
    return out


def load_settings(
    file: Path | None = None, flags: Mapping[str, Any] | None = None, environ: Mapping[str, str] | None = None
) -> Settings:
    """Resolve every setting from defaults, the file, the environment and the flags (None flags are unset)."""
    environ = os.environ if environ is None else environ
    values = {name: spec.default for name, spec in SPECS.items()}
    sources = {name: "default" for name in SPECS}
    services: dict[str, ServiceOverride] = {}
    file = file or (Path(environ["PICRL_SETTINGS"]) if environ.get("PICRL_SETTINGS") else None)
    if file is not None:
        source = f"file {file}"
        try:
            data = json.loads(Path(file).read_text())
        except FileNotFoundError:
            raise SettingsError(f"settings file {file} does not exist") from None
        except ValueError as exc:
            raise SettingsError(f"settings file {file} is not valid JSON: {exc}") from None
        if not isinstance(data, dict):
            raise SettingsError(f"settings file {file} must hold a JSON object")
        unknown = sorted(set(data) - set(SPECS) - {"services"})
        if unknown:
            raise SettingsError(
                f"settings file {file} has unknown setting(s) {', '.join(unknown)}; "
                f"known: {', '.join(sorted(SPECS))}, services"
            )
        for name, raw in data.items():
            if name == "services":
                services = _services(raw, source)
            else:
                values[name], sources[name] = _parse(name, raw, source), source
    for name in SPECS:
        variable = f"PICRL_{name.upper()}"
        if variable in environ:
            values[name], sources[name] = _parse(name, environ[variable], f"env {variable}"), f"env {variable}"
    for name, raw in (flags or {}).items():
        if raw is not None:
            values[name], sources[name] = _parse(name, raw, "flag"), "flag"
    return Settings(values, sources, services)
