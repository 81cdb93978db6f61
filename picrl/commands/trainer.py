"""``picrl trainer``: the slow loop as its own process (replay in, policy versions out)."""
from __future__ import annotations

import argparse
import asyncio
import signal
from pathlib import Path

import torch
from prometheus_client import start_http_server

from picrl.commands.bus import add_bus_arguments, bootstrap_or_local, configure_logging, settings_from_args
from picrl_core.artifact import load_artifact
from stream.topics import ensure_topics, topic_specs
from stream.trainer import PolicyTrainer, Published, TrainerSettings


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "trainer", help="run the policy trainer: consume replay, publish KL-regularised policy versions",
        description="Consume <prefix>.replay as a consumer group, keep a bounded replay buffer and every "
                    "--update-every transitions run one slow KL-regularised actor-critic update. Each new acting "
                    "policy is scored off-policy on held-out transitions next to its parent and published on "
                    "<prefix>.policy as the next version (parent, KL to parent, both scores). Offsets commit after "
                    "each publish, so a restart resumes where it stopped. Stops on Ctrl-C or SIGTERM.")
    parser.add_argument("--model", type=Path, required=True, help="a model folder from `picrl train`")
    add_bus_arguments(parser)
    parser.add_argument("--policy-name", help="policy name on <prefix>.policy (default default)")
    parser.add_argument("--group-id", default="picrl-trainer", help="consumer group on the replay topic")
    parser.add_argument("--update-every", type=int, default=None,
                        help="transitions between slow updates (default: the model's N_update)")
    parser.add_argument("--max-updates", type=int, default=None, help="stop after publishing this many versions")
    parser.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    parser.add_argument("--log-format", choices=("json", "text"), help="log lines as JSON (default) or text")
    parser.add_argument("--metrics-port", type=int, help="serve Prometheus metrics on this port")
    parser.set_defaults(handler=run)


def _print(published: Published) -> None:
    parent = "-" if published.parent_score is None else f"{published.parent_score:.4f}"
    print(f"version {published.version} (parent {published.parent}): KL {published.kl_to_parent:.2e}, "
          f"validation score {published.validation_score:.4f} vs parent {parent}, "
          f"{published.transitions_seen} transitions", flush=True)


def run(args: argparse.Namespace) -> int:
    torch.set_num_threads(1)
    resolved = settings_from_args(args, policy_name=args.policy_name, log_format=args.log_format)
    configure_logging(args.log_level, resolved["log_format"])
    artifact = load_artifact(args.model)
    bootstrap = bootstrap_or_local(resolved["bootstrap"])
    prefix, partitions = resolved["prefix"], resolved["partitions"]
    settings = TrainerSettings(bootstrap=bootstrap, prefix=prefix, policy_name=resolved["policy_name"],
                               group_id=args.group_id, update_every=args.update_every, max_updates=args.max_updates)
    trainer = PolicyTrainer(artifact, settings, on_publish=_print,
                            on_resume=lambda offsets: print(f"resuming replay at committed offsets {offsets} "
                                                            "(None: from the beginning)", flush=True))
    if args.metrics_port is not None:
        start_http_server(args.metrics_port, registry=trainer.metrics.registry)

    async def main() -> None:
        await ensure_topics(bootstrap, topic_specs(prefix, partitions))
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, trainer.stop)
        print(f"picrl trainer: {bootstrap}, replay {trainer.topics.replay} -> {trainer.topics.policy}, "
              f"update every {trainer.update_every} transitions", flush=True)
        await trainer.run()

    asyncio.run(main())
    print(f"picrl trainer: stopped after {len(trainer.published)} version(s)", flush=True)
    return 0
