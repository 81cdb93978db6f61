"""A local Apache Kafka cluster (KRaft mode) that picrl provisions itself: one node, or N on loopback.

No container engine is needed: the broker's jars come from Maven Central through ``mvn`` into a
cache folder (once), each node's storage is formatted with ``kafka.tools.StorageTool`` and each node
runs as a detached JVM child (``kafka.Kafka``) on free loopback ports. One node is broker and controller
at once; a cluster of N >= 2 brokers gets three more nodes, dedicated controllers that form the KRaft quorum
(as Kafka recommends in production), so losing the active controller costs an election of the quorum, not a
broker too. Everything the cluster owns lives in its *home* folder:

    home/cluster.json                 cluster id and each node's ports (a broker's client port, a controller's port)
    home/node-<i>/server.properties   node i's config (ports, data dir, replication of internal topics)
    home/node-<i>/data/               its KRaft log directory
    home/node-<i>/node.json           pid of the running node
    home/node-<i>/kafka.log           its console log
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path

from picrl.kafka.probe import broker_count_or_zero
from stream.topics import Replication

KAFKA_VERSION = "3.9.1"
MIN_JAVA = 11
CONTROLLERS = 3  # the dedicated controller quorum of a cluster of 2+ brokers: it survives the loss of one
CONTROLLER_HEAP_MB = 256  # a dedicated controller holds the cluster's metadata only
_CLUSTER_FILE = "cluster.json"
_NODE_FILE = "node.json"
PORT_WAIT = 10.0  # seconds a port taken at start may take to free itself (see _freed)

Log = Callable[[str], None]


class BrokerError(RuntimeError):
    """The local broker could not be provisioned, started or reached; the message says why."""


@dataclass(frozen=True)
class NodePorts:
    """One node of the cluster and its loopback ports, fixed when it is formatted: a broker's client port, a
    controller's port, or both on a node that is both."""

    node_id: int
    port: int | None  # client (PLAINTEXT) port; None on a dedicated controller
    controller_port: int | None  # KRaft controller port; None on a dedicated broker

    @property
    def is_broker(self) -> bool:
        return self.port is not None

    @property
    def is_controller(self) -> bool:
        return self.controller_port is not None

    @property
    def roles(self) -> str:
        """Kafka's ``process.roles`` of the node."""
        return ",".join(role for role, held in (("broker", self.is_broker), ("controller", self.is_controller)) if held)

    @property
    def bootstrap(self) -> str:
        """The client address of a broker."""
        if self.port is None:
            raise BrokerError(f"node {self.node_id} is a dedicated controller: clients do not connect to it")
        return f"127.0.0.1:{self.port}"

    @property
    def address(self) -> str:
        """Where the node listens: its client port, or a dedicated controller's port."""
        return f"127.0.0.1:{self.port if self.port is not None else self.controller_port}"


@dataclass(frozen=True)
class NodeInfo(NodePorts):
    """One node of a local cluster: its ports, and its pid and start time while it runs (None when it does not)."""

    pid: int | None
    started_at: float | None


@dataclass(frozen=True)
class BrokerInfo:
    """Where a local cluster lives: its nodes, running or not."""

    home: str
    version: str
    nodes: tuple[NodeInfo, ...]

    @property
    def brokers(self) -> tuple[NodeInfo, ...]:
        return tuple(node for node in self.nodes if node.is_broker)

    @property
    def bootstrap(self) -> str:
        """Every broker's client address, comma separated (a client reaches the cluster through any one that runs)."""
        return ",".join(node.bootstrap for node in self.brokers)

    @property
    def running(self) -> tuple[NodeInfo, ...]:
        return tuple(node for node in self.nodes if node.pid is not None)

    def as_dict(self) -> dict:
        return {
            "home": self.home,
            "version": self.version,
            "bootstrap": self.bootstrap,
            "brokers": len(self.brokers),
            "nodes": [{**asdict(node), "roles": node.roles} for node in self.nodes],
        }


def default_home() -> Path:
    """``$PICRL_KAFKA_HOME``, else ``$XDG_STATE_HOME/picrl/kafka`` (``~/.local/state/picrl/kafka``)."""
    if env := os.environ.get("PICRL_KAFKA_HOME"):
        return Path(env)
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "picrl" / "kafka"


def default_cache() -> Path:
    """``$PICRL_CACHE``, else ``$XDG_CACHE_HOME/picrl`` (``~/.cache/picrl``): jars shared by all homes."""
    if env := os.environ.get("PICRL_CACHE"):
        return Path(env)
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "picrl"


def free_port() -> int:
    """A loopback TCP port that is free right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    """Whether something listens on ``port`` of ``host`` ("": every interface). SO_REUSEADDR, as servers' own
    listeners set it, so connections of a just-stopped server lingering in TIME_WAIT do not count as "taken"."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return True
        return False


def _freed(port: int, seconds: float) -> bool:
    """Whether ``port`` is free, or frees itself within ``seconds``: after a broker crash, clients retrying
    it can hold it for a moment (a loopback connect to a port in the ephemeral range can get that very port
    as its source and connect to itself, until the client drops the connection)."""
    deadline = time.monotonic() + seconds
    while port_in_use(port):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie child still "exists" for kill(0); treat it as dead
    with contextlib.suppress(OSError):
        stat = Path(f"/proc/{pid}/stat").read_text()
        if stat.rsplit(")", 1)[1].split()[0] == "Z":
            return False
    return True


def java_major_version(java: str) -> int:
    """Major version of the JVM at ``java`` (17 for "17.0.15")."""
    out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30)
    match = re.search(r'version "(\d+)(?:\.(\d+))?', out.stderr + out.stdout)
    if not match:
        raise BrokerError(f"could not read the Java version from `{java} -version`: {out.stderr.strip()[:200]}")
    major = int(match.group(1))
    return int(match.group(2)) if major == 1 and match.group(2) else major


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def fetch_kafka_jars(cache: Path, log: Log = print, version: str = KAFKA_VERSION) -> Path:
    """Download Apache Kafka's broker jars (``org.apache.kafka:kafka_2.13`` and its runtime
    dependencies) from Maven Central into ``cache/kafka-<version>/libs``; reuse them afterwards."""
    target = cache / f"kafka-{version}"
    libs = target / "libs"
    with _file_lock(cache / f".kafka-{version}.lock"):
        if (target / "complete").exists():
            return libs
        mvn = shutil.which("mvn")
        if mvn is None:
            raise BrokerError(
                "Maven (`mvn`) is not on PATH: it is needed once to fetch Kafka's jars from Maven Central"
            )
        build = target / "build"
        shutil.rmtree(build, ignore_errors=True)
        build.mkdir(parents=True)
        pom = resources.files("picrl.kafka").joinpath("pom.xml").read_text()
        (build / "pom.xml").write_text(pom.replace("${kafka.version}", version))
        staging = build / "libs"
        log(f"fetching Apache Kafka {version} jars from Maven Central into {libs} (first use only)...")
        started = time.monotonic()
        proc = subprocess.run(
            [
                mvn,
                "-B",
                "-q",
                "-f",
                str(build / "pom.xml"),
                "dependency:copy-dependencies",
                f"-DoutputDirectory={staging}",
                "-DincludeScope=runtime",
            ],
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0 or not any(staging.glob("kafka_2.13-*.jar")):
            tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
            raise BrokerError(f"downloading Kafka {version} with Maven failed (exit {proc.returncode}):\n{tail}")
        shutil.rmtree(libs, ignore_errors=True)
        staging.rename(libs)
        shutil.rmtree(build, ignore_errors=True)
        (target / "complete").write_text(f"{time.time()}\n")
        log(f"fetched {len(list(libs.glob('*.jar')))} jars in {time.monotonic() - started:.1f} s")
    return libs


def server_properties(node: NodePorts, nodes: list[NodePorts], data_dir: Path) -> str:
    """The config of ``node`` in a cluster of ``nodes``: its roles and listeners, the controller quorum (every node
    with a controller port), and what every node shares.

    Kafka's internal topics (consumer offsets, transaction state) and topics created without a replication
    factor get the rule picrl's own topics follow (:meth:`stream.topics.Replication.for_brokers`): min(3, brokers)
    replicas and min ISR one less (1 on a single node, without which consumer groups and exactly-once
    transactions could not start there). Every node holds these: a controller applies the topic defaults.

    Fail-over in seconds (Kafka's defaults in brackets): a broker that stops heartbeating (every 0.25 s [2 s]) is
    fenced after 1 s [9 s] (``broker.session.timeout.ms``) and its partitions get new leaders: a lost broker's
    partitions are unavailable that long, the largest share of a fail-over after a broker loss. The controllers
    start an election after 1 s [2 s] without an answer from the active one (``controller.quorum.fetch.timeout.ms``),
    a candidate waits 0.5-1 s [1-2 s] for votes and at most 0.2 s [1 s] before it stands again. On a dedicated
    controller that election is all the loss of the active one costs: the brokers go on leading their partitions
    and serving clients meanwhile. On a node that is both, the new controller must also fence the lost broker.
    """
    replication = Replication.for_brokers(sum(n.is_broker for n in nodes))
    voters = ",".join(f"{n.node_id}@127.0.0.1:{n.controller_port}" for n in nodes if n.is_controller)
    listeners = [f"PLAINTEXT://127.0.0.1:{node.port}"] if node.is_broker else []
    listeners += [f"CONTROLLER://127.0.0.1:{node.controller_port}"] if node.is_controller else []
    broker = (
        [
            f"advertised.listeners=PLAINTEXT://127.0.0.1:{node.port}",
            "inter.broker.listener.name=PLAINTEXT",
        ]
        if node.is_broker
        else []
    )
    return "\n".join(
        [
            f"process.roles={node.roles}",
            f"node.id={node.node_id}",
            f"controller.quorum.voters={voters}",
            f"listeners={','.join(listeners)}",
            *broker,
            "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "controller.listener.names=CONTROLLER",
            f"log.dirs={data_dir}",
            "num.partitions=1",
            f"default.replication.factor={replication.factor}",
            f"min.insync.replicas={replication.min_insync}",
            f"offsets.topic.replication.factor={replication.factor}",
            "offsets.topic.num.partitions=8",
            f"transaction.state.log.replication.factor={replication.factor}",
            f"transaction.state.log.min.isr={replication.min_insync}",
            "transaction.state.log.num.partitions=8",
            "group.initial.rebalance.delay.ms=0",
            "broker.heartbeat.interval.ms=250",
            "broker.session.timeout.ms=1000",
            "controller.quorum.fetch.timeout.ms=1000",
            "controller.quorum.election.timeout.ms=500",
            "controller.quorum.election.backoff.max.ms=200",
            "auto.create.topics.enable=true",
            "delete.topic.enable=true",
            "log.retention.hours=168",
            "",
        ]
    )


def cluster_layout(brokers: int, ports: list[int]) -> list[NodePorts]:
    """The nodes of a new cluster of ``brokers`` brokers on the free ``ports`` (:func:`ports_needed` of them, the
    first one node 1's client port): one node that is both, or brokers 1..N and :data:`CONTROLLERS` dedicated
    controllers N+1.. after them."""
    if brokers == 1:
        return [NodePorts(1, ports[0], ports[1])]
    return [NodePorts(i + 1, ports[i], None) for i in range(brokers)] + [
        NodePorts(brokers + i + 1, None, ports[brokers + i]) for i in range(CONTROLLERS)
    ]


def ports_needed(brokers: int) -> int:
    """Loopback ports a new cluster of ``brokers`` brokers takes (:func:`cluster_layout`)."""
    return 2 if brokers == 1 else brokers + CONTROLLERS


def new_cluster_id() -> str:
    """A random Kafka cluster id (base64url UUID). Like Kafka's own ``Uuid.randomUuid`` it never
    starts with '-', which the storage tool's argument parser would read as an option."""
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cluster_id.startswith("-"):
            return cluster_id


def _free_ports(count: int, first: int | None) -> list[int]:
    """``count`` distinct free loopback ports, the first one ``first`` when given."""
    ports = [] if first is None else [first]
    while len(ports) < count:
        port = free_port()
        if port not in ports:
            ports.append(port)
    return ports


class LocalKafka:
    """Start, stop and inspect the project-provisioned cluster living in ``home``.

    ``brokers``: how many brokers a new cluster gets (default 1; 2 or more come with :data:`CONTROLLERS` dedicated
    controllers); a formatted home keeps the count it was made with.
    ``port``: node 1's client port (default: a free one, kept afterwards)."""

    def __init__(
        self,
        home: Path | None = None,
        cache: Path | None = None,
        *,
        port: int | None = None,
        brokers: int | None = None,
        heap_mb: int = 768,
        log: Log = print,
    ) -> None:
        if brokers is not None and brokers < 1:
            raise BrokerError(f"a cluster needs at least one broker; got --brokers {brokers}")
        self.home = (home or default_home()).resolve()
        self.cache = (cache or default_cache()).resolve()
        self.requested_port = port
        self.requested_brokers = brokers
        self.heap_mb = heap_mb
        self.log = log

    def node_dir(self, node_id: int) -> Path:
        return self.home / f"node-{node_id}"

    def log_file(self, node_id: int) -> Path:
        return self.node_dir(node_id) / "kafka.log"

    def layout(self) -> list[NodePorts] | None:
        """The nodes of the formatted cluster in this home (None before its first start)."""
        path = self.home / _CLUSTER_FILE
        if not path.exists():
            if (self.home / "server.properties").exists():
                raise BrokerError(
                    f"{self.home} holds a single broker in the layout of an older picrl "
                    f"(server.properties, broker.json); stop that broker and remove the folder"
                )
            return None
        try:
            return [NodePorts(**node) for node in json.loads(path.read_text())["nodes"]]
        except (ValueError, TypeError, KeyError) as exc:
            raise BrokerError(f"{path} is not a picrl cluster file ({exc}); remove {self.home} to start over") from exc

    def _node(self, ports: NodePorts) -> NodeInfo:
        """A node with its pid while it runs (a stale pid file is removed)."""
        state = self.node_dir(ports.node_id) / _NODE_FILE
        pid = started = None
        if state.exists():
            try:
                saved = json.loads(state.read_text())
                pid, started = int(saved["pid"]), float(saved["started_at"])
            except (ValueError, TypeError, KeyError) as exc:
                raise BrokerError(f"{state} is not a picrl node state file ({exc}); remove it") from exc
            if not pid_alive(pid):
                state.unlink(missing_ok=True)
                pid = started = None
        return NodeInfo(ports.node_id, ports.port, ports.controller_port, pid, started)

    def status(self) -> BrokerInfo | None:
        """The cluster of this home while at least one of its nodes runs, else None."""
        nodes = self.layout()
        if nodes is None:
            return None
        info = BrokerInfo(str(self.home), KAFKA_VERSION, tuple(self._node(n) for n in nodes))
        return info if info.running else None

    @staticmethod
    def brokers_seen(info: BrokerInfo) -> dict[int, int]:
        """How many live brokers each running broker of ``info`` reports in a metadata answer (0: no answer)."""
        return {node.node_id: broker_count_or_zero(node.bootstrap) for node in info.running if node.is_broker}

    def answering(self, info: BrokerInfo, brokers: int | None = None) -> list[int]:
        """The brokers of ``info`` that answer metadata requests and see ``brokers`` brokers (default: every broker
        of the cluster)."""
        wanted = len(info.brokers) if brokers is None else brokers
        return [node for node, seen in self.brokers_seen(info).items() if seen >= wanted]

    def quorum_view(self, node_id: int) -> tuple[int, int] | None:
        """``(epoch, leader)`` of the KRaft quorum as node ``node_id`` last recorded it, None before it recorded
        one. Each node writes ``__cluster_metadata-0/quorum-state`` whenever its view changes (leader -1: none
        known in that epoch)."""
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):  # not written yet, or caught mid-write
            state = json.loads(self._quorum_state(node_id).read_text())
            return int(state["leaderEpoch"]), int(state["leaderId"])
        return None

    def following(self, info: BrokerInfo) -> list[int]:
        """The running dedicated controllers of ``info`` that know the quorum's leader of the newest epoch any
        node has recorded since it started."""
        views = {n.node_id: self.quorum_view(n.node_id) for n in info.nodes}
        newest = max((view[0] for view in views.values() if view is not None), default=-1)
        return [
            n.node_id
            for n in info.running
            if not n.is_broker
            and (view := views[n.node_id]) is not None
            and view[0] == newest
            and view[1] >= 0
            and self._recorded_since(n)
        ]

    def _quorum_state(self, node_id: int) -> Path:
        return self.node_dir(node_id) / "data" / "__cluster_metadata-0" / "quorum-state"

    def _recorded_since(self, node: NodeInfo) -> bool:
        """Whether ``node`` wrote its quorum view since it started (a running node has a start time)."""
        with contextlib.suppress(OSError):
            return self._quorum_state(node.node_id).stat().st_mtime >= (node.started_at or 0.0) - 1.0  # mtime steps
        return False

    def active_controller(self) -> int | None:
        """The node that leads the KRaft controller quorum (the active controller), None while none is known.

        The record with the highest epoch (:meth:`quorum_view`) names the leader now, if that node runs (a node
        killed keeps its last record)."""
        views = [view for node in self.layout() or [] if (view := self.quorum_view(node.node_id)) is not None]
        if not views:
            return None
        leader = max(views)[1]
        info = self.status()
        return leader if info is not None and leader in {n.node_id for n in info.running} else None

    def _java(self) -> str:
        java_home = os.environ.get("JAVA_HOME")
        java = str(Path(java_home) / "bin" / "java") if java_home else shutil.which("java")
        if not java or not Path(java).exists():
            raise BrokerError(
                "Java was not found (no `java` on PATH and no JAVA_HOME): install a JDK 17, "
                "e.g. `apt-get install openjdk-17-jre-headless`"
            )
        major = java_major_version(java)
        if major < MIN_JAVA:
            raise BrokerError(
                f"Kafka {KAFKA_VERSION} needs Java {MIN_JAVA}+ (17 recommended); found Java {major} at {java}"
            )
        return java

    def _configure(self, java: str, libs: Path) -> list[NodePorts]:
        """Write each node's server.properties and format its storage on first use; return the nodes."""
        nodes = self.layout()
        if nodes is not None:
            brokers = sum(n.is_broker for n in nodes)
            if self.requested_brokers not in (None, brokers):
                raise BrokerError(
                    f"the cluster in {self.home} was formatted with {brokers} broker(s); stop it and "
                    f"remove that folder to run {self.requested_brokers}"
                )
            if self.requested_port not in (None, nodes[0].port):
                raise BrokerError(
                    f"the cluster in {self.home} was formatted for port {nodes[0].port}; "
                    f"stop it and remove that folder to use port {self.requested_port}"
                )
            return nodes
        count = self.requested_brokers or 1
        nodes = cluster_layout(count, _free_ports(ports_needed(count), self.requested_port))
        cluster_id = new_cluster_id()
        formats = []
        for node in nodes:
            folder = self.node_dir(node.node_id)
            folder.mkdir(parents=True, exist_ok=True)
            shutil.rmtree(folder / "data", ignore_errors=True)
            props = folder / "server.properties"
            props.write_text(server_properties(node, nodes, folder / "data"))
            formats.append(
                subprocess.Popen(
                    [java, "-cp", f"{libs}/*", "kafka.tools.StorageTool", "format", "-t", cluster_id, "-c", str(props)],
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                )
            )
        for node, proc in zip(nodes, formats):  # formatted side by side: a JVM start each
            out, _ = proc.communicate(timeout=120)
            if proc.returncode != 0:
                raise BrokerError(f"formatting the storage of Kafka node {node.node_id} failed: {out.strip()[-800:]}")
        (self.home / _CLUSTER_FILE).write_text(
            json.dumps({"cluster_id": cluster_id, "nodes": [asdict(n) for n in nodes]}, indent=2) + "\n"
        )
        return nodes

    def start(self, timeout: float = 120.0, *, node: int | None = None) -> BrokerInfo:
        """Start every node that does not run, or only ``node`` (fetching jars and formatting storage on first use),
        and wait until each answers metadata requests with every running node registered as a broker. Returns the
        cluster at once if those nodes already run and answer."""
        running = self.status()
        if running is not None and node is None and self._up(running, running.nodes):
            return running
        java = self._java()
        libs = fetch_kafka_jars(self.cache, self.log)
        nodes = self._configure(java, libs)
        if node is not None and node not in {n.node_id for n in nodes}:
            raise BrokerError(f"the cluster in {self.home} has no node {node} (nodes 1 to {len(nodes)})")
        targets = [n for n in nodes if node in (None, n.node_id)]
        down = [n for n in targets if self._node(n).pid is None]
        ports = (p for n in down for p in (n.port, n.controller_port) if p is not None)
        for taken in (p for p in ports if not _freed(p, PORT_WAIT)):
            raise BrokerError(
                f"port {taken} on 127.0.0.1 is taken by another process; "
                f"free it, or pick another port (`picrl kafka start --port N` with a new --home)"
            )
        launched = {node.node_id: self._launch(java, libs, node) for node in down}
        deadline = time.monotonic() + timeout
        while True:
            for node_id, proc in launched.items():
                if proc.poll() is not None:
                    self._stop_all(launched)
                    raise BrokerError(
                        f"Kafka node {node_id} exited with code {proc.returncode} while starting; "
                        f"last lines of {self.log_file(node_id)}:\n{self._log_tail(node_id)}"
                    )
            info = self.status() or BrokerInfo(str(self.home), KAFKA_VERSION, ())
            if info.nodes and self._up(info, targets):
                return info
            if time.monotonic() > deadline:
                ready = self._ready(info)
                silent = [n.node_id for n in targets if n.node_id not in ready]
                tails = "\n".join(f"{self.log_file(i)}:\n{self._log_tail(i)}" for i in silent)
                what = (
                    f"did not answer metadata requests with all {sum(n.is_broker for n in info.running)} running "
                    "broker(s), or follow the controller quorum's leader"
                )
                if launched:
                    self._stop_all(launched)
                    raise BrokerError(f"Kafka node(s) {silent} {what} within {timeout:.0f} s; last lines of\n{tails}")
                raise BrokerError(f"Kafka node(s) {silent} of {self.home} run but {what}; run `picrl kafka stop` first")
            time.sleep(0.25)

    def _ready(self, info: BrokerInfo) -> set[int]:
        """The running nodes of ``info`` that serve: brokers that answer metadata requests with every running
        broker registered, dedicated controllers that follow the quorum's leader."""
        return {*self.answering(info, sum(n.is_broker for n in info.running)), *self.following(info)}

    def _up(self, info: BrokerInfo, targets: Iterable[NodePorts]) -> bool:
        """Whether every node of ``targets`` runs and serves (:meth:`_ready`)."""
        ready = self._ready(info)
        return all(n.node_id in ready for n in targets)

    def _stop_all(self, node_ids: Iterable[int]) -> None:
        for node_id in node_ids:
            self.stop(node=node_id)

    def _launch(self, java: str, libs: Path, node: NodePorts) -> subprocess.Popen:
        folder = self.node_dir(node.node_id)
        log4j = resources.files("picrl.kafka").joinpath("log4j.properties")
        cmd = [
            java,
            "-Xms128m",
            f"-Xmx{self.heap_mb if node.is_broker else CONTROLLER_HEAP_MB}m",
            "-XX:+UseG1GC",
            "-Djava.awt.headless=true",
            f"-Dlog4j.configuration=file:{log4j}",
            f"-Dkafka.logs.dir={folder / 'logs'}",
            "-cp",
            f"{libs}/*",
            "kafka.Kafka",
            str(folder / "server.properties"),
        ]
        with open(self.log_file(node.node_id), "ab") as out:
            proc = subprocess.Popen(
                cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True, cwd=folder
            )
        (folder / _NODE_FILE).write_text(json.dumps({"pid": proc.pid, "started_at": time.time()}) + "\n")
        return proc

    def stop(self, timeout: float = 30.0, *, crash: bool = False, node: int | None = None) -> bool:
        """Stop every node (or only ``node``) gracefully (SIGTERM, then SIGKILL after ``timeout``), or with
        ``crash`` as a crash would (SIGKILL at once: no flush, no controlled shutdown; the data stays for the next
        start). The nodes are signalled together. False if none of them ran."""
        info = self.status()
        if info is None:
            return False
        if node is not None and node not in {n.node_id for n in info.nodes}:
            raise BrokerError(f"the cluster in {self.home} has no node {node} (nodes 1 to {len(info.nodes)})")
        pids = {n.node_id: n.pid for n in info.running if node in (None, n.node_id)}
        for pid in pids.values():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL if crash else signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while any(pid_alive(pid) for pid in pids.values()) and time.monotonic() < deadline:
            for pid in pids.values():
                _reap(pid)
            time.sleep(0.2)
        for pid in pids.values():
            if pid_alive(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            while pid_alive(pid):
                _reap(pid)
                time.sleep(0.1)
            _reap(pid)
        for node_id in pids:
            (self.node_dir(node_id) / _NODE_FILE).unlink(missing_ok=True)
        return bool(pids)

    def _log_tail(self, node_id: int, lines: int = 15) -> str:
        path = self.log_file(node_id)
        if not path.exists():
            return "(no log)"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def _reap(pid: int) -> None:
    """Collect the exit status when the broker is our own child (avoids a zombie)."""
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)
