"""The offline CLI end to end on a small user CSV: train, evaluate, cache reuse and clear errors."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from picrl.cli import main
from picrl_core.methods.headroom import HEADROOMS
from picrl_core.synthetic import diurnal

TINY = {
    "predictor": {"window": 8, "hidden": 8, "epochs": 3, "max_train_windows": 500},
    "pretrain": {"iterations": 3, "chunks": 8, "chunk_len": 32},
    "online": {"n_update": 16, "batch_size": 32},
}


@pytest.fixture(scope="module")
def tiny_config(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("config") / "tiny.json"
    path.write_text(json.dumps(TINY))
    return str(path)


@pytest.fixture(scope="module")
def trace_csv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("trace") / "usage.csv"
    demand = 40.0 + 100.0 * diurnal(420, period=48, seed=3)
    rows = "\n".join(f"{60 * i},{v:.4f}" for i, v in enumerate(demand))
    path.write_text("t,gpu_mem_gib\n" + rows + "\n")
    return path


def test_train_then_evaluate_with_the_model(
    trace_csv: Path, tiny_config: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = ["--trace", str(trace_csv), "--column", "gpu_mem_gib", "--time-column", "t", "--config", tiny_config]
    assert main(["train", *source, "--out", str(tmp_path / "model")]) == 0
    out = capsys.readouterr().out
    assert "phase 1: validation MAE" in out and "phase 2: value loss" in out
    assert "phase 3: a new service starts at margin" in out  # the validation run's levels (start_from_validation)
    for name in ("weights.safetensors", "artifact.json", "training.json", "training.png"):
        assert (tmp_path / "model" / name).is_file(), name
    start = json.loads((tmp_path / "model" / "training.json").read_text())["phase3_start"]
    calibrator = json.loads((tmp_path / "model" / "artifact.json").read_text())["config"]["calibrator"]
    assert (calibrator["initial_margin"], calibrator["initial_scale"]) == (start["margin_in_sigma"], start["scale"])
    model = ["--model", str(tmp_path / "model")]
    assert main(["evaluate", *source, *model, "--protocol", "paper", "--out", str(tmp_path / "eval")]) == 0
    assert "| units | mae | regret | shortage_rate |" in capsys.readouterr().out
    report = json.loads((tmp_path / "eval" / "metrics.json").read_text())
    assert report["test_ticks"] == 84 and report["protocol"] == "paper" and report["above_peak"] is None
    assert 0.0 <= report["metrics"]["mae"] < 0.5 and report["metrics"]["steps"] == 84
    low, high = report["training_range"]
    assert report["metrics_native"]["regret"] == pytest.approx(report["metrics"]["regret"] * (high - low))
    trajectory = _columns(tmp_path / "eval" / "trajectory.csv")
    assert len(trajectory) == 14 and trajectory["tick"].shape == (84,)
    demand, action, observed, censored = (trajectory[k] for k in ("demand", "action", "observed", "censored"))
    np.testing.assert_allclose(observed, np.minimum(demand, action), atol=1e-5)
    np.testing.assert_array_equal(censored == 1, demand > action)
    np.testing.assert_allclose(trajectory["demand_native"], low + demand * (high - low), rtol=1e-5)
    np.testing.assert_allclose(trajectory["action_native"], low + action * (high - low), rtol=1e-5)
    assert (tmp_path / "eval" / "phase3.png").stat().st_size > 10_000


def _columns(path: Path) -> dict[str, np.ndarray]:
    table = np.genfromtxt(path, delimiter=",", names=True)
    return {name: table[name] for name in table.dtype.names or ()}


def test_evaluate_scores_what_the_worker_does_by_default(
    tiny_config: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A trace whose test part grows 1.5x past its training peak: the product protocol (the default) scores the
    unclipped demand in native units with the shortfall above the peak; the paper's clips it to the peak."""
    t = np.arange(420)
    demand = 40.0 + 100.0 * diurnal(420, period=48, seed=3) * np.where(t >= 336, 1.5, 1.0)
    path = tmp_path / "growing.csv"
    path.write_text("t,gpu_mem_gib\n" + "".join(f"{60 * i},{v:.4f}\n" for i, v in enumerate(demand)))
    source = ["--trace", str(path), "--column", "gpu_mem_gib", "--time-column", "t", "--config", tiny_config]
    assert main(["train", *source, "--out", str(tmp_path / "model")]) == 0
    model = ["--model", str(tmp_path / "model")]
    assert main(["evaluate", *source, *model, "--out", str(tmp_path / "product")]) == 0
    assert main(["evaluate", *source, *model, "--protocol", "paper", "--out", str(tmp_path / "paper")]) == 0
    assert "product protocol" in capsys.readouterr().out
    product, paper = (json.loads((tmp_path / p / "metrics.json").read_text()) for p in ("product", "paper"))
    peak = product["training_range"][1]
    test = demand[-84:]
    assert product["protocol"] == "product" and test.max() > 1.2 * peak
    above = product["above_peak"]
    assert above["ticks_above_peak"] == float((np.round(test, 4) > peak).sum()) > 0
    assert above["shortfall_above_peak"] > 0 and above["catch_up_ticks"] >= 0
    rows = _columns(tmp_path / "product" / "trajectory.csv")
    np.testing.assert_allclose(rows["demand_native"], test, rtol=1e-5)  # unclipped
    np.testing.assert_array_equal(rows["censored"] == 1, rows["demand_native"] > rows["action_native"])
    clipped = _columns(tmp_path / "paper" / "trajectory.csv")["demand_native"]
    assert clipped.max() == pytest.approx(peak, rel=1e-5)
    assert product["metrics_native"]["regret"] > paper["metrics_native"]["regret"]  # the growth is not free
    assert (tmp_path / "product" / "trajectory.png").stat().st_size > 10_000


def test_train_another_method_and_a_worker_refuses_its_model_for_pic_rl(
    trace_csv: Path, tiny_config: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = ["--trace", str(trace_csv), "--column", "gpu_mem_gib", "--time-column", "t", "--config", tiny_config]
    assert main(["train", *source, "--method", "recent-max", "--out", str(tmp_path / "model")]) == 0
    manifest = json.loads((tmp_path / "model" / "artifact.json").read_text())
    assert manifest["method"] == "recent-max" and manifest["networks"] == {}
    assert manifest["parameters"]["window"] == 60 and manifest["parameters"]["headroom"] in HEADROOMS
    capsys.readouterr()
    worker = ["worker", "--model", str(tmp_path / "model"), "--bootstrap", "127.0.0.1:1", "--log-format", "text"]
    assert main([*worker, "--method", "pic-rl"]) == 2  # refused before any broker is reached
    assert "the model serves 'recent-max', not 'pic-rl': train one with picrl train --method pic-rl" in (
        capsys.readouterr().err
    )


def test_evaluate_trains_once_then_reuses_the_cache(
    trace_csv: Path, tiny_config: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = [
        "evaluate",
        "--trace",
        str(trace_csv),
        "--column",
        "gpu_mem_gib",
        "--config",
        tiny_config,
        "--cache",
        str(tmp_path / "cache"),
    ]
    assert main([*args, "--out", str(tmp_path / "first")]) == 0
    out = capsys.readouterr().out
    assert "trained and cached" in out
    above = next(line for line in out.splitlines() if line.startswith("above the training peak: "))
    peak = json.loads((tmp_path / "first" / "metrics.json").read_text())["above_peak"]
    assert above.count(" n/a") == sum(v is None for v in peak.values()) and "None" not in above  # 4 digits or n/a
    assert main([*args, "--out", str(tmp_path / "second")]) == 0
    assert "cached model" in capsys.readouterr().out
    first = json.loads((tmp_path / "first" / "metrics.json").read_text())["metrics"]
    second = json.loads((tmp_path / "second" / "metrics.json").read_text())["metrics"]
    assert first == second, "same trace, seed and cached model must give the same run"


@pytest.mark.parametrize(
    ("content", "column", "message"),
    [
        ("t,x\n" + "".join(f"{i},5\n" for i in range(300)), "x", "constant"),
        ("t,x\n" + "".join(f"{i},{i % 7}\n" for i in range(50)), "x", "too short|at least"),
        ("t,x\n0,1\n1,abc\n" + "".join(f"{i},{i % 7}\n" for i in range(2, 300)), "x", "abc"),
        ("t,x\n" + "".join(f"{i},{i % 7}\n" for i in range(300)), "missing", "available"),
    ],
)
def test_unusable_input_is_one_clear_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str, column: str, message: str
) -> None:
    path = tmp_path / "bad.csv"
    path.write_text(content)
    code = main(
        [
            "evaluate",
            "--trace",
            str(path),
            "--column",
            column,
            "--quick",
            "--out",
            str(tmp_path / "out"),
            "--cache",
            str(tmp_path / "cache"),
        ]
    )
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("picrl evaluate: error: ") and len(err.strip().splitlines()) == 1
    assert __import__("re").search(message, err), err


def test_bad_config_file_names_the_setting(trace_csv: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"pretrain": {"iteratons": 5}}))
    assert (
        main(
            [
                "train",
                "--trace",
                str(trace_csv),
                "--column",
                "gpu_mem_gib",
                "--config",
                str(bad),
                "--out",
                str(tmp_path / "m"),
            ]
        )
        == 2
    )
    assert "config.pretrain: unknown setting(s) iteratons" in capsys.readouterr().err


def test_missing_trace_file_and_missing_column_flag(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "--trace", str(tmp_path / "nope.csv"), "--column", "x", "--out", str(tmp_path)]) == 2
    assert "nope.csv" in capsys.readouterr().err
    assert main(["train", "--trace", str(tmp_path / "nope.csv"), "--out", str(tmp_path)]) == 2
    assert "--column" in capsys.readouterr().err
