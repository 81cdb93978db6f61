"""Where a stream worker's time goes, from a ``py-spy record --format raw`` file (collapsed stacks).

    python benchmarks/profile_summary.py benchmarks/results/profiles/worker-exactly_once.txt [--json OUT]

Each line of the file is ``frame;frame;...;frame COUNT`` (outermost first). A sample is charged to the
first component (in the order of :data:`COMPONENTS`) that one of its frames names; samples whose
stack names none are "other" (the event loop waiting, Faust and aiokafka internals not listed).
Prints the share of samples per component and, with ``--json``, writes them.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

# (component, substrings of a frame "function (file:line)"), most specific first.
COMPONENTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("Phase-1 LSTM (predict_gaussian)", ("predict_gaussian",)),
    ("Tobit estimator", ("estimate_censored_demand",)),
    ("policy network", ("_plan (picrl_core/controller.py",)),
    ("rest of the controller step", ("picrl_core/",)),
    ("decision engine (rows, records)", ("stream/decisions.py",)),
    ("decoding usage records", ("decode_batch", "stream/intake.py")),
    ("encoding outputs (orjson records)", ("to_bytes (stream/records.py", "encode_many (stream/records.py")),
    ("metrics and recent decisions", ("observe (stream/observer.py",)),
    ("table writes (changelog)", ("faust/tables/",)),
    ("taking and acknowledging batches", ("stream/take.py",)),
    ("producer sends (aiokafka)", ("aiokafka/producer",)),
    ("consumer fetches (aiokafka)", ("aiokafka/consumer",)),
    ("Faust stream and transactions", ("faust/",)),
    ("idle in the event loop", ("select (selectors.py", "_run_once (asyncio/base_events.py")),
)


def summarise(path: Path) -> dict[str, float]:
    """Share of samples per component (they add up to 1)."""
    samples: Counter[str] = Counter()
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = stack.split(";")
        component = next((name for name, keys in COMPONENTS if any(k in f for f in frames for k in keys)), "other")
        samples[component] += int(count)
    total = sum(samples.values())
    if total == 0:
        raise ValueError(f"{path} holds no py-spy samples")
    return {name: samples[name] / total for name in [*(n for n, _ in COMPONENTS), "other"] if samples[name]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("profile", type=Path, help="a py-spy raw (collapsed stacks) file")
    parser.add_argument("--json", type=Path, help="write the shares here")
    args = parser.parse_args()
    shares = summarise(args.profile)
    for name, share in shares.items():
        print(f"{name:<38}{share:>7.1%}")
    if args.json:
        args.json.write_text(json.dumps({"profile": str(args.profile), "shares": shares}, indent=2) + "\n")


if __name__ == "__main__":
    main()
