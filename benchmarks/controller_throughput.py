"""Embedded controller throughput: service-steps per second at several batch sizes, memory and state size.

Run on demand (not part of the test suite):

    python benchmarks/controller_throughput.py --out benchmarks/results [--batches 1 10 100 1000 10000 100000]
        [--chunk 128] [--quick] [--predictor windowed|incremental] [--name controller_throughput]

Each batch size runs ``window + 1`` warm-up ticks (so every window holds censored points, as in steady
state; from a cold start the first windows are uncensored history and the estimator is cheaper) and
then times ``--ticks`` closed-loop ticks of the full PIC-RL decision (Gaussian LSTM
prediction, windowed or incremental (``--predictor``), warm-started censored-demand estimator, policy,
reactive calibrator) with untrained networks of the
default shapes (speed does not depend on the weights), the networks on fixed chunks of ``--chunk``
rows (``OnlineConfig.inference_chunk``; 128, the default, is what the stream uses). Writes
``controller_throughput.json`` and ``controller_throughput.png`` (service-steps/s against batch size)
and prints a table.

Memory, per batch size (sizes run in ascending order):

* ``max_rss_mib``: the process's max RSS after the size (monotone, so read it as "at most");
* ``rss_growth_mib``: how much this size raised the max RSS (``ru_maxrss`` delta; torch buffers included);
* ``traced_peak_mib``: the peak of Python/numpy allocations during one extra tick traced with
  ``tracemalloc`` (torch's own buffers are not traced), i.e. the working set of one ``step``.

State per service: ``state_bytes_per_service`` (the ``ControllerState`` arrays), the packed row of
``picrl_core.state_codec.StateCodec`` and the stream worker's table row
(``stream.decisions.DecisionEngine.row_bytes``: the codec row plus range, capacity, tick, offsets
and the warm-up buffer).
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import resource
import time
import tracemalloc
from dataclasses import replace
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from host import StealMeter, describe  # noqa: E402

from picrl_core.artifact import ModelArtifact  # noqa: E402
from picrl_core.config import PicRLConfig  # noqa: E402
from picrl_core.controller import PicRLController  # noqa: E402
from picrl_core.controller_state import ControllerState  # noqa: E402
from picrl_core.policy import PolicyNetwork, ValueNetwork  # noqa: E402
from picrl_core.predictor.model import GaussianLSTM  # noqa: E402
from picrl_core.simulator import censor  # noqa: E402
from picrl_core.state_codec import StateCodec  # noqa: E402
from stream.decisions import DecisionEngine  # noqa: E402

MIB = 1 << 20


def state_bytes_per_service(state: ControllerState) -> float:
    """Bytes of all per-service arrays of a controller state divided by the number of services."""
    return sum(getattr(state, name).nbytes for name in state.__dataclass_fields__) / len(state)


def max_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def measure(controller: PicRLController, services: int, ticks: int, rng: np.random.Generator) -> dict[str, float]:
    rss_before = max_rss_mib()
    history = rng.uniform(0.2, 0.8, size=(services, controller.window))
    state = controller.initial_state(np.arange(services, dtype=np.uint64), history)
    warmup = controller.window + 1  # steady state: the windows full of censored points, the allocator warm
    demand = rng.uniform(0.0, 1.0, size=(warmup + ticks + 1, services))
    for t in range(warmup):
        y, c = censor(demand[t], state.action)
        state, _ = controller.step(state, y, c)
    demand = demand[warmup - 1 :]
    steal = StealMeter()
    load = os.getloadavg()[0]
    started, cpu = time.perf_counter(), time.process_time()
    for t in range(1, ticks + 1):
        y, c = censor(demand[t], state.action)
        state, _ = controller.step(state, y, c)
    seconds, cpu_seconds = time.perf_counter() - started, time.process_time() - cpu
    stolen = steal.share()
    y, c = censor(demand[ticks + 1], state.action)
    tracemalloc.start()
    controller.step(state, y, c)  # one traced tick, outside the timing (tracing slows allocations)
    traced_peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    rss = max_rss_mib()
    return {
        "services": services,
        "ticks": ticks,
        "seconds": seconds,
        "service_steps_per_second": services * ticks / seconds,
        "us_per_call": 1e6 * seconds / ticks,
        "cpu_steal_share": stolen,
        "cpu_seconds": cpu_seconds,
        "load_average_1min": load,
        "state_bytes_per_service": state_bytes_per_service(state),
        "max_rss_mib": rss,
        "rss_growth_mib": rss - rss_before,
        "traced_peak_mib": traced_peak / MIB,
        "traced_peak_bytes_per_service": traced_peak / services,
    }


# Where a step's time goes: (label, function name in cProfile's statistics).
COMPONENTS = (
    ("Phase-1 LSTM (mu, sigma)", "predict_gaussian"),
    ("Phase-1 LSTM (mu, sigma)", "advance_memory"),
    ("Phase-1 LSTM (mu, sigma)", "start_memory"),
    ("Tobit censored-demand estimator", "estimate_censored_demand"),
    ("state features", "state_features"),
    ("policy network (eta, k)", "_plan"),
    ("reward and calibrator", "step_reward"),
    ("reward and calibrator", "calibrate"),
)


def profile(controller: PicRLController, services: int, ticks: int, rng: np.random.Generator) -> dict[str, float]:
    """Seconds per tick of each component of ``step`` at ``services`` (cProfile, cumulative time), plus
    ``other`` (window shifts, clipping, array glue)."""
    state = controller.initial_state(
        np.arange(services, dtype=np.uint64), rng.uniform(0.2, 0.8, (services, controller.window))
    )
    warmup = controller.window + 1  # profile the steady state (windows full of censored points), as measure() times it
    demand = rng.uniform(0.0, 1.0, size=(warmup + ticks, services))
    for t in range(warmup):
        y, c = censor(demand[t], state.action)
        state, _ = controller.step(state, y, c)
    demand = demand[warmup:]
    profiler = cProfile.Profile()
    for t in range(ticks):
        y, c = censor(demand[t], state.action)
        profiler.enable()
        state, _ = controller.step(state, y, c)
        profiler.disable()
    stats = pstats.Stats(profiler).stats  # (file, line, name) -> (calls, primitive, tottime, cumtime, callers)
    cumulative = {}
    for (_, _, name), entry in stats.items():
        cumulative[name] = cumulative.get(name, 0.0) + entry[3]
    shares: dict[str, float] = {}
    for label, name in COMPONENTS:
        shares[label] = shares.get(label, 0.0) + cumulative.get(name, 0.0) / ticks
    shares["other"] = cumulative["step"] / ticks - sum(shares.values())
    return shares


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--batches", type=int, nargs="+", default=[1, 10, 100, 1000, 10_000, 100_000], help="services per batch"
    )
    parser.add_argument("--chunk", type=int, default=128, help="rows per network forward pass (default 128)")
    parser.add_argument(
        "--ticks",
        type=int,
        default=0,
        help="ticks per size (default: enough for ~2M service-steps, 5..200; --quick: ~200k, 3..50)",
    )
    parser.add_argument("--quick", action="store_true", help="about ten times fewer service-steps per size")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    parser.add_argument(
        "--estimator-threads",
        type=int,
        default=1,
        help="threads the censored-demand estimator splits the services over (online.estimator_threads;"
        " default 1); with 2, run torch on 1 (--threads 1) so the two do not oversubscribe the cores",
    )
    parser.add_argument(
        "--predictor",
        choices=["windowed", "incremental"],
        default="incremental",
        help="predictor.kind: the LSTM re-reads its window every tick, or carries (h, c) (default, as the config)",
    )
    parser.add_argument("--name", default="controller_throughput", help="result file names (without suffix)")
    parser.add_argument(
        "--profile",
        type=int,
        default=100_000,
        metavar="SERVICES",
        help="profile the step at this many services (cProfile, 5 ticks; 0: skip; default 100,000)",
    )
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"), help="folder for the JSON result")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    config = PicRLConfig()
    config = replace(
        config,
        predictor=replace(config.predictor, kind=args.predictor),
        online=replace(config.online, estimator_threads=args.estimator_threads),
    )
    torch.manual_seed(0)
    predictor, policy = GaussianLSTM(config.predictor), PolicyNetwork(config.policy)
    controller = PicRLController(predictor, policy, config, chunk=args.chunk)
    artifact = ModelArtifact(config, predictor, policy, ValueNetwork(config.policy), scaling={"context_names": []})
    codec_row = StateCodec.for_config(config).row_bytes
    stream_row = DecisionEngine(artifact).row_bytes
    steps, low, high = (200_000, 3, 50) if args.quick else (2_000_000, 5, 200)
    rng = np.random.default_rng(0)
    rows = []
    print(
        f"state per service: StateCodec row {codec_row} B, stream table row (DecisionEngine.row_bytes) {stream_row} B"
    )
    print(
        f"{'services':>9}{'ticks':>7}{'service-steps/s':>17}{'us/call':>11}{'state B/svc':>13}{'max RSS MiB':>13}"
        f"{'RSS growth':>12}{'traced MiB':>12}{'steal':>7}{'CPU/wall':>9}{'load':>6}"
    )
    for services in sorted(args.batches):
        ticks = args.ticks or int(np.clip(steps // services, low, high))
        rows.append(measure(controller, services, ticks, rng))
        r = rows[-1]
        print(
            f"{r['services']:>9,}{r['ticks']:>7}{r['service_steps_per_second']:>17,.0f}{r['us_per_call']:>11,.0f}"
            f"{r['state_bytes_per_service']:>13.0f}{r['max_rss_mib']:>13.0f}{r['rss_growth_mib']:>12.0f}"
            f"{r['traced_peak_mib']:>12.1f}{r['cpu_steal_share']:>7.0%}{r['cpu_seconds'] / r['seconds']:>9.2f}"
            f"{r['load_average_1min']:>6.1f}"
        )
    breakdown = profile(controller, args.profile, 5, rng) if args.profile else {}
    if breakdown:
        total = sum(breakdown.values())
        print(f"\nwhere a step's time goes at {args.profile:,} services (cProfile, seconds per tick):")
        for label, seconds in breakdown.items():
            print(f"  {label:<34}{seconds:>8.3f} s {seconds / total:>6.0%}")
        if args.estimator_threads > 1:
            print(
                "  (cProfile sees the calling thread: the estimator ran in other threads beside the predictor,\n"
                "   so its time is hidden in the predictor's and 'other', the wait for it)"
            )
    result = {
        "benchmark": "controller_throughput",
        "machine": describe(),
        "profile": {"services": args.profile, "seconds_per_tick": breakdown},
        "threads": args.threads,
        "estimator_threads": args.estimator_threads,
        "chunk": args.chunk,
        "quick": args.quick,
        "predictor": args.predictor,
        "config": {
            "window": config.predictor.window,
            "hidden": config.predictor.hidden,
            "policy_hidden": config.policy.hidden,
            "estimator_iterations": config.estimator.iterations,
        },
        "state_codec_row_bytes": codec_row,
        "stream_row_bytes": stream_row,
        "rows": rows,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(result, indent=2) + "\n")
    plot(rows, args, args.out / f"{args.name}.png")
    print(f"written {args.out / (args.name + '.json')}, {args.out / (args.name + '.png')}")


def plot(rows: list[dict[str, float]], args: argparse.Namespace, path: Path) -> None:
    services = [r["services"] for r in rows]
    fig, ax = plt.subplots(figsize=(7, 4.2))
    ax.plot(services, [r["service_steps_per_second"] for r in rows], marker="o", label="PIC-RL controller step")
    ax.axhline(250_000, color="tab:red", ls="--", lw=1, label="target at 100,000 services (250k/s)")
    ax.axhline(2_000, color="tab:orange", ls=":", lw=1, label="target for one service (2k/s)")
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="services per batch (one controller call)",
        ylabel="service-steps per second",
        title=f"Embedded controller ({args.predictor} LSTM), {args.threads} torch threads, chunk {args.chunk}",
    )
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
