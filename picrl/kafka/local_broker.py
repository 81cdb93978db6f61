"""A single-node Apache Kafka broker (KRaft mode) that picrl provisions itself.

No container engine is needed: the broker's jars come from Maven Central through ``mvn`` into a
cache folder (once), the storage is formatted with ``kafka.tools.StorageTool`` and the broker runs
as a detached JVM child (``kafka.Kafka``) on free loopback ports. Everything the broker owns lives
in its *home* folder:

    home/server.properties   the config written here (ports, data dir, single-node settings)
    home/data/               the KRaft log directories
    home/broker.json         pid, ports and bootstrap address of the running broker
    home/kafka.log           the broker's console log
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
from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path
from typing import Callable, Iterator

from picrl.kafka.probe import answers_metadata

KAFKA_VERSION = "3.9.1"
MIN_JAVA = 11
_STATE_FILE = "broker.json"
PORT_WAIT = 10.0  # seconds a port taken at start may take to free itself (see _freed)

Log = Callable[[str], None]


class BrokerError(RuntimeError):
    """The local broker could not be provisioned, started or reached; the message says why."""


@dataclass(frozen=True)
class BrokerInfo:
    """Where a running local broker lives."""

    pid: int
    port: int
    controller_port: int
    home: str
    version: str
    started_at: float

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"


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


def port_in_use(port: int) -> bool:
    """Whether something listens on ``port``. SO_REUSEADDR, as the broker's own listener sets it, so
    connections of a just-stopped broker lingering in TIME_WAIT do not count as "taken"."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
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
            raise BrokerError("Maven (`mvn`) is not on PATH: it is needed once to fetch Kafka's jars from Maven Central")
        build = target / "build"
        shutil.rmtree(build, ignore_errors=True)
        build.mkdir(parents=True)
        pom = resources.files("picrl.kafka").joinpath("pom.xml").read_text()
        (build / "pom.xml").write_text(pom.replace("${kafka.version}", version))
        staging = build / "libs"
        log(f"fetching Apache Kafka {version} jars from Maven Central into {libs} (first use only)...")
        started = time.monotonic()
        proc = subprocess.run(
            [mvn, "-B", "-q", "-f", str(build / "pom.xml"), "dependency:copy-dependencies",
             f"-DoutputDirectory={staging}", "-DincludeScope=runtime"],
            capture_output=True, text=True,
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


def server_properties(port: int, controller_port: int, data_dir: Path) -> str:
    """Broker config for one node that is broker and controller at once.

    Internal topics (consumer offsets, transaction state) get replication factor 1 and min ISR 1,
    without which consumer groups and exactly-once transactions cannot start on a single node.
    """
    return "\n".join([
        "process.roles=broker,controller",
        "node.id=1",
        f"controller.quorum.voters=1@127.0.0.1:{controller_port}",
        f"listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}",
        f"advertised.listeners=PLAINTEXT://127.0.0.1:{port}",
        "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "controller.listener.names=CONTROLLER",
        "inter.broker.listener.name=PLAINTEXT",
        f"log.dirs={data_dir}",
        "num.partitions=1",
        "default.replication.factor=1",
        "min.insync.replicas=1",
        "offsets.topic.replication.factor=1",
        "offsets.topic.num.partitions=8",
        "transaction.state.log.replication.factor=1",
        "transaction.state.log.min.isr=1",
        "transaction.state.log.num.partitions=8",
        "group.initial.rebalance.delay.ms=0",
        "auto.create.topics.enable=true",
        "delete.topic.enable=true",
        "log.retention.hours=168",
        "",
    ])


def _read_ports(props: Path) -> tuple[int, int]:
    text = props.read_text()
    port = re.search(r"PLAINTEXT://127\.0\.0\.1:(\d+)", text)
    ctrl = re.search(r"CONTROLLER://127\.0\.0\.1:(\d+)", text)
    if not port or not ctrl:
        raise BrokerError(f"{props} does not name the loopback listeners picrl writes; remove the folder to start over")
    return int(port.group(1)), int(ctrl.group(1))


def new_cluster_id() -> str:
    """A random Kafka cluster id (base64url UUID). Like Kafka's own ``Uuid.randomUuid`` it never
    starts with '-', which the storage tool's argument parser would read as an option."""
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cluster_id.startswith("-"):
            return cluster_id


class LocalKafka:
    """Start, stop and inspect the project-provisioned broker living in ``home``."""

    def __init__(self, home: Path | None = None, cache: Path | None = None, *, port: int | None = None,
                 heap_mb: int = 768, log: Log = print) -> None:
        self.home = (home or default_home()).resolve()
        self.cache = (cache or default_cache()).resolve()
        self.requested_port = port
        self.heap_mb = heap_mb
        self.log = log

    @property
    def state_file(self) -> Path:
        return self.home / _STATE_FILE

    @property
    def log_file(self) -> Path:
        return self.home / "kafka.log"

    def status(self) -> BrokerInfo | None:
        """The running broker of this home, or None (a stale state file is removed)."""
        if not self.state_file.exists():
            return None
        try:
            info = BrokerInfo(**json.loads(self.state_file.read_text()))
        except (ValueError, TypeError) as exc:
            raise BrokerError(f"{self.state_file} is not a picrl broker state file ({exc}); remove it") from exc
        if not pid_alive(info.pid):
            self.state_file.unlink(missing_ok=True)
            return None
        return info

    def _java(self) -> str:
        java_home = os.environ.get("JAVA_HOME")
        java = str(Path(java_home) / "bin" / "java") if java_home else shutil.which("java")
        if not java or not Path(java).exists():
            raise BrokerError("Java was not found (no `java` on PATH and no JAVA_HOME): install a JDK 17, "
                              "e.g. `apt-get install openjdk-17-jre-headless`")
        major = java_major_version(java)
        if major < MIN_JAVA:
            raise BrokerError(f"Kafka {KAFKA_VERSION} needs Java {MIN_JAVA}+ (17 recommended); found Java {major} at {java}")
        return java

    def _configure(self, java: str, libs: Path) -> tuple[int, int]:
        """Write server.properties and format storage on first use; return (port, controller_port)."""
        props = self.home / "server.properties"
        data = self.home / "data"
        if (data / "meta.properties").exists() and props.exists():
            port, controller_port = _read_ports(props)
            if self.requested_port not in (None, port):
                raise BrokerError(f"the broker in {self.home} was formatted for port {port}; "
                                  f"stop and remove that folder to use port {self.requested_port}")
            return port, controller_port
        port = self.requested_port or free_port()
        controller_port = free_port()
        while controller_port == port:
            controller_port = free_port()
        self.home.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(data, ignore_errors=True)
        props.write_text(server_properties(port, controller_port, data))
        cluster_id = new_cluster_id()
        proc = subprocess.run(
            [java, "-cp", f"{libs}/*", "kafka.tools.StorageTool", "format", "-t", cluster_id, "-c", str(props)],
            capture_output=True, text=True, timeout=120,
        )
        if proc.returncode != 0:
            raise BrokerError(f"formatting Kafka storage failed: {(proc.stdout + proc.stderr).strip()[-800:]}")
        return port, controller_port

    def start(self, timeout: float = 120.0) -> BrokerInfo:
        """Start the broker (fetching jars and formatting storage on first use) and wait until it
        answers metadata requests. Returns the running broker if it is already up."""
        running = self.status()
        if running is not None:
            if answers_metadata(running.bootstrap):
                return running
            raise BrokerError(f"broker pid {running.pid} from {self.home} is alive but does not answer on "
                              f"{running.bootstrap}; run `picrl kafka stop` first")
        java = self._java()
        libs = fetch_kafka_jars(self.cache, self.log)
        port, controller_port = self._configure(java, libs)
        for taken in (p for p in (port, controller_port) if not _freed(p, PORT_WAIT)):
            raise BrokerError(f"port {taken} on 127.0.0.1 is taken by another process; "
                              f"free it, or pick another port (`picrl kafka start --port N` with a new --home)")
        log4j = resources.files("picrl.kafka").joinpath("log4j.properties")
        cmd = [
            java, "-Xms128m", f"-Xmx{self.heap_mb}m", "-XX:+UseG1GC", "-Djava.awt.headless=true",
            f"-Dlog4j.configuration=file:{log4j}", f"-Dkafka.logs.dir={self.home / 'logs'}",
            "-cp", f"{libs}/*", "kafka.Kafka", str(self.home / "server.properties"),
        ]
        with open(self.log_file, "ab") as out:
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True, cwd=self.home)
        info = BrokerInfo(pid=proc.pid, port=port, controller_port=controller_port, home=str(self.home),
                          version=KAFKA_VERSION, started_at=time.time())
        self.state_file.write_text(json.dumps(asdict(info), indent=2) + "\n")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                self.state_file.unlink(missing_ok=True)
                raise BrokerError(f"the broker exited with code {proc.returncode} while starting; "
                                  f"last lines of {self.log_file}:\n{self._log_tail()}")
            if answers_metadata(info.bootstrap):
                return info
            time.sleep(0.25)
        self.stop()
        raise BrokerError(f"the broker did not answer metadata requests on {info.bootstrap} within {timeout:.0f} s; "
                          f"last lines of {self.log_file}:\n{self._log_tail()}")

    def stop(self, timeout: float = 30.0, *, crash: bool = False) -> bool:
        """Stop the broker gracefully (SIGTERM, then SIGKILL after ``timeout``), or with ``crash`` as a crash
        would (SIGKILL at once: no flush, no controlled shutdown; the data stays for the next start).
        False if none ran."""
        info = self.status()
        if info is None:
            return False
        with contextlib.suppress(ProcessLookupError):
            os.kill(info.pid, signal.SIGKILL if crash else signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while pid_alive(info.pid) and time.monotonic() < deadline:
            _reap(info.pid)
            time.sleep(0.2)
        if pid_alive(info.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(info.pid, signal.SIGKILL)
            while pid_alive(info.pid):
                _reap(info.pid)
                time.sleep(0.1)
        _reap(info.pid)
        self.state_file.unlink(missing_ok=True)
        return True

    def _log_tail(self, lines: int = 15) -> str:
        if not self.log_file.exists():
            return "(no log)"
        return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])


def _reap(pid: int) -> None:
    """Collect the exit status when the broker is our own child (avoids a zombie)."""
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)
