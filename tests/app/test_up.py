"""`picrl up` (the README's first command) on the test broker with a tiny model."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import pytest

from picrl.cli import main

TINY = {
    "predictor": {"window": 8, "hidden": 8, "epochs": 2, "max_train_windows": 500},
    "estimator": {"window": 8},
    "policy": {"hidden": 16},
    "pretrain": {"iterations": 2, "chunks": 4, "chunk_len": 16},
    "online": {"n_update": 16, "batch_size": 32, "buffer_size": 256, "gradient_steps": 2},
}


def test_up_runs_worker_trainer_and_closed_loop_then_reports(
    kafka_bootstrap: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PICRL_CACHE", str(tmp_path / "cache"))
    config = tmp_path / "tiny.json"
    config.write_text(json.dumps(TINY))
    out = tmp_path / "up"
    code = main(
        [
            "up",
            "--bootstrap",
            kafka_bootstrap,
            "--config",
            str(config),
            "--services",
            "3",
            "--ticks",
            "60",
            "--out",
            str(out),
        ]
    )
    printed = capsys.readouterr().out
    assert code == 0, printed
    summary = json.loads((out / "metrics.json").read_text())
    assert summary["services"] == 3 and summary["ticks"] == 60 and summary["control_ticks"] == 60 - 8
    assert summary["duplicate_actions"] == 0
    # the trainer's own tally: a short run may publish no version (each must differ and score better), but it
    # trains on the loop's replay, and no version reaches the actions that the trainer did not publish
    tally = re.search(r"trainer: (\d+) version\(s\) published, (\d+) candidate\(s\) skipped", printed)
    assert tally is not None, printed
    published, skipped = int(tally[1]), int(tally[2])
    assert published + skipped >= 1, (out / "trainer.log").read_text()
    assert summary["policy_versions"][0] == 0 and max(summary["policy_versions"]) <= published
    assert summary["metrics"]["mae"] > 0 and summary["metrics"]["regret"] > 0
    for name in ("ticks.csv", "closed_loop.png", "worker.log", "trainer.log"):
        assert (out / name).stat().st_size > 0, name
    assert "| mae | regret |" in printed and "censoring rate" in printed
    assert summary["metrics_native"]["regret"] > 0 and printed.index("| native (") < printed.index("| normalised |")
    assert "how to read these next to `picrl evaluate`" in printed  # the run's metrics are not evaluate's
    assert "stopped after" in (out / "trainer.log").read_text()  # stopped cleanly by SIGTERM


def test_up_with_two_resources_decides_each_pods_memory_and_compute_over_kafka(
    kafka_bootstrap: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PICRL_CACHE", str(tmp_path / "cache"))
    config = tmp_path / "tiny.json"
    config.write_text(json.dumps(TINY))
    out = tmp_path / "up"
    # pods-2r-oom: the memory shortages kill the pod, and the worker is told so (--hard-shortage pod); the pods-2r
    # path (failed requests) runs over Kafka in the chaos test (tests/stream/test_cluster.py)
    code = main(
        [
            "up",
            "--bootstrap",
            kafka_bootstrap,
            "--config",
            str(config),
            "--resources",
            "gpu_mem,gpu_compute",
            "--dataset",
            "pods-2r-oom",
            "--services",
            "2",
            "--ticks",
            "30",
            "--out",
            str(out),
        ]
    )
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert "gpu_mem (hard: a shortage kills the pod), gpu_compute (soft)" in (out / "worker.log").read_text()
    summary = json.loads((out / "metrics.json").read_text())
    assert summary["services"] == 2 and summary["control_ticks"] == 30 - 8 and summary["duplicate_actions"] == 0
    assert set(summary["resources"]) >= {
        "total_regret",
        "regret_gpu_mem",
        "regret_gpu_compute",
        "shortage_gpu_mem",
        "soft_short_with_hard_short",
    }
    assert (out / "resources.png").stat().st_size > 0 and "| gpu_compute |" in printed


def test_up_refuses_resources_its_dataset_does_not_provide(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["up", "--dataset", "genai-mem", "--resources", "gpu_mem,gpu_compute"]) == 2
    assert "dataset genai-mem provides one resource per service" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["up", "--resources", "gpu_mem,gpu_disk"])
    assert "expected distinct names among ['gpu_compute', 'gpu_mem']" in capsys.readouterr().err


def test_up_keeps_only_the_leader_election_retries_off_its_output() -> None:
    from picrl.commands.up import _LeaderElection

    def record(message: str, *args: object) -> logging.LogRecord:
        return logging.LogRecord("aiokafka.consumer.fetcher", logging.ERROR, __file__, 1, message, args, None)

    keep = _LeaderElection().filter
    assert not keep(record("Failed fetch offsets from %s: %s", 1, "[Error 6] NotLeaderForPartitionError: tp"))
    assert keep(record("Failed fetch offsets from %s: %s", 1, "[Error 7] RequestTimedOutError"))
    assert keep(record("Unexpected error in fetcher routine"))
