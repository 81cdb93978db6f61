"""CLI errors a user meets first: an unknown flag, a bad --model, a broker that does not answer."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from picrl.cli import main
from picrl_core.series import prepare_series


@pytest.mark.parametrize(
    "argv, usage",
    [
        (["topics", "create", "--bootstrp", "127.0.0.1:9092"], "usage: picrl topics "),
        (
            ["produce", "replay", "--dataset", "genai-mem", "--rate", "5", "--speed", "5"],
            "usage: picrl produce replay ",
        ),
        (["kafka", "status", "--nodes", "2"], "usage: picrl kafka "),
    ],
)
def test_an_unknown_flag_prints_the_usage_of_its_sub_command(
    argv: list[str], usage: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.startswith(usage), err
    assert err.strip().splitlines()[-1].endswith(f"error: unrecognized arguments: {' '.join(argv[-2:])}")


def test_a_missing_model_is_an_argument_error_before_anything_is_printed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["evaluate", "--dataset", "dlrm", "--model", str(tmp_path / "missing"), "--out", str(tmp_path / "out")])
    out, err = capsys.readouterr()
    assert exit_.value.code == 2 and out == ""
    assert err.startswith("usage: picrl evaluate ") and "is not a picrl model: artifact.json is missing" in err, err
    assert not (tmp_path / "out").exists()


def test_a_command_says_at_once_it_waits_for_the_broker_then_fails_with_code_2(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = main(["topics", "create", "--bootstrap", "127.0.0.1:9", "--bootstrap-timeout", "1"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert err == [
        "picrl topics: Kafka at 127.0.0.1:9 does not answer yet; waiting up to 1 s (--bootstrap-timeout sets the wait)",
        "picrl topics: error: Kafka at 127.0.0.1:9 did not answer within 1 s: check --bootstrap and that the brokers "
        "run (--bootstrap-timeout sets the wait)",
    ]


def test_the_broker_wait_is_15_seconds_by_default() -> None:
    from picrl.settings import load_settings

    assert load_settings(None, {})["bootstrap_timeout"] == 15.0


def test_make_says_before_it_installs_a_system_package() -> None:
    recipe = (Path(__file__).parents[2] / "Makefile").read_text().split("\nprometheus:", 1)[1].split("\n\n", 1)[0]
    assert recipe.index("echo \"installing Debian's prometheus package") < recipe.index("apt-get update")


@pytest.mark.parametrize("command", ["train", "evaluate"])
def test_a_bad_config_fails_before_the_traces_notes(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    values = [np.nan if i == 100 else 10.0 + i % 7 for i in range(400)]
    assert any("filled 1 gap" in note for note in prepare_series(np.array(values), "gappy").notes)  # printed if read
    trace = tmp_path / "gappy.csv"
    trace.write_text("t,v\n" + "\n".join(f"{60 * i}," + ("" if np.isnan(v) else str(v)) for i, v in enumerate(values)))
    bad = tmp_path / "bad.json"
    bad.write_text('{"pretrain": {"iteratons": 5}}')
    source = [
        "--trace",
        str(trace),
        "--column",
        "v",
        "--time-column",
        "t",
        "--out",
        str(tmp_path / "out"),
        "--config",
        str(bad),
    ]
    assert main([command, *source]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "config.pretrain: unknown setting(s) iteratons" in err
