"""A real Prometheus server (Debian's `prometheus` package) scrapes a running worker and trainer at their
default paths, loads the recommended alerting rules and evaluates the long-streak alert on a worker
whose service is censored tick after tick."""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
import urllib.parse
from pathlib import Path

from stream.topics import TopicNames, ensure_topics, topic_specs
from tests.stream.conftest import WINDOW
from tests.support.kafka import produce, unique, usage_json
from tests.support.processes import picrl_process, require_program, stop, tail
from tests.support.prometheus import wait_until_ready
from tests.support.web import free_port, http_get

RULES = Path(__file__).resolve().parents[2] / "docs" / "prometheus" / "picrl-alerts.yml"


def _query(port: int, expression: str) -> list[dict]:
    status, body = http_get(port, "/api/v1/query?query=" + urllib.parse.quote(expression))
    assert status == 200, body
    return body["data"]["result"]  # type: ignore[index]


def test_prometheus_scrapes_worker_and_trainer_and_the_streak_alert_goes_off(
    kafka_bootstrap: str, tiny_model_dir: Path, tmp_path: Path
) -> None:
    prometheus_program = require_program("prometheus", "prometheus")
    prefix = unique("prom")
    asyncio.run(ensure_topics(kafka_bootstrap, topic_specs(prefix, 2)))
    web_port, metrics_port, prometheus_port = free_port(), free_port(), free_port()
    common = ["--model", str(tiny_model_dir), "--bootstrap", kafka_bootstrap, "--prefix", prefix, "--partitions", "2"]
    config = tmp_path / "prometheus.yml"
    config.write_text(
        json.dumps(
            {  # YAML is a superset of JSON
                "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                "rule_files": [str(RULES)],
                "scrape_configs": [
                    {"job_name": "picrl-worker", "static_configs": [{"targets": [f"127.0.0.1:{web_port}"]}]},
                    {"job_name": "picrl-trainer", "static_configs": [{"targets": [f"127.0.0.1:{metrics_port}"]}]},
                ],
            }
        )
    )
    with (
        picrl_process(
            ["worker", *common, "--app-id", f"{prefix}-worker", "--web-port", str(web_port)], tmp_path / "worker.log"
        ) as worker,
        picrl_process(["trainer", *common, "--metrics-port", str(metrics_port)], tmp_path / "trainer.log"),
        open(tmp_path / "prometheus.log", "wb") as prometheus_log,
    ):
        prometheus = subprocess.Popen(
            [
                prometheus_program,
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{prometheus_port}",
            ],
            stdout=prometheus_log,
            stderr=subprocess.STDOUT,
        )
        try:
            wait_until_ready(prometheus_port, tmp_path / "prometheus.log")
            # one service short of capacity on every tick: its censoring streak grows past the alert's 10
            produce(
                kafka_bootstrap,
                TopicNames(prefix).usage,
                [(b"short", usage_json("short", t, 10.0, 10.0, censored=True)) for t in range(WINDOW + 15)],
            )
            deadline, up, alerts, streak = time.monotonic() + 120, [], [], []
            while time.monotonic() < deadline:
                up = [(r["metric"]["job"], r["value"][1]) for r in _query(prometheus_port, "up")]
                streak = [r["value"][1] for r in _query(prometheus_port, "picrl_censor_streak_max")]
                alerts = [
                    a
                    for a in http_get(prometheus_port, "/api/v1/alerts")[1]["data"]["alerts"]  # type: ignore[index]
                    if a["labels"]["alertname"] == "PicrlServiceInLongCensorStreak"
                ]
                if sorted(up) == [("picrl-trainer", "1"), ("picrl-worker", "1")] and alerts:
                    break
                time.sleep(1)
            groups = http_get(prometheus_port, "/api/v1/rules")[1]["data"]["groups"]  # type: ignore[index]
            health = {rule["health"] for group in groups for rule in group["rules"]}
            assert worker.poll() is None, tail(tmp_path / "worker.log")
        finally:
            stop(prometheus)
    assert sorted(up) == [("picrl-trainer", "1"), ("picrl-worker", "1")], (up, tail(tmp_path / "prometheus.log"))
    assert streak and float(streak[0]) >= 10, (streak, tail(tmp_path / "worker.log"))
    assert alerts and alerts[0]["state"] in ("pending", "firing"), alerts
    assert health == {"ok"}, health
