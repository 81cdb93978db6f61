"""``picrl policy list|rollback``: inspect the published policy versions and roll back to one."""

from __future__ import annotations

import argparse
import asyncio
import time
from dataclasses import replace

from picrl.commands.bus import add_bus_arguments, reachable_bootstrap, settings_from_args
from stream.policy_follower import guardrail_refusal, read_policy_versions
from stream.policy_writer import next_version, publish_next
from stream.records import PolicyVersion
from stream.topics import TopicNames


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "policy",
        help="list the published policy versions, or roll the workers back to one",
        description="`list` prints every version of the policy on <prefix>.policy with its parent, KL to the "
        "parent and validation scores, marks with * the version in force (the newest the workers' "
        "guardrails, --settings max_kl and score_margin, accept) and says which they refuse. "
        "`rollback --to VERSION` re-publishes that version's weights as "
        "the next version (marked as a rollback, so the workers' KL and score guardrails do not apply); "
        "every worker switches to it and a running trainer continues training from it. Versions are "
        "numbered by one writer at a time (trainer or rollback), so no two share a number.",
    )
    parser.add_argument("action", choices=("list", "rollback"))
    parser.add_argument("--to", type=int, metavar="VERSION", help="rollback: the version whose weights to restore")
    parser.add_argument("--policy-name", default="default", help="policy name (default default)")
    add_bus_arguments(parser, partitions=False)
    parser.set_defaults(handler=run)


def _line(record: PolicyVersion) -> str:
    parent_score = "-" if record.parent_score is None else f"{record.parent_score:.4f}"
    origin = f"rollback of {record.rollback_of}" if record.rollback_of is not None else f"parent {record.parent}"
    created = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(record.created_at))
    return (
        f"{record.version:>5}  {origin:<16} KL {record.kl_to_parent:9.3e}  score {record.validation_score:8.4f} "
        f"(parent {parent_score})  {created}"
    )


async def rollback(bootstrap: str, topics: TopicNames, name: str, target: int) -> PolicyVersion:
    """Publish version ``target``'s weights as the next version, as the policy's only writer (a running
    trainer continues from it); ValueError if it does not exist."""

    def build(versions: list[PolicyVersion]) -> PolicyVersion:
        chosen = [v for v in versions if v.version == target]
        if not chosen:
            known = ", ".join(str(v.version) for v in versions) or "none"
            raise ValueError(f"policy {name!r} has no version {target} on {topics.policy} (versions: {known})")
        newest = next_version(versions) - 1
        return replace(
            chosen[-1],
            version=newest + 1,
            parent=newest,
            kl_to_parent=0.0,
            created_at=time.time(),
            parent_score=None,
            rollback_of=target,
        )

    record = await publish_next(bootstrap, topics.policy, name, build)
    assert record is not None  # build always returns a record
    return record


def run(args: argparse.Namespace) -> int:
    settings = settings_from_args(args)
    bootstrap = reachable_bootstrap(settings, "policy")
    topics = TopicNames(settings["prefix"])
    if args.action == "list":
        versions = asyncio.run(read_policy_versions(bootstrap, topics.policy, args.policy_name))
        if not versions:
            print(f"no versions of policy {args.policy_name!r} on {topics.policy}")
        refused = {v.version: guardrail_refusal(v, settings["max_kl"], settings["score_margin"]) for v in versions}
        in_force = max((v.version for v in versions if refused[v.version] is None), default=None)
        for record in versions:
            refusal = refused[record.version]
            print(
                ("* " if record.version == in_force else "  ")
                + _line(record)
                + ("" if refusal is None else f"  refused by the workers: {refusal[0]}")
            )
        if in_force is not None:
            print(
                f"* in force: version {in_force}, the newest the workers' guardrails accept (max_kl "
                f"{settings['max_kl']:g}, score_margin {settings['score_margin']:g}; workers also refuse "
                "unreadable weights)"
            )
        return 0
    if args.to is None:
        raise ValueError("rollback needs --to VERSION")
    record = asyncio.run(rollback(bootstrap, topics, args.policy_name, args.to))
    print(f"published version {record.version}: the weights of version {args.to}; workers switch to it")
    return 0
