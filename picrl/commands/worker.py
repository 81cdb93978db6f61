"""``picrl worker``: run one stream worker (Faust) that decides capacities from the usage topic."""

from __future__ import annotations

import argparse
import asyncio
import fcntl
import itertools
import logging
import socket
import tempfile
import time
from collections.abc import Callable, Coroutine
from dataclasses import replace
from pathlib import Path
from typing import IO, Any, TypeVar

import faust
import torch
from aiokafka.errors import KafkaError, KafkaTimeoutError

from picrl.commands.bus import (
    KafkaUnreachable,
    add_bus_arguments,
    add_replication_arguments,
    configure_logging,
    logged_errors,
    logging_config,
    reachable_bootstrap,
    settings_from_args,
)
from picrl.commands.respawn import respawn_wanted, respawning
from picrl.commands.source import model_folder
from picrl.kafka.local_broker import port_in_use
from picrl.settings import SPECS, Settings, SettingsError
from picrl_core.artifact import ModelArtifact
from picrl_core.deployable import check_serves, load_model
from picrl_core.resources import Resource
from picrl_core.rules import DEPLOYABLE_METHODS
from stream.topics import changelog_spec, cluster_brokers, ensure_topics, topic_specs
from stream.worker import GUARANTEES, StreamWorker

WEB_PORT = SPECS["web_port"].default
WEB_PORTS_TRIED = 100  # ports after the default one tried when it is taken
_CLAIMS = Path(tempfile.gettempdir()) / "picrl-claims"  # lock files: web ports and worker slots of this host
_claims: list[IO[str]] = []  # the locks this process holds until it exits

# flag name -> (type, help); every default lives in picrl/settings.py (see `picrl config show`)
_FLAGS: dict[str, tuple[type, str]] = {
    "app_id": (str, "Faust app id: consumer group and table changelog names (default picrl-worker)"),
    "policy_name": (str, "policy to follow on <prefix>.policy (default default)"),
    "headroom": (float, "window scaling: widen the first window's range by this many spans each side (default 0.5)"),
    "range_growth": (
        float,
        "a range outgrown (short at its top grow-after ticks in a row) grows upward to this many "
        "times its span (default 2; 1: ranges never grow)",
    ),
    "grow_after": (int, "short ticks in a row, the last at the top of the range, before it grows (default 3)"),
    "shrink_after": (
        int,
        "ticks in a row seen below a range's floor before the floor comes down (default 3; 0: floors never come down)",
    ),
    "floor_share": (float, "a floor comes down to this share of the usage of the tick that lowers it (default 0.5)"),
    "batch_max": (int, "most events decided in one batch (default 1000)"),
    "batch_within": (float, "seconds to wait for more events before deciding (default 0.005)"),
    "commit_interval": (float, "seconds between commits, transactions under exactly_once (default 0.05)"),
    "session_timeout": (
        float,
        "seconds of silence after which a crashed worker's partitions move to the others, unless it is back "
        "first (default 6, the broker's minimum)",
    ),
    "instance_id": (
        str,
        "static group membership id: a worker killed and restarted with the same id gets its partitions "
        "back at once, without a rebalance (default auto: the host name and the lowest worker slot free on "
        "this host, which a restarted worker takes again; none: dynamic membership)",
    ),
    "stall_timeout": (
        float,
        "seconds a usage partition of this worker may have records waiting and nothing "
        "committed before the worker rejoins its group to start it again (default 30; 0: never)",
    ),
    "max_services": (int, "refuse usage of new services beyond this many (dead letter service_limit)"),
    "max_tick_gap": (int, "refuse ticks further than this from a service's expected tick (default 1000)"),
    "resources": (
        str,
        "decide these resources of each service together, comma separated, e.g. gpu_mem,gpu_compute: "
        "usage records then carry a resources map (schema 2), a memory shortage censors compute too, "
        "and each action carries a capacity per resource (default: one resource per service)",
    ),
    "max_kl": (float, "policy guardrail: refuse versions whose KL to their parent exceeds this (default 0.5)"),
    "score_margin": (
        float,
        "policy guardrail: refuse versions scoring more than this below their parent (default 0.05)",
    ),
    "c_under": (float, "cost of a unit short, for the replay rewards (default: the model's, 2)"),
    "c_over": (float, "cost of a unit idle, for the replay rewards (default: the model's, 1)"),
    "web_port": (
        int,
        f"serve /healthz, /metrics (Prometheus) and /services/<id> on this port (default {WEB_PORT}, "
        "or the next free port when another worker on this host has it; 0: no web server)",
    ),
    "capacity_gauge": (
        int,
        "expose each service's decided capacity as the gauge picrl_decided_capacity{service,resource} on "
        "/metrics, for up to this many services: a label value per service, so a cap (default none: off)",
    ),
}

log = logging.getLogger("picrl.worker")
T = TypeVar("T")


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "worker",
        help="run a stream worker: usage events in, provisioning actions and replay transitions out",
        description="Consume <prefix>.usage (censored usage per service and tick), decide each service's capacity "
        "for the next tick with PIC-RL, and write it with its breakdown to <prefix>.actions and the "
        "transition to <prefix>.replay. Per-service state lives in a changelog-backed table; the "
        "acting policy follows <prefix>.policy. Run several workers with the same --app-id to share "
        "the partitions. Creates missing topics first. Stops on Ctrl-C or SIGTERM. Unset options come "
        "from --settings FILE, then PICRL_<NAME> variables, then defaults (`picrl config show`).",
    )
    parser.add_argument("--model", type=model_folder, required=True, help="a model folder from `picrl train`")
    parser.add_argument(
        "--method",
        choices=DEPLOYABLE_METHODS,
        help="the method the model must serve (picrl train --method); the worker refuses a model of another. "
        "Default: the one it serves",
    )
    add_bus_arguments(parser)
    add_replication_arguments(parser)
    parser.add_argument(
        "--guarantee",
        choices=GUARANTEES,
        help="processing guarantee (default exactly_once: outputs, table and offsets commit together)",
    )
    parser.add_argument(
        "--mode", choices=("enforce", "recommend"), help="recommend: label every action advisory (default enforce)"
    )
    parser.add_argument(
        "--hard-shortage",
        choices=("requests", "pod"),
        help="with --resources, what a shortage of a hard resource (gpu_mem) does: requests (default: "
        "the requests that do not fit fail and compute is read on the share served) or pod (the "
        "pod is OOM-killed: the tick's compute goes unobserved)",
    )
    parser.add_argument(
        "--scaling",
        choices=("window", "artifact"),
        help="service ranges: from each service's first window (default) or the model's training range",
    )
    for name, (kind, text) in _FLAGS.items():
        parser.add_argument("--" + name.replace("_", "-"), type=kind, help=text)
    parser.add_argument(
        "--respawn",
        choices=("auto", "on", "off"),
        help="on: run the worker in a process forked from this one, forked again at once (no imports, same "
        "static id and web port) when a signal kills it, e.g. the OOM killer (default auto: on on Linux)",
    )
    parser.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    parser.add_argument("--log-format", choices=("json", "text"), help="log lines as JSON (default) or text")
    parser.set_defaults(handler=run)


def _once_up(bootstrap: str, settings: Settings, step: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run ``step`` (a look-up or a topic creation). Kafka answered a moment ago; should it restart meanwhile, or a
    node of a cluster be down, this tries again on any retriable error for up to the ``bootstrap_timeout``
    setting."""
    wait = settings["bootstrap_timeout"]
    deadline = time.monotonic() + wait
    while True:
        try:
            return asyncio.run(step())
        except (KafkaError, OSError) as exc:
            if isinstance(exc, KafkaError) and not (exc.retriable or isinstance(exc, KafkaTimeoutError)):
                raise
            if time.monotonic() > deadline:
                raise KafkaUnreachable(
                    f"Kafka at {bootstrap} stopped answering at start ({type(exc).__name__}: "
                    f"{exc}) and was not back within {wait:g} s"
                ) from None
            log.info("Kafka at %s does not answer (%s); trying again", bootstrap, exc)
            time.sleep(2.0)


def _lock(path: Path) -> bool:
    """Hold an exclusive lock on ``path`` until this process exits, however it exits (the kernel releases it): a
    claim on something of this host that another picrl worker may want at the same time. False if one holds it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    claim = path.open("a")
    try:
        fcntl.flock(claim, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        claim.close()
        return False
    _claims.append(claim)
    return True


def _claim(port: int) -> bool:
    """Claim ``port`` for this worker's web server, if it is free. Faust binds the port only once the worker has
    started, so without the claim two workers started together both see the default port free and the second
    dies on its bind. Free means nothing listens on it on any interface (Faust's web server binds 0.0.0.0)."""
    if not _lock(_CLAIMS / "web-ports" / f"{port}.lock"):
        return False
    if port_in_use(port, host=""):
        _claims.pop().close()  # releases the lock
        return False
    return True


def instance_id(settings: Settings) -> str | None:
    """The worker's static membership id (``instance_id`` setting). ``auto``: the host name and the lowest worker
    slot of this app id free on this host, claimed with a lock; a worker killed and started again on the same host
    takes its slot, hence its partitions, back. None (setting ``none``): a dynamic member."""
    setting = settings["instance_id"]
    if setting != "auto":
        return setting
    slots = _CLAIMS / "members" / settings["app_id"]
    slot = next(n for n in itertools.count() if _lock(slots / f"{n}.lock"))
    return f"{socket.gethostname()}-{slot}"


def web_port(settings: Settings) -> int | None:
    """The port of the worker's web server (None: off, ``web_port`` 0). A port set on purpose (flag, file,
    environment) must be free; the default one, when taken (another worker on this host), gives way to the next
    free port, and the worker logs which."""
    port, source = settings["web_port"], settings.sources["web_port"]
    if port == 0:
        return None
    if _claim(port):
        return port
    if source != "default":
        raise SettingsError(
            f"setting web_port = {port} (from {source}): the port is taken (another worker on this "
            "host?); choose a free one, or 0 to run without the web server"
        )
    for candidate in range(port + 1, min(port + 1 + WEB_PORTS_TRIED, 65_536)):
        if _claim(candidate):
            log.info(
                "web port %d is taken (another worker on this host?): using %d; --web-port sets one", port, candidate
            )
            return candidate
    raise SettingsError(
        f"web ports {port} to {port + WEB_PORTS_TRIED} are all taken: set --web-port to a free "
        "port, or 0 to run without the web server"
    )


def run(args: argparse.Namespace) -> int:
    torch.set_num_threads(1)
    names = ("guarantee", "mode", "scaling", "hard_shortage", "log_format", "respawn", *_FLAGS)
    settings = settings_from_args(args, **{name: getattr(args, name) for name in names})
    configure_logging(args.log_level, settings["log_format"])
    return logged_errors(lambda: _claimed_and_run(args, settings))


def _claimed_and_run(args: argparse.Namespace, settings: Settings) -> int:
    """Claim the web port and the static-membership slot (held by this process, whatever its worker process does),
    then run the worker here, or in a child forked again if a signal kills it (``respawn`` on)."""
    artifact = load_model(args.model)
    check_serves(artifact, args.method)  # before any broker is reached, and before a worker process is forked
    costs = {k: settings[k] for k in ("c_under", "c_over") if settings[k] is not None}
    if costs:
        artifact.config = replace(artifact.config, cost=replace(artifact.config.cost, **costs))
    port, member = web_port(settings), instance_id(settings)
    worker = _prepared(args, settings, artifact, port, member)
    if respawn_wanted(settings["respawn"]):
        return respawning(lambda: _serve(args, settings, worker))
    return _serve(args, settings, worker)


def _prepared(
    args: argparse.Namespace, settings: Settings, artifact: ModelArtifact, port: int | None, member: str | None
) -> StreamWorker:
    """The worker, built once the broker answered and its topics exist: a worker process forked again (``respawn``)
    starts from here, with no look-up repeated."""
    bootstrap = reachable_bootstrap(settings)
    replication = settings.replication(_once_up(bootstrap, settings, lambda: cluster_brokers(bootstrap)))
    worker_settings = settings.worker(bootstrap, replication, port, member)
    worker_settings = replace(worker_settings, engine=replace(worker_settings.engine, method=args.method))
    worker = StreamWorker(worker_settings, artifact)
    specs = [
        *topic_specs(worker_settings.prefix, worker_settings.partitions),
        changelog_spec(worker.states.changelog_topic.get_topic_name(), worker_settings.partitions),
    ]
    _once_up(bootstrap, settings, lambda: ensure_topics(bootstrap, specs, replication))
    log.info(
        "picrl worker %s: %s, topics %s.*, %s, %s mode, state %d bytes per service",
        worker_settings.app_id,
        bootstrap,
        worker_settings.prefix,
        worker_settings.guarantee,
        settings["mode"],
        worker.engine.row_bytes,
    )
    log.info(
        "topics created here (the table changelog too) get %d replica(s) and min.insync.replicas %d; "
        "producers write with acks=all",
        replication.factor,
        replication.min_insync,
    )
    if worker_settings.instance_id is None:
        log.info("joining group %s as a dynamic member (a restart waits out its session)", worker_settings.app_id)
    else:
        log.info(
            "joining group %s as static member %s (restarted with this id within the session timeout, a worker "
            "gets its partitions back at once)",
            worker_settings.app_id,
            worker_settings.instance_id,
        )
    if port is None:
        log.info("web server off (web_port 0): no /healthz, /metrics or /services/<id>")
    else:
        log.info(
            "web server: http://127.0.0.1:%d (/healthz, /metrics, /services/<id>; `picrl explain SERVICE "
            "--url http://127.0.0.1:%d`)",
            port,
            port,
        )
    if worker_settings.engine.resources:
        log.info(
            "resources decided together: %s",
            ", ".join(f"{r.name} ({_resource_kind(r)})" for r in worker_settings.engine.resources),
        )
    return worker


def _serve(args: argparse.Namespace, settings: Settings, worker: StreamWorker) -> int:
    """Run the prepared worker until it stops; its exit code."""
    try:
        runner = faust.Worker(
            worker.app,
            loglevel=args.log_level.upper(),
            quiet=True,
            redirect_stdouts=False,
            logging_config=logging_config(args.log_level, settings["log_format"]),
        )
        runner.spinner = None  # Faust's terminal spinner writes escape codes into the log lines
        runner.execute_from_commandline()
    except SystemExit as exc:
        return int(exc.code or 0)
    return 0


def _resource_kind(resource: Resource) -> str:
    """How a resource's shortage acts, as the start-up line names it."""
    if not resource.hard:
        return "soft"
    return "hard: a shortage " + ("kills the pod" if resource.kills else "fails requests")
