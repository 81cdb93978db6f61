"""Is the tail the window's E-step assumes the tail the forecast's errors have?

A shortage hides the demand above the action ``a``; the window's E-step (``estimator.impute_window``) keeps it as
``E[d | d > a] = mu + sigma lambda(z_a)`` with ``z_a = (a - mu) / sigma`` and ``lambda`` the Gaussian inverse Mills
ratio (Eq. 8's Tobit model). If the standardized errors of the trained LSTM had a heavier upper tail than the Gaussian,
every imputed shortage would sit too low and a censoring streak would fall further behind with each tick.

For each trace of the design ladder (``select_design.traces``: GenAI, evenly spaced real pods, four synthetic shapes)
and seed, this trains the default's Phase-1 LSTM (the incremental one PIC-RL acts with, not the windowed one the
baselines read) on the development split (the first 75% of the training split trains, its rest validates and
calibrates ``sigma``, the validation split plays the test; the test split is never read) and forecasts every tick of
the development validation and test parts from the true demand before it, as the controller reads the model (one
carried stream per part). A tick whose
demand repeats the last one is left out (the repeat mixture, not the Gaussian, explains it). On the rest it reports:

- ``T``: the root mean square of ``z = (d - mu) / sigma``, the temperature a calibrated scale would have;
- the share of ``z / T`` above ``z*`` (the critical fractile's quantile; ``1/3`` for a calibrated, unbiased forecast);
- for ``c`` in ``z*, 1, 1.5``: the mean of ``z / T`` over the ticks above ``c`` against the Gaussian's ``lambda(c)``:
  the E-step's imputation, in units of the scaled ``sigma``, measured against what it assumes.

Run on demand (not part of the test suite; ~30 seconds for the default on 2 cores):

    python benchmarks/residual_tail.py --out DIR [--pods 6] [--seeds 2]

Prints the table and writes ``tail.json``, ``tail.csv`` and ``tail.png`` (empirical against Gaussian mean excess,
one panel per family) to ``--out``.
"""

from __future__ import annotations

import argparse
import csv
import json
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from statistics import NormalDist

import matplotlib
import numpy as np
import torch
from host import StealMeter, describe
from select_design import traces

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from picrl.comparison.runner import FULL  # noqa: E402
from picrl_core.config import PicRLConfig  # noqa: E402
from picrl_core.costs import critical_ratio  # noqa: E402
from picrl_core.mills import inverse_mills_ratio  # noqa: E402
from picrl_core.pipeline import config_for, train_phase1  # noqa: E402
from picrl_core.predictor.kinds import forecasts_as_acted  # noqa: E402
from picrl_core.predictor.model import GaussianLSTM  # noqa: E402
from picrl_core.series import PreparedSeries, development_series, prepare_series  # noqa: E402
from picrl_core.training_memo import shared_training  # noqa: E402

CURVE = np.linspace(0.0, 2.0, 21)  # the thresholds of the plotted mean-excess curve
REPORTED = (1.0, 1.5)  # thresholds reported besides z*


def standardized_errors(
    model: GaussianLSTM, values: np.ndarray, context: np.ndarray | None, services: int
) -> np.ndarray:
    """``(d - mu) / sigma`` of every one-step forecast inside ``values``, read as the controller reads ``model``,
    whose demand does not repeat the last."""
    mu, sigma, target = forecasts_as_acted(model, values, context, services)
    width = model.cfg.window
    previous = np.asarray(values, np.float64).reshape(services, -1)[:, width - 1 : -1].ravel()
    return ((target - mu) / sigma)[np.abs(target - previous) > 1e-9]


def tail_mean(z: np.ndarray, threshold: float) -> float:
    """Mean of ``z`` over its values above ``threshold`` (NaN when none is)."""
    above = z[z > threshold]
    return float(above.mean()) if above.size else float("nan")


def summarize(z: np.ndarray, fractile: float) -> dict:
    """One (trace, seed, part)'s row: the scale, the share above ``z*``, the tail means and the Gaussian's."""
    temperature = float(np.sqrt(np.mean(z * z)))
    scaled = z / temperature
    row = {"ticks": int(z.size), "temperature": temperature, "above_fractile": float(np.mean(scaled > fractile))}
    for label, c in (("z*", fractile), *((f"{c:g}", c) for c in REPORTED)):
        row[f"mean_above_{label}"] = tail_mean(scaled, c)
        row[f"gaussian_above_{label}"] = float(inverse_mills_ratio(np.array(c)))
        row[f"count_above_{label}"] = int(np.sum(scaled > c))
    row["curve"] = [tail_mean(scaled, c) - c for c in CURVE]
    return row


def family(trace: str) -> str:
    """The plot's panel of a trace."""
    return "GenAI" if trace.startswith("genai") else "real pods" if trace.startswith("pod") else "synthetic"


def plot(rows: list[dict], path: Path) -> None:
    """Mean excess ``E[z - c | z > c]`` of the test part against ``c``, per family, with the Gaussian's."""
    families = sorted({family(r["trace"]) for r in rows})
    fig, axes = plt.subplots(1, len(families), figsize=(4.5 * len(families), 3.6), sharey=True, squeeze=False)
    gaussian = inverse_mills_ratio(CURVE) - CURVE
    for ax, name in zip(axes[0], families):
        for r in rows:
            if family(r["trace"]) == name and r["part"] == "test":
                ax.plot(CURVE, r["curve"], color="tab:blue", alpha=0.5, lw=1)
        ax.plot(CURVE, gaussian, color="black", lw=2, label="Gaussian (the E-step)")
        ax.set_title(f"{name}: development test part")
        ax.set_xlabel("threshold c (units of the scaled sigma)")
        ax.legend(loc="upper right")
    axes[0][0].set_ylabel("mean excess E[z - c | z > c]")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def development_models(pods: int, seeds: int) -> Iterator[tuple[str, int, PreparedSeries, GaussianLSTM]]:
    """``(trace, seed, development series, the default's trained Phase-1 LSTM)`` for every trace of the design
    ladder (``pods`` evenly spaced real pods) and seeds ``0 .. seeds - 1``; the test splits are never read."""
    for name, (values, context, context_names) in traces(pods).items():
        series = development_series(prepare_series(values, name, context, context_names))
        for seed in range(seeds):
            config = config_for(series, replace(FULL.apply(PicRLConfig()), seed=seed))
            with shared_training():
                yield name, seed, series, train_phase1(series, config)[0].eval()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__
    )
    parser.add_argument("--out", type=Path, required=True, help="folder for tail.json, tail.csv, tail.png")
    parser.add_argument("--pods", type=int, default=6, help="evenly spaced real pods to include (default 6)")
    parser.add_argument("--seeds", type=int, default=2, help="seeds per trace, from 0 (default 2)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    args.out.mkdir(parents=True, exist_ok=True)
    steal, started = StealMeter(), time.perf_counter()
    fractile = NormalDist().inv_cdf(critical_ratio(PicRLConfig().cost))  # z*
    rows = []
    print(
        f"{'trace':<12}{'seed':>5} {'part':<5}{'ticks':>6}{'T':>6}{'>z*':>7}   mean above c / Gaussian's: "
        f"{'z*':>11}{'1':>12}{'1.5':>12}"
    )
    for name, seed, series, model in development_models(args.pods, args.seeds):
        for part, part_values, part_context in (
            ("val", series.val, series.val_ctx),
            ("test", series.test, series.test_ctx),
        ):
            row = {
                "trace": name,
                "seed": seed,
                "part": part,
                **summarize(standardized_errors(model, part_values, part_context, series.services), fractile),
            }
            rows.append(row)
            tails = "".join(
                f"{row[f'mean_above_{c}']:>6.2f}/{row[f'gaussian_above_{c}']:<5.2f}" for c in ("z*", "1", "1.5")
            )
            print(
                f"{name:<12}{seed:>5} {part:<5}{row['ticks']:>6}{row['temperature']:>6.2f}"
                f"{row['above_fractile']:>7.3f}   {'':>26}{tails}",
                flush=True,
            )
    columns = [k for k in rows[0] if k != "curve"]
    with (args.out / "tail.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, columns, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    (args.out / "tail.json").write_text(
        json.dumps(
            {
                "benchmark": "residual_tail",
                "machine": describe(),
                "seconds": time.perf_counter() - started,
                "cpu_steal_share": steal.share(),
                "fractile": fractile,
                "curve_thresholds": CURVE.tolist(),
                "rows": rows,
            },
            indent=2,
        )
        + "\n"
    )
    plot(rows, args.out / "tail.png")
    print(f"written: {args.out / 'tail.json'}, {args.out / 'tail.csv'}, {args.out / 'tail.png'}")


if __name__ == "__main__":
    main()
