"""``picrl compare``: the quick comparison on the bundled datasets end to end (what a user runs first),
the cache that spares a rerun every training, and the tables it writes."""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from picrl.cli import main
from picrl.commands.source import cache_key
from picrl.comparison import runner
from picrl.comparison.tables import table_label
from picrl.datasets import load_dataset
from picrl_core.config import PicRLConfig
from picrl_core.methods import REGISTRY

REPO = Path(__file__).resolve().parents[2]
FIGURES = ("trajectories.png", "ablation_bars.png", "cumulative_regret.png")


# One method of every group of the registry (the cache test reruns pic-rl, a5 and vpa; Table 3 needs A7, the
# cost of censoring PIC-RL and conformal with their full-information twins), on GenAI-Ctx, the dataset with context
# inputs: every table and figure, the cache and the recommendation. Each method's own behaviour is tested in
# tests/core/test_methods_*.py; two datasets in one run in the pod fleet's test below.
METHODS = (
    *("pic-rl", "pic-rl-fi", "tft", "cql", "thompson", "a5", "a7", "conformal", "conformal-fi"),
    *("spo", "vpa", "oracle"),
)
DATASETS = ("genai-ctx",)


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, str]:
    """``picrl compare --quick`` as a user runs it (a subprocess, two jobs, the product protocol by default), on a
    method of every group."""
    out, cache = tmp_path_factory.mktemp("compare"), tmp_path_factory.mktemp("cache")
    done = subprocess.run(
        [sys.executable, "-m", "picrl", "compare", "--quick", "--jobs", "2", "--out", str(out), "--cache", str(cache)]
        + ["--datasets", *DATASETS, "--methods", *METHODS],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return out, cache, done.stdout


def test_quick_comparison_writes_tables_results_and_figures(quick_run: tuple[Path, Path, str]) -> None:
    out, _, stdout = quick_run
    results = json.loads((out / "results.json").read_text())
    assert set(results["datasets"]) == set(DATASETS)
    assert results["budget"]["name"] == "quick" and results["seeds"] == 1
    cells = results["cells"]
    assert {REGISTRY[m].group for m in METHODS} == {m.group for m in REGISTRY.values() if not m.multi_resource_only}
    ran = [m for m in METHODS if REGISTRY[m].group != "hindsight"]  # the product protocol leaves them out
    assert results["protocol"] == "product" and "oracle left out (hindsight references)" in stdout
    assert len(cells) == len(DATASETS) * len(ran) and not any(c["error"] for c in cells)
    assert all(0.0 <= c["metrics"]["shortage_rate"] <= 1.0 and c["metrics"]["mae"] >= 0.0 for c in cells)
    ticks = {name: info["test_ticks"] for name, info in results["datasets"].items()}
    assert ticks == {"genai-ctx": 288}
    assert all(c["metrics"]["steps"] == ticks[c["dataset"]] for c in cells)
    dlrm = runner.test_series(load_dataset("dlrm"), runner.QUICK)  # quick: at most the first 300 test ticks
    assert len(dlrm.test) == 300 < len(runner.test_series(load_dataset("dlrm"), runner.FULL).test)
    table2 = (out / "table2.md").read_text()
    for name in ran:
        if REGISTRY[name].group != "ablation":
            assert f"| {table_label(name)} |" in table2, name
    assert table2.count("**") == 2 * len(DATASETS)  # one lowest regret per dataset
    table3 = (out / "table3.md").read_text()
    assert "| PIC-RL (Full) |" in table3 and "| A7: w/o Pretrain |" in table3
    with (out / "table2.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert {r["dataset"] for r in rows} == set(DATASETS)
    pic = next(r for r in rows if r["method"] == "pic-rl" and r["dataset"] == "genai-ctx")
    cell = next(c for c in cells if c["method"] == "pic-rl" and c["dataset"] == "genai-ctx")
    assert float(pic["regret_mean"]) == pytest.approx(cell["metrics"]["regret"], rel=1e-5)
    for name in FIGURES:
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
    assert "Table 2" in stdout and "Table 3" in stdout and "Cost of censoring" in stdout
    assert stdout.index("Product protocol: native units first") < stdout.index("Table 2")
    assert "| PIC-RL (Ours) |" in (out / "product.md").read_text()
    censoring = (out / "censoring_cost.md").read_text()
    assert "| PIC-RL (Ours) |" in censoring and "| Conformal |" in censoring


def test_the_pod_fleet_runs_every_pod_as_a_service_and_reports_the_spread(tmp_path: Path) -> None:
    """``--datasets pods genai-mem``: 91 pods in one loop, metrics the mean over pods and fleet.md their spread;
    a single-series dataset in the same run gets its own column and no fleet section."""
    # an untrained method (a trained one on a fleet: tests/core/test_fleet.py): 129 s -> 15 s
    assert (
        main(
            [
                "compare",
                "--quick",
                "--jobs",
                "1",
                "--datasets",
                "pods",
                "genai-mem",
                "--methods",
                "kaplan-meier",
                "oracle",
                "--protocol",
                "paper",
                "--out",
                str(tmp_path),
                "--cache",
                str(tmp_path / "cache"),
            ]
        )
        == 0
    )
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["datasets"]["pods"]["services"] == 91 and results["datasets"]["pods"]["test_ticks"] == 288
    assert set(results["datasets"]) == {"pods", "genai-mem"} and len(results["cells"]) == 4
    assert (tmp_path / "table2.md").read_text().count("**") == 2 * 2  # one lowest regret (bold) per dataset
    cells = {c["method"]: c["metrics"] for c in results["cells"] if c["dataset"] == "pods"}
    assert cells["kaplan-meier"]["steps"] == 288 and cells["oracle"]["regret"] < cells["kaplan-meier"]["regret"]
    fleet = (tmp_path / "fleet.md").read_text()
    assert "### pods (91 services)" in fleet and "genai-mem" not in fleet
    row = next(line for line in fleet.splitlines() if line.startswith("| Kaplan-Meier newsvendor |")).split("|")
    assert row[2].strip() == "91" and float(row[3]) == pytest.approx(cells["kaplan-meier"]["regret"], abs=0.01)
    assert row[-2].strip() == "100%"  # the only method that competes: lowest on every pod


def test_a_rerun_reads_every_cell_from_the_cache(
    quick_run: tuple[Path, Path, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out, cache, _ = quick_run
    assert (
        main(
            [
                "compare",
                "--quick",
                "--jobs",
                "1",
                "--datasets",
                "genai-ctx",
                "--methods",
                "pic-rl",
                "a5",
                "vpa",
                "--out",
                str(tmp_path),
                "--cache",
                str(cache),
            ]
        )
        == 0
    )
    assert "3 cells (0 computed, 3 from the cache)" in capsys.readouterr().out
    first = {(c["dataset"], c["method"]): c["metrics"] for c in json.loads((out / "results.json").read_text())["cells"]}
    again = json.loads((tmp_path / "results.json").read_text())["cells"]
    assert all(c["cached"] and c["metrics"] == first[(c["dataset"], c["method"])] for c in again)
    assert (tmp_path / "table3.md").exists() and not (tmp_path / "ablation_bars.png").read_bytes() == b""


def test_cells_and_cached_models_differ_when_only_the_tick_length_does(tmp_path: Path) -> None:
    """Autopilot, VPA and recent max count their windows in seconds: the same values at another tick are other cells
    and other cached models."""
    trace = load_dataset("genai-mem")
    coarser = dataclasses.replace(trace, step_seconds=2 * trace.step_seconds)
    keys = [
        runner.CellCache(tmp_path, {"x": t}, PicRLConfig(), runner.QUICK)._stem(runner.Cell("x", 0, "vpa"))
        for t in (trace, coarser, trace)
    ]
    assert keys[0] != keys[1] and keys[0] == keys[2]
    models = [cache_key(t, PicRLConfig()) for t in (trace, coarser, trace)]
    assert models[0] != models[1] and models[0] == models[2]


def test_bad_arguments_are_refused_with_a_message(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compare", "--seeds", "0", "--out", str(tmp_path)]) == 2
    assert "--seeds must be >= 1" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["compare", "--methods", "nope", "--out", str(tmp_path)])
    assert "invalid choice: 'nope'" in capsys.readouterr().err
    assert main(["compare", "--methods", "oracle", "--quick", "--datasets", "genai-mem", "--out", str(tmp_path)]) == 2
    assert "the hindsight references run under --protocol paper only" in capsys.readouterr().err


def test_mae_change_is_relative_to_full_and_undefined_over_a_zero_mae() -> None:
    from picrl.comparison.tables import Summary, mae_change

    def summary(method: str, dataset: str, mae: float) -> Summary:
        return Summary(method, dataset, {"mae": mae, "regret": 0.0, "shortage_rate": 0.0}, {}, 1, 0)

    summaries = {
        ("pic-rl", "a"): summary("pic-rl", "a", 0.02),
        ("a1", "a"): summary("a1", "a", 0.03),
        ("pic-rl", "flat"): summary("pic-rl", "flat", 0.0),
        ("a1", "flat"): summary("a1", "flat", 1e-7),
    }
    assert mae_change(summaries, "a1", "a") == pytest.approx(50.0)
    assert math.isnan(mae_change(summaries, "a1", "flat"))  # 1e-7 over 0 is no +inf% regression
    assert math.isnan(mae_change(summaries, "a2", "a"))  # not run


def test_the_two_resource_pods_report_each_resource_and_draw_both(tmp_path: Path) -> None:
    """``--datasets pods-2r``: memory and duty cycle of 72 pods in one coupled loop, resources.md and .png."""
    # the untrained methods only (a learned one on two resources runs in the --resources CSV test below): 45 -> 5 s
    assert (
        main(
            [
                "compare",
                "--quick",
                "--jobs",
                "1",
                "--datasets",
                "pods-2r",
                "--methods",
                "vpa",
                "oracle",
                "--out",
                str(tmp_path),
                "--cache",
                str(tmp_path / "cache"),
            ]
        )
        == 0
    )
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["datasets"]["pods-2r"]["services"] == 144
    assert results["protocol"] == "product" and results["datasets"]["pods-2r"]["protocol"] == "paper"
    cells = {c["method"]: c["metrics"] for c in results["cells"]}
    for metrics in cells.values():
        assert metrics["regret"] == pytest.approx(2.0 * metrics["regret_gpu_mem"] + metrics["regret_gpu_compute"])
    table = (tmp_path / "resources.md").read_text()
    assert "| Kubernetes VPA |" in table and "gpu_compute shortage" in table
    # why the coupling barely matters on this test split: the pods' compute is idle on 97.4% of (pod, tick)
    assert "(idle): gpu_mem 0.1%, gpu_compute 97.4% of (service, tick)" in table
    assert (tmp_path / "resources.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not (tmp_path / "fleet.md").exists()


def test_a_users_csv_of_one_pods_memory_and_compute_compares_coupled_and_per_resource(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--trace FILE --resources gpu_mem=COL gpu_compute=COL``: one service provisioned two resources, from a CSV."""
    from picrl_core.synthetic import shared_load_pods

    memory, compute = shared_load_pods(600, pods=1, seed=5)
    path = tmp_path / "pod.csv"
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["time", "mem_bytes", "duty_pct"])
        writer.writerows([60 * t, memory[t, 0] * 16e9, compute[t, 0] * 100] for t in range(600))
    out = tmp_path / "out"
    assert (
        main(
            [
                "compare",
                "--trace",
                str(path),
                "--resources",
                "gpu_mem=mem_bytes",
                "gpu_compute=duty_pct",
                "--time-column",
                "time",
                "--hard-shortage",
                "pod",
                "--quick",
                "--jobs",
                "1",
                "--methods",
                "pic-rl-per-resource",
                "conformal-coupled",
                "oracle",
                "--out",
                str(out),
                "--cache",
                str(tmp_path / "cache"),
            ]
        )
        == 0
    )
    results = json.loads((out / "results.json").read_text())
    assert results["datasets"]["pod:mem_bytes+duty_pct-oom"]["services"] == 2  # one pod, two resource rows
    table = (out / "resources.md").read_text()
    assert "| PIC-RL per resource |" in table and "| Conformal, coupled flags |" in table
    capsys.readouterr()
    with pytest.raises(SystemExit):  # argparse's usage error
        main(["compare", "--trace", str(path), "--resources", "gpu_mem", "--out", str(out)])
    assert "expected NAME=COLUMN" in capsys.readouterr().err
    for bad, message in [
        (["--resources", "gpu_mem=mem_bytes", "gpu_disk=duty_pct"], "at least two of"),
        (["--resources", "gpu_mem=mem_bytes", "gpu_compute=duty_pct", "--column", "x"], "no --column"),
    ]:
        code = main(["compare", "--trace", str(path), *bad, "--out", str(out)])
        assert code == 2 and message in capsys.readouterr().err, bad
