"""Five traces of other shapes, written as an outside user's CSVs, for a check no design choice reads.

Run on demand (not part of the test suite):

    python benchmarks/outside_shapes.py --out DIR
    for f in DIR/*.csv; do picrl compare --trace $f --column usage --time-column time --seeds 1 \\
        --methods pic-rl pic-rl-fi conformal conformal-fi cql sgd sgd-residual kaplan-meier vpa oracle \\
        --out DIR/$(basename $f .csv); done

Writes CSVs with a ``time`` column (seconds, 60 s apart) and a ``usage`` column: three 1,440-tick synthetic shapes
at seeds the development ladder (``select_design.py``, seeds 1-4) does not use, scaled x100 (a surge train,
heavy-tailed bursts, a daily wave), and two real pods the ladder does not hold out (pods 45 and 80 of the 91, GPU
memory in bytes, all 1,441 ticks). ``docs/results.md`` ("Traces of other shapes") has their results.
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

import numpy as np

from picrl.datasets import load_pod_fleet
from picrl_core import synthetic

TICKS = 1440
STEP_SECONDS = 60
PODS = (45, 80)  # not among the ladder's evenly spaced pods (0, 18, 36, 54, 72, 90)


def shapes() -> dict[str, np.ndarray]:
    """Name -> usage series."""
    out = {
        "surges": 100 * synthetic.surges(TICKS, seed=21),
        "heavy-tailed-bursts": 100 * synthetic.heavy_tailed_bursts(TICKS, seed=23),
        "daily-wave": 100 * synthetic.diurnal(TICKS, period=288, seed=24),
    }
    fleet = load_pod_fleet()
    for index in PODS:
        out[f"pod-{index}"] = np.asarray(fleet[index].values, dtype=np.float64)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="folder for the CSV files")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for name, values in shapes().items():
        path = args.out / f"{name}.csv"
        with path.open("w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(["time", "usage"])
            writer.writerows((STEP_SECONDS * t, repr(float(v))) for t, v in enumerate(values))
        print(f"written {path} ({len(values)} ticks)")


if __name__ == "__main__":
    main()
