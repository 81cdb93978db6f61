"""Which spread should the buffer `k * spread` follow? An offline full-information check on the development splits.

For each trace of the design ladder and seed, trains the default's Phase-1 LSTM on the development split, forecasts
the development validation and test parts from the true demand (``forecasts_as_acted``), and fits on the validation
part, for each spread below, the order ``mu + c + k * spread`` of lowest newsvendor cost (``k`` on a grid, ``c`` the
critical-fractile quantile of ``d - mu - k * spread``). It prints the cost of each fitted order on the test part.

- ``sigma``: the LSTM's ``sigma_t`` as it is;
- ``sigma*T``: ``sigma_t`` times the online temperature fed the demand (``track_temperature`` at each rate of
  ``SCALE_RATES``, the rate chosen on the validation part), what the default acts with;
- ``T``: the online temperature of a constant spread (the recent residuals' size alone);
- ``affine``: ``sqrt(a sigma_t^2 + b)``, ``a, b >= 0`` the least-squares fit of ``(d - mu)^2`` on the validation part;
- ``const``: no spread (``k = 0``), one-sided conformal's offset.

    python spread_probe.py OUT_DIR   (from the repository root, ~35 s on 2 cores; writes spread.json, spread.csv)
"""
import csv
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, "benchmarks")
from host import describe  # noqa: E402
from residual_tail import development_models  # noqa: E402

from picrl_core.calibrator import track_temperature  # noqa: E402
from picrl_core.config import PicRLConfig  # noqa: E402
from picrl_core.costs import asymmetric_cost, critical_ratio  # noqa: E402
from picrl_core.incremental_predictor import forecasts_as_acted  # noqa: E402
from picrl_core.pipeline import SCALE_RATES  # noqa: E402

COST = PicRLConfig().cost
TAU = critical_ratio(COST)
KS = np.linspace(-1.0, 3.0, 81)


def cost(order: np.ndarray, demand: np.ndarray) -> float:
    """Regret of the order against the demand, Eq. (2) (orders and demand both relative to ``mu``)."""
    return float(np.sum(asymmetric_cost(order, demand, COST)))


def fit(residual: np.ndarray, spread: np.ndarray, ks: np.ndarray) -> tuple[float, float]:
    """The ``(k, c)`` of lowest cost of ``c + k * spread`` against ``residual``."""
    fits = []
    for k in ks:
        c = float(np.quantile(residual - k * spread, TAU))  # the best offset for this k
        fits.append((cost(c + k * spread, residual), k, c))
    return min(fits)[1:]


def in_sample_cost(residual: np.ndarray, spread: np.ndarray) -> float:
    """The regret of the order fitted to ``residual`` on the same part (to choose the temperature's rate)."""
    k, c = fit(residual, spread, KS)
    return cost(c + k * spread, residual)


def temperature_path(mu: np.ndarray, sigma: np.ndarray, demand: np.ndarray, rate: float,
                     services: int) -> np.ndarray:
    """``T_t`` fed the demand, per service from 1, as ``track_temperature`` steps it."""
    cfg = replace(PicRLConfig().calibrator, scale_rate=rate)
    mu, sigma, demand = (x.reshape(services, -1) for x in (mu, sigma, demand))
    t, path = np.ones(services), []
    for i in range(mu.shape[1]):
        path.append(t.copy())
        t = track_temperature(t, demand[:, i], mu[:, i], sigma[:, i] * t, np.zeros(services, bool), cfg)
    return np.stack(path, 1).ravel()


def affine(residual: np.ndarray, sigma: np.ndarray) -> tuple[float, float]:
    """``a, b >= 0`` of least squares ``residual^2 ~ a sigma^2 + b``."""
    a, b = np.linalg.lstsq(np.vstack([sigma ** 2, np.ones_like(sigma)]).T, residual ** 2, rcond=None)[0]
    if a < 0:
        return 0.0, float(np.mean(residual ** 2))
    if b < 0:
        return float(np.sum(residual ** 2 * sigma ** 2) / np.sum(sigma ** 4)), 0.0
    return float(a), float(b)


def main() -> None:
    out, started = Path(sys.argv[1]), time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)
    rows = []
    for name, seed, series, model in development_models(6, 2):
        (mv, sv, dv), (mt, st, dt) = (forecasts_as_acted(model, v, c, series.services)
                                      for v, c in ((series.val, series.val_ctx), (series.test, series.test_ctx)))
        rv, rt = dv - mv, dt - mt
        spreads = {"sigma": (sv, st), "const": (np.ones_like(sv), np.ones_like(st))}
        a, b = affine(rv, sv)
        spreads["affine"] = (np.sqrt(a * sv ** 2 + b), np.sqrt(a * st ** 2 + b))
        rates = {}
        for label, base_v, base_t in (("sigma*T", sv, st), ("T", np.ones_like(sv), np.ones_like(st))):
            chosen = min(SCALE_RATES, key=lambda rate: in_sample_cost(
                rv, base_v * temperature_path(mv, base_v, dv, rate, series.services)))
            rates[f"rate_{label}"] = chosen
            spreads[label] = tuple(base * temperature_path(m, base, d, chosen, series.services)
                                   for base, m, d in ((base_v, mv, dv), (base_t, mt, dt)))
        row = {"trace": name, "seed": seed, "corr_abs_residual_sigma": float(np.corrcoef(np.abs(rv), sv)[0, 1]),
               "affine_a": a, "affine_b_share": b / float(np.mean(rv ** 2)), **rates}
        for label, (spread_v, spread_t) in spreads.items():
            k, c = fit(rv, spread_v, KS if label != "const" else np.zeros(1))
            row[label] = cost(c + k * spread_t, rt)
        rows.append(row)
        print(f"{name:<12}{seed:>3} ticks {rt.size} regret of sigma {row['sigma']:6.2f}  "
              f"corr {row['corr_abs_residual_sigma']:5.2f}  "
              + "  ".join(f"{lab} {row[lab] / row['sigma']:.3f}" for lab in spreads), flush=True)
    with (out / "spread.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    (out / "spread.json").write_text(json.dumps({"machine": describe(), "seconds": time.perf_counter() - started,
                                                "critical_fractile": TAU, "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
