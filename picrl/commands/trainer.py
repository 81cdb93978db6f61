"""``picrl trainer``: the slow loop as its own process (replay in, policy versions out)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal

import torch
from prometheus_client import start_http_server

from picrl.commands.bus import (
    add_bus_arguments,
    add_replication_arguments,
    configure_logging,
    logged_errors,
    reachable_bootstrap,
    settings_from_args,
)
from picrl.commands.source import model_folder
from picrl.settings import Settings
from picrl_core.artifact import load_artifact
from stream.topics import cluster_brokers, ensure_topics, topic_specs
from stream.trainer import PolicyTrainer, Published
from stream.trainer_replay import TrainerSettings

log = logging.getLogger("picrl.trainer")


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "trainer",
        help="run the policy trainer: consume replay, publish KL-regularised policy versions",
        description="Consume <prefix>.replay as a consumer group, keep a bounded replay buffer and every "
        "--update-every transitions run one slow KL-regularised actor-critic update. Each new acting "
        "policy is scored off-policy on held-out transitions next to its parent and published on "
        "<prefix>.policy as the next version (parent, KL to parent, both scores) when it differs from its parent "
        "(--min-kl) and scores better; other candidates are skipped. Offsets commit after each candidate, "
        "published or skipped, so a restart resumes where it stopped. Stops on Ctrl-C or SIGTERM.",
    )
    parser.add_argument("--model", type=model_folder, required=True, help="a model folder from `picrl train`")
    add_bus_arguments(parser)
    add_replication_arguments(parser)
    parser.add_argument("--policy-name", help="policy name on <prefix>.policy (default default)")
    parser.add_argument("--group-id", default="picrl-trainer", help="consumer group on the replay topic")
    parser.add_argument(
        "--update-every",
        type=int,
        default=None,
        help="transitions between slow updates (default: the model's N_update)",
    )
    parser.add_argument("--max-updates", type=int, default=None, help="stop after publishing this many versions")
    parser.add_argument(
        "--min-kl",
        type=float,
        default=TrainerSettings.min_kl,
        help="publish a new version only when its KL to the published one, mean over held-out states, is at least "
        f"this (default {TrainerSettings.min_kl:g}) and it scores better on held-out transitions; other candidates "
        "are skipped, counted and logged",
    )
    parser.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    parser.add_argument("--log-format", choices=("json", "text"), help="log lines as JSON (default) or text")
    parser.add_argument("--metrics-port", type=int, help="serve Prometheus metrics on this port")
    parser.set_defaults(handler=run)


def _published(published: Published) -> None:
    parent = "-" if published.parent_score is None else f"{published.parent_score:.4f}"
    log.info(
        "version %d (parent %s): KL %.2e, validation score %.4f vs parent %s, %d transitions",
        published.version,
        published.parent,
        published.kl_to_parent,
        published.validation_score,
        parent,
        published.transitions_seen,
        extra={"version": published.version},
    )


def run(args: argparse.Namespace) -> int:
    torch.set_num_threads(1)
    resolved = settings_from_args(args, policy_name=args.policy_name, log_format=args.log_format)
    configure_logging(args.log_level, resolved["log_format"])
    return logged_errors(lambda: _run(args, resolved))


def _run(args: argparse.Namespace, resolved: Settings) -> int:
    artifact = load_artifact(args.model)
    bootstrap = reachable_bootstrap(resolved)
    prefix, partitions = resolved["prefix"], resolved["partitions"]
    settings = TrainerSettings(
        bootstrap=bootstrap,
        prefix=prefix,
        policy_name=resolved["policy_name"],
        group_id=args.group_id,
        update_every=args.update_every,
        max_updates=args.max_updates,
        min_kl=args.min_kl,
    )
    trainer = PolicyTrainer(
        artifact,
        settings,
        on_publish=_published,
        on_resume=lambda offsets: log.info(
            "resuming replay at committed offsets %s (None: from the beginning)", offsets
        ),
    )
    if args.metrics_port is not None:
        start_http_server(args.metrics_port, registry=trainer.metrics.registry)

    async def main() -> None:
        replication = resolved.replication(await cluster_brokers(bootstrap))
        await ensure_topics(bootstrap, topic_specs(prefix, partitions), replication)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, trainer.stop)
        log.info(
            "picrl trainer: %s, replay %s -> %s, update every %d transitions",
            bootstrap,
            trainer.topics.replay,
            trainer.topics.policy,
            trainer.update_every,
        )
        await trainer.run()

    asyncio.run(main())
    log.info(
        "picrl trainer: stopped after %d version(s) published, %d candidate(s) skipped",
        len(trainer.published),
        trainer.skipped,
    )
    return 0
