"""``picrl kafka start|stop|status``: the project-provisioned Kafka cluster (one node by default, or N)."""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path

from aiokafka.errors import KafkaError

from picrl.kafka import KAFKA_VERSION, BrokerError, BrokerInfo, LocalKafka, NodeInfo
from picrl.kafka.local_broker import default_cache, default_home
from picrl.kafka.partitions import NO_LEADER, describe_partitions, leaders, partition_lines


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "kafka",
        help="run a local Apache Kafka cluster (KRaft; one node, or --brokers N) for picrl",
        description=f"Run Apache Kafka {KAFKA_VERSION} in KRaft mode on free loopback ports, without Docker: one "
        "node, broker and controller at once, or --brokers N brokers (nodes 1 to N) and a quorum of three "
        "dedicated controllers (nodes N+1 to N+3), so that losing the active controller costs an election, "
        "not a broker too. Kafka's internal topics get min(3, N) replicas and min.insync.replicas one less (1 on "
        "one broker). On first use the jars are fetched from Maven Central with `mvn` into a cache folder "
        f"(default {default_cache()}); each node's config, data, log and pid file live under the home "
        f"folder (default {default_home()}), in node-<i>/. start and stop handle every node, or one with --node N "
        "(a drill: stop a node, watch `status`, start it again). status shows each node's roles and state, how many "
        "partitions each broker leads, the active controller, and the partitions without a leader or short of "
        "in-sync replicas.",
    )
    parser.add_argument("action", choices=["start", "stop", "status"], help="what to do with the cluster")
    parser.add_argument("--node", type=int, default=None, metavar="N", help="start or stop only node N (1, 2, ...)")
    parser.add_argument(
        "--crash", action="store_true", help="stop: SIGKILL at once, as a crash would (default: SIGTERM, graceful)"
    )
    parser.add_argument("--home", type=Path, default=None, help="folder the cluster owns (env PICRL_KAFKA_HOME)")
    parser.add_argument("--cache", type=Path, default=None, help="folder for the Kafka jars (env PICRL_CACHE)")
    parser.add_argument(
        "--brokers",
        type=int,
        default=None,
        help="brokers of a new cluster (default 1; 2 or more come with 3 dedicated controllers); a home keeps "
        "the count it was first started with",
    )
    parser.add_argument(
        "--port", type=int, default=None, help="client port of node 1 (default: a free one, kept afterwards)"
    )
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for the nodes to answer")
    parser.add_argument("--json", action="store_true", help="print the cluster's state as JSON")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    cluster = LocalKafka(args.home, args.cache, port=args.port, brokers=args.brokers)
    if args.node is not None and args.action == "status":
        raise BrokerError("--node goes with start or stop; status shows every node")
    if args.action == "start":
        started = time.monotonic()
        info = cluster.start(timeout=args.timeout, node=args.node)
        pids = ", ".join(str(node.pid) for node in info.nodes)
        _print(
            args,
            info.as_dict(),
            f"Kafka {info.version} is up at {info.bootstrap} ({_nodes(info)}, pid {pids}, home {info.home}, "
            f"{time.monotonic() - started:.1f} s)",
        )
        return 0
    if args.action == "stop":
        running = cluster.status()
        stopped = cluster.stop(crash=args.crash, node=args.node)
        names = [n.node_id for n in (running.running if running is not None else ()) if args.node in (None, n.node_id)]
        how = "killed" if args.crash else "stopped"
        idle = f"no broker running in {cluster.home}" if args.node is None else f"node {args.node} is not running"
        _print(
            args,
            {"stopped": stopped, "nodes": len(names), "node_ids": names},
            f"{how} {len(names)} node(s) ({', '.join(map(str, names))})" if stopped else idle,
        )
        return 0
    info = cluster.status()
    if info is None:
        _print(args, {"running": False}, f"no broker running in {cluster.home}")
        return 1
    seen = cluster.brokers_seen(info)
    brokers = len(info.brokers)
    following = cluster.following(info)
    controllers = [n.node_id for n in info.nodes if not n.is_broker]
    healthy = (
        len(seen) == brokers
        and all(count == brokers for count in seen.values())
        and all(node in following for node in controllers)
    )
    answering = ",".join(n.bootstrap for n in info.running if seen.get(n.node_id))
    try:
        partitions = asyncio.run(describe_partitions(answering)) if answering else None
    except (KafkaError, OSError, TimeoutError):
        partitions = None
    led = leaders(partitions or [])
    nodes = [
        {**node, "brokers_seen": seen.get(node["node_id"], 0), "leads": led[node["node_id"]]}
        | ({} if node["port"] is not None else {"follows_leader": node["node_id"] in following})
        for node in info.as_dict()["nodes"]
    ]
    controller = cluster.active_controller()
    lines = [
        f"{_nodes(info)}, bootstrap {info.bootstrap}, "
        f"{'all answering' if healthy else 'NOT all answering'}, active controller "
        f"{'unknown' if controller is None else f'node {controller}'} (home {info.home})"
    ]
    lines += [f"  node {n.node_id} ({n.roles}): {_node_state(n, seen, following, led, brokers)}" for n in info.nodes]
    lines += ["partitions: unknown (no node answers)"] if partitions is None else partition_lines(partitions)
    data = {
        **info.as_dict(),
        "nodes": nodes,
        "running": True,
        "answers": healthy,
        "active_controller": controller,
        "partitions": None
        if partitions is None
        else {
            "total": len(partitions),
            "leaders": {str(node): count for node, count in sorted(led.items())},
            "without_leader": [p.as_dict() for p in partitions if p.leader == NO_LEADER],
            "under_replicated": [p.as_dict() for p in partitions if p.under_replicated],
        },
    }
    _print(args, data, "\n".join(lines))
    return 0 if healthy else 1


def _node_state(node: NodeInfo, seen: dict[int, int], following: list[int], led: dict[int, int], brokers: int) -> str:
    """One node's line in `status`: its pid and address, and whether it serves (a broker: it answers and how many
    brokers it sees and partitions it leads; a dedicated controller: it follows the quorum's leader)."""
    if node.pid is None:
        return f"not running ({node.address})"
    if not node.is_broker:
        serves = "follows the quorum's leader" if node.node_id in following else "NOT following a quorum leader"
    elif seen[node.node_id]:
        serves = f"answering, sees {seen[node.node_id]} of {brokers} broker(s), leads {led[node.node_id]} partition(s)"
    else:
        serves = "NOT answering"
    return f"pid {node.pid}, {node.address}, {serves}"


def _nodes(info: BrokerInfo) -> str:
    return f"{len(info.running)} of {len(info.nodes)} node(s) running"


def _print(args: argparse.Namespace, data: dict, text: str) -> None:
    print(json.dumps(data) if args.json else text)
