"""What a platform team sees of a running worker: settings with sources, recommend mode and overrides,
Prometheus metrics scraped during a run, `picrl explain`, JSON logs."""
from __future__ import annotations

import asyncio
import json
import urllib.request
from pathlib import Path

import pytest

from picrl.cli import main
from picrl.datasets import Trace
from picrl.settings import SettingsError, load_settings
from producers.closed_loop import ClosedLoopEnvironment, TickSummary
from picrl.workloads import copies_of
from stream.topics import TopicNames, ensure_topics, topic_specs
from tests.stream.conftest import WINDOW
from tests.support.kafka import unique
from tests.support.processes import picrl_process, tail
from tests.support.web import free_port



def test_settings_come_from_file_then_environment_then_flags(tmp_path: Path) -> None:
    file = tmp_path / "settings.json"
    file.write_text(json.dumps({"partitions": 4, "mode": "recommend", "prefix": "from-file",
                                "services": {"db": {"min_capacity": 2, "max_capacity": 8}}}))
    settings = load_settings(file, {"prefix": "from-flag"}, {"PICRL_PARTITIONS": "6", "PICRL_HEADROOM": "0.25"})
    assert settings["partitions"] == 6 and settings.sources["partitions"] == "env PICRL_PARTITIONS"
    assert settings["mode"] == "recommend" and settings.sources["mode"] == f"file {file}"
    assert settings["prefix"] == "from-flag" and settings.sources["prefix"] == "flag"
    assert settings["headroom"] == 0.25 and settings["guarantee"] == "exactly_once"
    assert settings.services["db"].max_capacity == 8.0
    worker = settings.worker("host:9092")
    assert worker.engine.advisory and worker.partitions == 6 and "db" in worker.engine.overrides
    for bad, message in [({"partitions": 0}, "setting partitions = 0"), ({"mode": "auto"}, "setting mode = 'auto'"),
                         ({"partitons": 3}, r"unknown setting\(s\) partitons"),
                         ({"services": {"db": {"max": 1}}}, "setting services.db")]:
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


def test_config_show_prints_values_and_sources(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                               monkeypatch: pytest.MonkeyPatch) -> None:
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


def test_a_running_worker_is_observable_and_explainable(kafka_bootstrap: str, tiny_model_dir: Path,
                                                        native_trace: Trace, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    prefix = unique("ops")
    asyncio.run(ensure_topics(kafka_bootstrap, topic_specs(prefix, 2)))
    port = free_port()
    workload = copies_of(native_trace, 3, WINDOW + 25, start=900, seed=2)
    frozen = workload.services[2]
    settings = tmp_path / "settings.json"
    settings.write_text(json.dumps({"mode": "recommend", "services": {frozen: {"freeze": 30.0}}}))
    args = ["worker", "--model", str(tiny_model_dir), "--bootstrap", kafka_bootstrap, "--prefix", prefix,
            "--partitions", "2", "--app-id", f"{prefix}-worker", "--web-port", str(port), "--settings", str(settings)]
    scrapes: list[str] = []

    def on_tick(summary: TickSummary) -> None:
        if summary.tick in (WINDOW + 5, WINDOW + 20):
            scrapes.append(_scrape(port))  # during the run

    with picrl_process(args, tmp_path / "worker.log") as worker:
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
    metric = lambda text, name: float(next(l.split()[-1] for l in text.splitlines() if l.startswith(name + " ")))
    assert metric(last, "picrl_events_total") > metric(first, "picrl_events_total") > 0
    for name in ("picrl_censored_events_total", "picrl_decision_latency_seconds_count", "picrl_policy_version",
                 "picrl_policy_age_seconds", "picrl_services", "picrl_censor_streak_max"):
        assert any(line.startswith(name) for line in last.splitlines()), name
    assert 'picrl_actions_total{phase="control"}' in last and 'picrl_consumer_lag{partition=' in last
    logs = [json.loads(line) for line in (tmp_path / "worker.log").read_text().splitlines() if line.startswith("{")]
    assert logs and all({"time", "level", "logger", "message"} <= set(entry) for entry in logs)
    assert "Traceback" not in (tmp_path / "worker.log").read_text(), tail(tmp_path / "worker.log")


def test_the_configuration_reference_lists_every_setting() -> None:
    from picrl.settings import SPECS

    doc = (Path(__file__).resolve().parents[2] / "docs" / "reference" / "configuration.md").read_text()
    for name in SPECS:
        assert f"`{name}` | `PICRL_{name.upper()}`" in doc, name
