"""What a platform team sees of a running worker: settings with sources, recommend mode and overrides,
Prometheus metrics scraped during a run from the web server that is on by default, `picrl explain`, one log
format per process, expected start-up states at info, and a clear end when Kafka does not answer."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import socket
import time
import urllib.request
from datetime import datetime
from pathlib import Path

import pytest

from picrl.cli import main
from picrl.commands import explain
from picrl.commands.bus import FIRST_PROBE, RETRIED_STATES, RetriedStates
from picrl.commands.worker import WEB_PORT, _claims, instance_id, web_port
from picrl.datasets import Trace
from picrl.settings import Settings, SettingsError, load_settings
from picrl.workloads import copies_of
from producers.closed_loop import ClosedLoopEnvironment, TickSummary
from stream.membership import GroupLog, StaticLeaveGroup
from stream.topics import TopicNames, ensure_topics, topic_specs
from tests.stream.conftest import WINDOW
from tests.support.kafka import unique
from tests.support.processes import Started, picrl_process, spawn, stop, tail, worker_args
from tests.support.web import free_port


def test_settings_come_from_file_then_environment_then_flags(tmp_path: Path) -> None:
    file = tmp_path / "settings.json"
    file.write_text(
        json.dumps(
            {
                "partitions": 4,
                "mode": "recommend",
                "prefix": "from-file",
                "services": {"db": {"min_capacity": 2, "max_capacity": 8}},
            }
        )
    )
    settings = load_settings(file, {"prefix": "from-flag"}, {"PICRL_PARTITIONS": "6", "PICRL_HEADROOM": "0.25"})
    assert settings["partitions"] == 6 and settings.sources["partitions"] == "env PICRL_PARTITIONS"
    assert settings["mode"] == "recommend" and settings.sources["mode"] == f"file {file}"
    assert settings["prefix"] == "from-flag" and settings.sources["prefix"] == "flag"
    assert settings["headroom"] == 0.25 and settings["guarantee"] == "exactly_once"
    assert settings.services["db"].max_capacity == 8.0
    worker = settings.worker("host:9092")
    assert worker.engine.advisory and worker.partitions == 6 and "db" in worker.engine.overrides
    for bad, message in [
        ({"partitions": 0}, "setting partitions = 0"),
        ({"mode": "auto"}, "setting mode = 'auto'"),
        ({"partitons": 3}, r"unknown setting\(s\) partitons"),
        ({"services": {"db": {"max": 1}}}, "setting services.db"),
    ]:
        file.write_text(json.dumps(bad))
        with pytest.raises(SettingsError, match=message):
            load_settings(file, environ={})
    with pytest.raises(SettingsError, match=r"PICRL_BATCH_MAX"):
        load_settings(None, environ={"PICRL_BATCH_MAX": "many"})
    pods = load_settings(None, {"resources": "gpu_mem,gpu_compute"}, {"PICRL_HARD_SHORTAGE": "pod"}).worker("h:9092")
    assert [(r.name, r.kills) for r in pods.engine.resources] == [("gpu_mem", True), ("gpu_compute", False)]
    with pytest.raises(SettingsError, match="setting hard_shortage = 'oom'"):
        load_settings(None, environ={"PICRL_HARD_SHORTAGE": "oom"})
    with pytest.raises(SettingsError, match="hard_shortage = pod .* needs resources"):
        load_settings(None, environ={"PICRL_HARD_SHORTAGE": "pod"}).worker("h:9092")


def test_config_show_prints_values_and_sources(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PICRL_MAX_KL", "0.2")
    assert main(["config", "show"]) == 0
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()}
    assert "0.2" in lines["max_kl"] and "env PICRL_MAX_KL" in lines["max_kl"]
    assert "default" in lines["prefix"]
    monkeypatch.setenv("PICRL_MODE", "sometimes")
    assert main(["config", "show"]) == 2
    assert "setting mode = 'sometimes' (from env PICRL_MODE)" in capsys.readouterr().err


def _scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:  # Prometheus's default path
        return response.read().decode()


def test_a_running_worker_is_observable_and_explainable(
    kafka_bootstrap: str, tiny_model_dir: Path, native_trace: Trace, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    prefix = unique("ops")
    asyncio.run(ensure_topics(kafka_bootstrap, topic_specs(prefix, 2)))
    workload = copies_of(native_trace, 3, WINDOW + 25, start=900, seed=2)
    frozen = workload.services[2]
    settings = tmp_path / "settings.json"
    settings.write_text(json.dumps({"mode": "recommend", "services": {frozen: {"freeze": 30.0}}}))
    args = worker_args(  # web server: default
        tiny_model_dir, kafka_bootstrap, prefix, "--settings", str(settings), partitions=2, log_level="info"
    )
    scrapes: list[str] = []

    def on_tick(summary: TickSummary) -> None:
        if summary.tick in (WINDOW + 5, WINDOW + 20):
            scrapes.append(_scrape(port))  # during the run

    with picrl_process(args, tmp_path / "worker.log") as worker:
        port = _logged_web_port(tmp_path / "worker.log", worker)
        assert port >= WEB_PORT  # the default, or the next free port when another worker here has it
        env = ClosedLoopEnvironment(kafka_bootstrap, TopicNames(prefix), workload, action_timeout=120, on_tick=on_tick)
        record = asyncio.run(env.run())
        assert main(["explain", workload.services[0], "--url", f"http://127.0.0.1:{port}"]) == 0
        explained = capsys.readouterr().out
        assert main(["explain", "nobody", "--url", f"http://127.0.0.1:{port}"]) == 1
        assert "not held by this worker" in capsys.readouterr().out
        assert worker.poll() is None
    assert f"service {workload.services[0]}: control" in explained and "k*sigma" in explained
    assert "(advisory)" in explained  # recommend mode
    assert (record.capacity[1:, 2] == 30.0).all()  # frozen by the operator
    first, last = scrapes

    def metric(text: str, name: str) -> float:
        return float(next(line.split()[-1] for line in text.splitlines() if line.startswith(name + " ")))

    assert metric(last, "picrl_events_total") > metric(first, "picrl_events_total") > 0
    for name in (
        "picrl_censored_events_total",
        "picrl_decision_latency_seconds_count",
        "picrl_policy_version",
        "picrl_policy_age_seconds",
        "picrl_services",
        "picrl_censor_streak_max",
    ):
        assert any(line.startswith(name) for line in last.splitlines()), name
    assert 'picrl_actions_total{phase="control"}' in last and "picrl_consumer_lag{partition=" in last
    logs = [json.loads(line) for line in (tmp_path / "worker.log").read_text().splitlines() if line.startswith("{")]
    assert logs and all({"time", "level", "logger", "message"} <= set(entry) for entry in logs)
    assert not [e for e in logs if e["level"] != "info" and any(text in e["message"] for text in RETRIED_STATES)]
    assert "Traceback" not in (tmp_path / "worker.log").read_text(), tail(tmp_path / "worker.log")


def _logged_web_port(log: Path, process: Started, wait: float = 120.0) -> int:
    """The port of the web server a starting worker names in its log."""
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        found = re.search(r"web server: http://127\.0\.0\.1:(\d+)", log.read_text() if log.exists() else "")
        if found:
            return int(found.group(1))
        assert process.poll() is None, tail(log)
        time.sleep(0.2)
    raise AssertionError(f"the worker logged no web server URL within {wait:.0f} s:\n{tail(log)}")


def test_the_web_server_is_on_by_default_and_two_workers_do_not_clash() -> None:
    assert load_settings(None, environ={})["web_port"] == WEB_PORT == 6066
    assert explain.WEB_PORT == WEB_PORT  # `picrl explain` asks the default port
    assert web_port(load_settings(None, {"web_port": 0}, {})) is None  # 0: off
    with socket.socket() as taken:  # a port another worker on this host serves on
        taken.bind(("", 0))
        taken.listen()
        port = taken.getsockname()[1]
        default = Settings({"web_port": port}, {"web_port": "default"})
        assert web_port(default) > port
        with pytest.raises(SettingsError, match=f"web_port = {port} \\(from flag\\): the port is taken"):
            web_port(Settings({"web_port": port}, {"web_port": "flag"}))
    # two workers starting together: the second gives way before the first has bound the port it claimed
    free = free_port()
    claimed = [web_port(Settings({"web_port": free}, {"web_port": "default"})) for _ in range(2)]
    assert claimed[0] == free and claimed[1] > free


def test_workers_of_one_host_take_distinct_static_ids_and_a_restart_takes_its_own_back(tmp_path: Path) -> None:
    app = f"ids-{tmp_path.name}"
    auto = Settings({"instance_id": "auto", "app_id": app}, {"instance_id": "default", "app_id": "flag"})
    first, second = instance_id(auto), instance_id(auto)  # one process stands for two workers: both locks held
    assert first == f"{socket.gethostname()}-0" and second == f"{socket.gethostname()}-1"
    claimed = _claims.pop()  # the second worker dies: its lock goes with it
    claimed.close()
    assert instance_id(auto) == second  # its restart is the same static member
    assert instance_id(Settings({"instance_id": "gpu-a"}, {"instance_id": "flag"})) == "gpu-a"
    assert instance_id(load_settings(None, {"instance_id": "none"}, {})) is None  # a dynamic member
    request = StaticLeaveGroup("g", "vm-1").prepare({13: (0, 3)})
    assert request.API_VERSION == 3 and request.encode().endswith(b"\x00\x00\x00\x01\x00\x00\x00\x04vm-1")


def test_retried_start_up_states_are_logged_at_info() -> None:
    def record(name: str, level: int, message: str) -> logging.LogRecord:
        return logging.LogRecord(name, level, __file__, 1, message, None, None)

    expected = [
        record(
            "aiokafka.consumer.group_coordinator",
            logging.ERROR,
            "Group Coordinator Request failed: [Error 15] GroupCoordinatorNotAvailableError",
        ),
        record(
            "aiokafka.consumer.group_coordinator", logging.WARNING, "Marking the coordinator dead (node 1)for group g."
        ),
        record(
            "aiokafka.producer.sender",
            logging.WARNING,
            "Got error produce response on topic-partition "
            "TopicPartition(topic='t', partition=0), retrying. Error: NotEnoughReplicasError",
        ),
    ]
    other = [
        record("aiokafka.producer.sender", logging.ERROR, "Unexpected error during InitProducerIdRequest: X"),
        record("picrl.worker", logging.WARNING, "NotEnoughReplicasError seen by picrl itself"),
    ]
    retried = RetriedStates()
    root = logging.getLogger()
    previous = root.level
    try:
        root.setLevel(logging.INFO)
        assert all(retried.filter(r) and r.levelname == "INFO" for r in expected)
        assert all(retried.filter(r) and r.levelno > logging.INFO for r in other)
        root.setLevel(logging.WARNING)  # --log-level warning: the demoted lines are left out
        assert not retried.filter(
            record(
                "aiokafka.consumer.group_coordinator",
                logging.WARNING,
                "Marking the coordinator dead (node 1)for group g.",
            )
        )
    finally:
        root.setLevel(previous)


def test_an_unreachable_bootstrap_ends_with_one_clear_line(
    tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--bootstrap 127.0.0.1:1`: the worker and the trainer say they wait, wait --bootstrap-timeout seconds, log
    one error line (in their one log format) and exit 2; `picrl produce` does the same with CLI lines. Only the
    least wait is checked: a loaded host may take longer."""
    common = ["--model", str(tiny_model_dir), "--bootstrap", "127.0.0.1:1", "--bootstrap-timeout", "5"]
    logs = {name: tmp_path / f"{name}.log" for name in ("worker", "trainer")}
    processes = {name: spawn([name, *common], log) for name, log in logs.items()}  # side by side: 2 cores
    try:
        codes = {name: process.wait(120) for name, process in processes.items()}
    finally:
        for process in processes.values():
            stop(process)
    for name, log in logs.items():
        lines = log.read_text().splitlines()
        assert codes[name] == 2 and lines, tail(log)
        entries = [json.loads(line) for line in lines]  # nothing but JSON, the default format
        errors = [e for e in entries if e["level"] == "error"]
        said = [e for e in entries if e["level"] != "info"]  # info may say which web port a worker took
        assert len(errors) == 1 and len(said) <= 2, tail(log)
        assert "Kafka at 127.0.0.1:1 did not answer within 5 s" in errors[0]["message"]
        waited = [e for e in entries if "waiting up to 5 s" in e["message"]]
        seconds = datetime.fromisoformat(errors[0]["time"]) - datetime.fromisoformat(waited[0]["time"])
        assert seconds.total_seconds() >= 5 - FIRST_PROBE, f"{name} waited {seconds}"
    began = time.monotonic()
    assert (
        main(
            [
                "produce",
                "replay",
                "--dataset",
                "genai-mem",
                "--services",
                "1",
                "--ticks",
                "2",
                "--rate",
                "10",
                "--bootstrap",
                "127.0.0.1:1",
                "--bootstrap-timeout",
                "5",
            ]
        )
        == 2
    )
    assert time.monotonic() - began >= 5
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "picrl produce: Kafka at 127.0.0.1:1 does not answer yet; waiting up to 5 s (--bootstrap-timeout sets the "
        "wait)",
        "picrl produce: error: Kafka at 127.0.0.1:1 did not answer within 5 s: check --bootstrap and that "
        "the brokers run (--bootstrap-timeout sets the wait)",
    ]


def test_the_configuration_reference_lists_every_setting() -> None:
    from picrl.settings import SPECS

    doc = (Path(__file__).resolve().parents[2] / "docs" / "reference" / "configuration.md").read_text()
    for name in SPECS:
        assert f"`{name}` | `PICRL_{name.upper()}`" in doc, name


def test_a_first_start_says_it_joined_and_later_rebalances_say_what_it_holds(caplog: pytest.LogCaptureFixture) -> None:
    held = {0, 3}
    group_log = GroupLog("picrl-worker", "host-0", lambda: held)
    with caplog.at_level(logging.INFO, logger="picrl.worker"):
        asyncio.run(group_log.on_rebalance_complete(None))
        held.add(1)
        asyncio.run(group_log.on_rebalance_complete(None))
    assert [r.getMessage() for r in caplog.records] == [
        "joined group picrl-worker as static member host-0: usage partitions [0, 3]",
        "group picrl-worker rebalanced: usage partitions [0, 1, 3]",
    ]
