"""``picrl worker``: run one stream worker (Faust) that decides capacities from the usage topic."""
from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

import faust
import torch

from picrl.commands.bus import add_bus_arguments, bootstrap_or_local, configure_logging
from picrl_core.artifact import load_artifact
from stream.decisions import EngineSettings
from stream.topics import ensure_topics, topic_specs
from stream.worker import GUARANTEES, StreamWorker, WorkerSettings


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "worker", help="run a stream worker: usage events in, provisioning actions and replay transitions out",
        description="Consume <prefix>.usage (censored usage per service and tick), decide each service's capacity "
                    "for the next tick with PIC-RL, and write it with its breakdown to <prefix>.actions and the "
                    "transition to <prefix>.replay. Per-service state lives in a changelog-backed table; the "
                    "acting policy follows <prefix>.policy. Run several workers with the same --app-id to share "
                    "the partitions. Creates missing topics first. Stops on Ctrl-C or SIGTERM.")
    parser.add_argument("--model", type=Path, required=True, help="a model folder from `picrl train`")
    add_bus_arguments(parser)
    parser.add_argument("--app-id", default="picrl-worker",
                        help="Faust app id: consumer group and table changelog names (default picrl-worker)")
    parser.add_argument("--guarantee", choices=GUARANTEES, default="exactly_once",
                        help="processing guarantee (default exactly_once: outputs, table and offsets commit together)")
    parser.add_argument("--policy-name", default="default", help="policy to follow on <prefix>.policy (default default)")
    parser.add_argument("--scaling", choices=("window", "artifact"), default="window",
                        help="service ranges: from each service's first window (default) or the model's training range")
    parser.add_argument("--headroom", type=float, default=0.5,
                        help="window scaling: widen the first window's range by this many spans each side (default 0.5)")
    parser.add_argument("--batch-max", type=int, default=1000, help="most events decided in one batch (default 1000)")
    parser.add_argument("--batch-within", type=float, default=0.005,
                        help="seconds to wait for more events before deciding (default 0.005)")
    parser.add_argument("--commit-interval", type=float, default=0.1,
                        help="seconds between commits (transactions under exactly_once; default 0.1)")
    parser.add_argument("--session-timeout", type=float, default=10.0,
                        help="seconds of silence after which a (crashed) worker's partitions move to the others (default 10)")
    parser.add_argument("--advisory", action="store_true", help="label every action advisory (recommend mode)")
    parser.add_argument("--max-services", type=int, default=None,
                        help="refuse usage of new services beyond this many (dead letter service_limit)")
    parser.add_argument("--max-tick-gap", type=int, default=1000,
                        help="refuse ticks further than this from a service's expected tick (default 1000)")
    parser.add_argument("--max-kl", type=float, default=0.5,
                        help="policy guardrail: refuse versions whose KL to their parent exceeds this (default 0.5)")
    parser.add_argument("--score-margin", type=float, default=0.05,
                        help="policy guardrail: refuse versions scoring more than this below their parent (default 0.05)")
    parser.add_argument("--web-port", type=int, default=None,
                        help="serve /healthz, /metrics (Prometheus) and /services/<id> on this port")
    parser.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    torch.set_num_threads(1)
    configure_logging(args.log_level)
    artifact = load_artifact(args.model)
    bootstrap = bootstrap_or_local(args.bootstrap)
    settings = WorkerSettings(
        bootstrap=bootstrap, prefix=args.prefix, app_id=args.app_id, partitions=args.partitions,
        guarantee=args.guarantee, policy_name=args.policy_name, batch_max=args.batch_max,
        batch_within=args.batch_within, commit_interval=args.commit_interval, web_port=args.web_port,
        session_timeout=args.session_timeout, max_policy_kl=args.max_kl, policy_score_margin=args.score_margin,
        engine=EngineSettings(scaling=args.scaling, headroom=args.headroom, advisory=args.advisory,
                              max_services=args.max_services, max_tick_gap=args.max_tick_gap))
    asyncio.run(ensure_topics(bootstrap, topic_specs(args.prefix, args.partitions)))
    worker = StreamWorker(settings, artifact)
    print(f"picrl worker {args.app_id}: {bootstrap}, topics {args.prefix}.*, {args.guarantee}, "
          f"state {worker.engine.row_bytes} bytes per service", flush=True)
    try:
        faust.Worker(worker.app, loglevel=args.log_level.upper(), quiet=True,
                     redirect_stdouts=False).execute_from_commandline()
    except SystemExit as exc:
        return int(exc.code or 0)
    return 0
