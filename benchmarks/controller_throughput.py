"""Embedded controller throughput: service-steps per second at several batch sizes, and state size.

Run on demand (not part of the test suite):

    python benchmarks/controller_throughput.py --out benchmarks/results [--batches 1 1000 100000]

Each batch size runs ``--ticks`` closed-loop ticks of the full PIC-RL decision (Gaussian LSTM
prediction, censored-demand estimator, policy, reactive calibrator) with untrained networks of the
default shapes (speed does not depend on the weights). Writes ``controller_throughput.json`` and
prints a table. Peak memory is the process's max RSS after each size (monotone, so read it as
"at most").
"""
from __future__ import annotations

import argparse
import json
import platform
import resource
import time
from pathlib import Path

import numpy as np
import torch

from picrl_core.config import PicRLConfig
from picrl_core.controller import ControllerState, PicRLController
from picrl_core.policy import PolicyNetwork
from picrl_core.predictor import GaussianLSTM
from picrl_core.simulator import censor


def state_bytes_per_service(state: ControllerState) -> float:
    """Bytes of all per-service arrays of a controller state divided by the number of services."""
    return sum(getattr(state, name).nbytes for name in state.__dataclass_fields__) / len(state)


def measure(controller: PicRLController, services: int, ticks: int, rng: np.random.Generator) -> dict[str, float]:
    history = rng.uniform(0.2, 0.8, size=(services, controller.window))
    state = controller.initial_state(np.arange(services, dtype=np.uint64), history)
    demand = rng.uniform(0.0, 1.0, size=(ticks + 1, services))
    y, c = censor(demand[0], state.action)
    state, _ = controller.step(state, y, c)  # warm-up tick (allocator, torch kernels)
    started = time.perf_counter()
    for t in range(1, ticks + 1):
        y, c = censor(demand[t], state.action)
        state, _ = controller.step(state, y, c)
    seconds = time.perf_counter() - started
    return {
        "services": services, "ticks": ticks, "seconds": seconds,
        "service_steps_per_second": services * ticks / seconds,
        "state_bytes_per_service": state_bytes_per_service(state),
        "max_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 1000, 100_000], help="services per batch")
    parser.add_argument("--ticks", type=int, default=0, help="ticks per size (default: enough for ~2M service-steps, 5..200)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"), help="folder for the JSON result")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    config = PicRLConfig()
    torch.manual_seed(0)
    controller = PicRLController(GaussianLSTM(config.predictor), PolicyNetwork(config.policy), config)
    rng = np.random.default_rng(0)
    rows = []
    for services in args.batches:
        ticks = args.ticks or int(np.clip(2_000_000 // services, 5, 200))
        rows.append(measure(controller, services, ticks, rng))
        row = rows[-1]
        print(f"{row['services']:>8} services x {row['ticks']:>4} ticks: {row['service_steps_per_second']:>12,.0f} "
              f"service-steps/s, {row['state_bytes_per_service']:.0f} B state/service, max RSS {row['max_rss_mib']:.0f} MiB")
    result = {"benchmark": "controller_throughput", "threads": args.threads, "machine": platform.platform(),
              "cpu_count": torch.get_num_threads(), "config": {"window": config.predictor.window,
                                                               "hidden": config.predictor.hidden}, "rows": rows}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "controller_throughput.json").write_text(json.dumps(result, indent=2) + "\n")
    print(f"written {args.out / 'controller_throughput.json'}")


if __name__ == "__main__":
    main()
