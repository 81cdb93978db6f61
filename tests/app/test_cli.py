"""The offline CLI end to end on a small user CSV: train, evaluate, cache reuse and clear errors."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from picrl.cli import main
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
    assert main(["evaluate", *source, "--model", str(tmp_path / "model"), "--out", str(tmp_path / "eval")]) == 0
    assert "| mae | regret | shortage_rate |" in capsys.readouterr().out
    report = json.loads((tmp_path / "eval" / "metrics.json").read_text())
    assert report["test_ticks"] == 84
    assert 0.0 <= report["metrics"]["mae"] < 0.5 and report["metrics"]["steps"] == 84
    trajectory = np.loadtxt(tmp_path / "eval" / "trajectory.csv", delimiter=",", skiprows=1)
    assert trajectory.shape == (84, 12)
    demand, action, observed, censored = trajectory[:, 1], trajectory[:, 2], trajectory[:, 3], trajectory[:, 4]
    np.testing.assert_allclose(observed, np.minimum(demand, action), atol=1e-5)
    np.testing.assert_array_equal(censored == 1, demand > action)
    assert (tmp_path / "eval" / "phase3.png").stat().st_size > 10_000


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
    assert "trained and cached" in capsys.readouterr().out
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
