"""How PIC-RL's default was chosen: each departure from the paper, measured without the test split.

Every trace is cut by :func:`picrl_core.series.development_series`: the first 75% of its training
split trains, the rest of the training split validates (early stopping, the sigma temperature, the
fast-step selection, the baselines' knobs) and its *validation* split plays the test. The test split
of a trace is never read here, so the choices below cannot have been fitted to the reported tables.
The part that plays the test runs as the product runs it (the product protocol,
:func:`picrl_core.methods.evaluation.growth_episode`): unclipped, each range growing by the stream's
rule, regret in units of the training range. The traces (:func:`traces`) hold the regimes users meet:
growth past the training range (DLRM, syn-growth, syn-drift), idle stretches (four pods' duty cycles,
syn-idling, syn-scale-to-zero), bursts, a daily wave and real pods.

The variants form a ladder from the paper's Phase 3 to the default, one change per rung:

    paper               the preset configs/paper.json: Eq. (12) as printed, sigma as trained, delta_m = 0.004,
                        k in [0, 2], exploring while acting
    +pinball            both calibrator variables step on the cost's subgradient (c_over / c_under when over)
    +temperature        sigma scaled on validation by NLL (Phase 1)
    +sigma-step         the margin steps in units of sigma_t (delta_m = 0.1)
    +k-around-fractile  k in z* + [-1, 1], z* the newsvendor fractile of the calibrated forecast
    +act-with-mean      the policy's mean acts, no exploration noise
    +online-scale       each service's sigma scaled by a temperature tracked online (Tobit EM step), its rate
                        chosen on the validation split among pipeline.SCALE_RATES
    +incremental-predictor  the LSTM carries (h, c) per service and steps once per tick (predictor.kind)
    +margin-step-1/4    the margin's step a quarter of +sigma-step's (delta_m = 0.025)
    +escape             from the second shortage in a row the action rises by one margin step, then 2, 4, 8, ... (an
                        exponential search for the level the censoring hides), halving back once the demand is seen
                        (calibrator.escape)
    +impute-window      the LSTM's window keeps a shortage as its Tobit E-step E[d | d > a], uncensored
                        (estimator.impute_window)
    +no-pessimism       Eq. 9's Psi = 1 (reward.use_pessimism off): with the window's E-step in place the hedge only
                        over-provisions; the two were chosen together
    +escape-from-4      the escape's first step 4 margin steps, not 1 (calibrator.escape_start)
    +escape-handover    once the demand is seen the escape drops to what keeps the action's centre at that demand
                        (at most where it was), not to its half, and each step of a search is 4 times the last, not 2
                        (calibrator.escape_release, escape_growth)
    +impute-repeat      the window's E-step under a mixture forecast: the last demand seen, repeated with the service's
                        running share of repeats, or the Gaussian (estimator.impute_repeat, picrl_core.repeats)
    +act-on-repeat      the action at that mixture's critical-fractile quantile: on the last demand seen when the share
                        of repeats puts the fractile there (estimator.act_on_repeat, repeats.repeat_quantile)
    +validation-start   a new service starts its margin and temperature at the levels the model's own closed-loop
                        run on the validation split settled at, not at 0 and 1 (calibrator.start_from_validation)
    +scale-skips-repeats  the online temperature's EM step weighs each tick by the repeat mixture's Gaussian
                        responsibility: a seen demand that repeated the last one leaves T where it is
                        (calibrator.scale_skips_repeats)
    +idle-hurdle        a point mass at the range's floor (a hurdle) in that forecast, its mass the window's Markov
                        transition into idle out of the last tick's state: the action its critical-fractile quantile
                        (the floor where the mass reaches the fractile), a tick seen at the floor leaving T alone, an
                        order at the floor no margin step (estimator.idle_hurdle, picrl_core.idle; the default)

and options tried on top of the default and left off because they did not help here:

    +online-scale-1/32 .. -1/2   the online temperature at one fixed rate (what the selection chooses among)
    +margin-step-1/2    delta_m = 0.05, the other candidate of the round that chose 0.025
    +margin-step-1/8    delta_m = 0.0125, the next halving, asked once the escape answered censoring streaks
    +no-censored-reward, +no-k-sigma   ablations A2 and A4 of the default (they lowered the test regret on
                        GenAI in two rounds of tables: do the development splits say so too?)
    +k-at-fractile      k held at the newsvendor fractile z* (policy.k_low = k_high = 0): Phase 2's policy sets eta
                        alone (does its learnt k beat the fractile?)
    +pessimism          Eq. 9's Psi back on top of the window's E-step (the paper's hedge and the default's, both)
    +windowed-predictor the paper's windowed LSTM again (predictor.kind), asked once the window's E-step was in
    +no-escape          the escape off (calibrator.escape), likewise
    +escape-from-16     the escape's first step 16 margin steps, the other candidate of the round that chose 4
    +escape-halve       the default's search growing by 4, but halving once the demand is seen (either change alone)
    +escape-doubling    the default's handover, but a search that doubles
    +escape-hold        once the demand is seen the escape halves, but not below what keeps the action's centre
                        at that demand; a search that doubles (calibrator.escape_release = "hold")
    +escape-growth-8, +escape-from-1   the handover with a search growing by 8, or starting from one margin step
    +repeat-rate-1/8, +repeat-rate-1/128   the repeat share's step 4 times larger or smaller than one window's 1/32

next to the default's full-information reference (the same controller fed the demand), the two
strongest baselines on the same development split (conformal and the censored SGD residual tracker,
each with its knobs chosen on the same validation part and the same number of candidates) and the
portfolio (``picrl worker --method portfolio``: the per-service choice among PIC-RL's order, conformal
and SGD on the default's predictor, its forgetting and switching price chosen on the same validation
part), which the adoption rule judges against the default as it judges a rung.

Run on demand (not part of the test suite; a rung costs ~15-30 s per trace and seed on 2 cores, DLRM more):

    python benchmarks/select_design.py --out benchmarks/results/design [--pods 6] [--seeds 1] [--fleet]
        [--rungs NAME ...] [--traces NAME ...]

``--fleet`` adds the 91-pod fleet (``picrl compare --datasets pods``) on its development split;
``--rungs`` runs only the named variants (the default is always run: the ratios are to its
full-information regret).

Prints the regret table, writes ``design.json``, ``design.csv`` and ``design.png`` (regret of each
variant over the default's full-information regret, per trace).

**The adoption rule.** A variant replaces the default only when it is better beyond the noise of the
runs: over the trace-seed pairs, the 90% bootstrap interval of the mean log regret ratio (variant over
default, paired by trace and seed) must lie below 0 (:func:`paired_verdict`: ``better``; ``worse`` when it
lies above, else ``within noise``, and the default stays). The table prints each variant's verdict;
``--verdicts-of DIR/design.json`` prints them for a stored run without running anything.
"""

from __future__ import annotations

import argparse
import csv
import json
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import matplotlib
import numpy as np
import torch
from host import StealMeter, describe

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from picrl.comparison.runner import FULL  # noqa: E402
from picrl.datasets import load_dataset, load_pod_fleet  # noqa: E402
from picrl_core import synthetic  # noqa: E402
from picrl_core.config import PicRLConfig  # noqa: E402
from picrl_core.methods.base import Provisioner  # noqa: E402
from picrl_core.methods.censored_sgd import fit_censored_sgd_residual  # noqa: E402
from picrl_core.methods.conformal import fit_conformal  # noqa: E402
from picrl_core.methods.evaluation import growth_episode  # noqa: E402
from picrl_core.methods.pic_rl import PicRLProvisioner  # noqa: E402
from picrl_core.methods.portfolio import fit_portfolio  # noqa: E402
from picrl_core.pipeline import phase1_predictor, train_offline  # noqa: E402
from picrl_core.series import (  # noqa: E402
    PreparedSeries,
    development_series,
    native_splits,
    prepare_fleet,
    prepare_series,
)
from picrl_core.training_memo import shared_training  # noqa: E402

Variant = Callable[[PicRLConfig], PicRLConfig]
PAPER_PRESET = Path(__file__).resolve().parent.parent / "configs" / "paper.json"
# Each departure from the paper, in the order the ladder adds them: (rung name, the settings it changes).
CHANGES: tuple[tuple[str, tuple[tuple[str, str], ...]], ...] = (
    ("+pinball", (("calibrator", "rule"),)),
    ("+temperature", (("predictor", "calibrate_sigma"),)),
    ("+sigma-step", (("calibrator", "margin_in_sigma"), ("calibrator", "delta_m"), ("calibrator", "delta_b"))),
    ("+k-around-fractile", (("policy", "k_low"), ("policy", "k_high"), ("policy", "k_around_fractile"))),
    ("+act-with-mean", (("online", "explore"),)),
    ("+online-scale", (("calibrator", "online_scale"), ("calibrator", "select_scale_rate"))),
    ("+incremental-predictor", (("predictor", "kind"),)),
    ("+margin-step-1/4", (("calibrator", "delta_m"),)),
    ("+escape", (("calibrator", "escape"),)),
    ("+impute-window", (("estimator", "impute_window"),)),
    ("+no-pessimism", (("reward", "use_pessimism"),)),
    ("+escape-from-4", (("calibrator", "escape_start"),)),
    ("+escape-handover", (("calibrator", "escape_release"), ("calibrator", "escape_growth"))),
    ("+impute-repeat", (("estimator", "impute_repeat"),)),
    ("+act-on-repeat", (("estimator", "act_on_repeat"),)),
    ("+validation-start", (("calibrator", "start_from_validation"),)),
    ("+scale-skips-repeats", (("calibrator", "scale_skips_repeats"),)),
    ("+idle-hurdle (default)", (("estimator", "idle_hurdle"),)),
)
# A setting that two rungs change holds, between them, the value the first one gave it.
INTERIM = {("calibrator", "delta_m"): 0.1}


def _with_paper_values(
    settings: list[tuple[str, str]], interim: dict[tuple[str, str], object] | None = None
) -> Variant:
    """The config with ``settings`` set back to the paper preset's values (to ``interim``'s where given)."""
    interim = interim or {}
    preset = json.loads(PAPER_PRESET.read_text())
    covered = {(section, key) for _, changed in CHANGES for section, key in changed}
    missing = {(section, key) for section, values in preset.items() for key in values} - covered
    if missing:
        raise ValueError(f"{PAPER_PRESET} sets {sorted(missing)}, which no rung of the ladder covers")

    def apply(config: PicRLConfig) -> PicRLConfig:
        for section, key in settings:
            value = interim.get((section, key), preset[section][key])
            config = replace(config, **{section: replace(getattr(config, section), **{key: value})})
        return config

    return apply


def ladder() -> dict[str, Variant]:
    """Rung ``i`` keeps the first ``i`` changes and the paper's values for the rest (a setting an earlier rung
    changed and a later one changes again: its :data:`INTERIM` value); then the default with each option that
    was tried and left off."""
    rungs = {"paper": _with_paper_values([s for _, changed in CHANGES for s in changed])}
    for i, (name, _) in enumerate(CHANGES):
        kept = {s for _, changed in CHANGES[: i + 1] for s in changed}
        rungs[name] = _with_paper_values(
            [s for _, changed in CHANGES[i + 1 :] for s in changed], {s: INTERIM[s] for s in kept if s in INTERIM}
        )
    # the LSTM re-reads its window from a zero state each tick (the paper's), asked again under the window's E-step
    rungs["+windowed-predictor"] = lambda c: replace(c, predictor=replace(c.predictor, kind="windowed"))
    # the escape off again: adopted while the window kept a shortage's bound; the E-step now answers a streak too
    rungs["+no-escape"] = lambda c: replace(c, calibrator=replace(c.calibrator, escape=False))
    rungs["+escape-halve"] = lambda c: replace(c, calibrator=replace(c.calibrator, escape_release="halve"))
    rungs["+escape-doubling"] = lambda c: replace(c, calibrator=replace(c.calibrator, escape_growth=2.0))
    rungs["+escape-hold"] = lambda c: replace(
        c, calibrator=replace(c.calibrator, escape_release="hold", escape_growth=2.0)
    )
    rungs["+escape-growth-8"] = lambda c: replace(c, calibrator=replace(c.calibrator, escape_growth=8.0))
    rungs["+escape-from-1"] = lambda c: replace(c, calibrator=replace(c.calibrator, escape_start=1.0))
    # the escape's first step at 16 margin steps, the other candidate of the round that chose 4
    rungs["+escape-from-16"] = lambda c: replace(c, calibrator=replace(c.calibrator, escape_start=16.0))
    for label, rate in (("1/8", 1 / 8), ("1/128", 1 / 128)):  # the repeat share's step, around one window's 1/32
        rungs[f"+repeat-rate-{label}"] = lambda c, rate=rate: replace(
            c, estimator=replace(c.estimator, repeat_rate=rate)
        )
    rungs["+pessimism"] = lambda c: replace(c, reward=replace(c.reward, use_pessimism=True))  # Eq. 9 back
    rungs["+no-censored-reward"] = lambda c: replace(c, reward=replace(c.reward, use_censored_reward=False))
    rungs["+no-k-sigma"] = lambda c: replace(c, ablation=replace(c.ablation, use_k_sigma=False))
    # k held at the newsvendor fractile z* (its range shrunk to a point): Phase 2's policy sets eta alone
    rungs["+k-at-fractile"] = lambda c: replace(c, policy=replace(c.policy, k_low=0.0, k_high=0.0))
    rungs["+margin-step-1/2"] = lambda c: replace(
        c, calibrator=replace(c.calibrator, delta_m=INTERIM[("calibrator", "delta_m")] / 2)
    )  # the other candidate of the round that chose a quarter
    rungs["+margin-step-1/8"] = lambda c: replace(
        c, calibrator=replace(c.calibrator, delta_m=INTERIM[("calibrator", "delta_m")] / 8)
    )  # the next halving, now that the escape answers censoring streaks
    for label, rate in (("1/32", 1 / 32), ("1/8", 1 / 8), ("1/4", 1 / 4), ("1/2", 1 / 2)):
        rungs[f"+online-scale-{label}"] = lambda c, rate=rate: replace(
            c, calibrator=replace(c.calibrator, select_scale_rate=False, scale_rate=rate)
        )
    return rungs


# Pods of the 91 whose GPU duty cycle the ladder runs as a demand of its own (idle stretches: their duty is 0 on
# 37% of the development training part and 75-85% of its validation part), evenly spaced among the 72 with a
# duty series; pods 45 and 80 are the outside check's (benchmarks/outside_shapes.py).
DUTY_PODS = 4


def traces(pods: int) -> dict[str, tuple[np.ndarray, np.ndarray | None, tuple[str, ...]]]:
    """Name -> (values, context, context names): the GenAI datasets, DLRM (growth past the training range),
    ``pods`` evenly spaced real pods, :data:`DUTY_PODS` pods' duty cycles (idle stretches) and synthetic
    shapes the bundled data lacks (surges, heavy-tailed bursts, drift, a daily wave, geometric growth, idle
    stretches that grow more frequent, and a service that scales to zero half the time)."""
    out = {}
    for name in ("genai-mem", "genai-ctx", "dlrm"):
        trace = load_dataset(name)
        out[name] = (trace.values, trace.context, tuple(trace.context_names))
    fleet = load_pod_fleet()
    for index in np.linspace(0, len(fleet) - 1, pods).round().astype(int) if pods else []:
        out[f"pod-{index}"] = (fleet[index].values, None, ())
    with_duty = [i for i, pod in enumerate(fleet) if pod.context is not None and i not in (45, 80)]
    for index in np.asarray(with_duty)[np.linspace(0, len(with_duty) - 1, DUTY_PODS).round().astype(int)]:
        out[f"duty-{index}"] = (fleet[index].context[:, 0], None, ())
    n = 1440
    out |= {
        "syn-surges": (synthetic.surges(n, seed=1), None, ()),
        "syn-bursts": (synthetic.heavy_tailed_bursts(n, burst_rate=0.03, seed=2), None, ()),
        "syn-drift": (synthetic.linear_drift(n, seed=3), None, ()),
        "syn-daily": (synthetic.diurnal(n, period=288, seed=4), None, ()),
        "syn-growth": (synthetic.exponential_growth(n, seed=5), None, ()),
        "syn-idling": (synthetic.intermittent(n, seed=6), None, ()),
        "syn-scale-to-zero": (synthetic.intermittent(n, idle_share=(0.5, 0.5), seed=7), None, ()),
    }
    return out


def regret(
    provisioner: Provisioner, series: PreparedSeries, native: np.ndarray, config: PicRLConfig, censoring: bool = True
) -> dict:
    """Regret and metrics of a fitted ``provisioner`` on the development test part, as the product runs it:
    the product protocol on its unclipped ``native`` demand, in units of the training range."""
    run = growth_episode(provisioner, series, native, config, censoring=censoring)
    growth = {key: run.extra[key] for key in ("ticks_above_peak", "catch_up_ticks", "shortfall_above_peak")}
    return run.metrics.to_dict() | {key: None if np.isnan(value) else value for key, value in growth.items()}


def evaluate_trace(series: PreparedSeries, native: np.ndarray, seed: int, rungs: list[str] | None = None) -> dict:
    """Every variant (or the default and ``rungs``) and reference on one development series, whose test part
    is ``native`` in native units."""
    base = replace(FULL.apply(PicRLConfig()), seed=seed)
    rows: dict[str, dict] = {}
    with shared_training():
        for name, variant in ladder().items():
            if rungs is not None and name not in rungs and not name.endswith("(default)"):
                continue
            artifact = train_offline(series, variant(base))
            rows[name] = regret(PicRLProvisioner.from_artifact(artifact), series, native, artifact.config)
            if name.endswith("(default)"):
                rows["default, full information"] = regret(
                    PicRLProvisioner.from_artifact(artifact), series, native, artifact.config, censoring=False
                )
        predictor = phase1_predictor(series, base)
        rows["conformal"] = regret(fit_conformal(series, base, predictor=predictor), series, native, base)
        rows["sgd-residual"] = regret(
            fit_censored_sgd_residual(series, base, predictor=predictor), series, native, base
        )
        rows["portfolio"] = regret(fit_portfolio(series, base), series, native, base)
    return rows


def plot(results: dict[str, dict[str, dict]], path: Path) -> Path:
    names = list(next(iter(results.values())))
    fig, ax = plt.subplots(figsize=(11, 4.5))
    width = 0.8 / len(names)
    for i, name in enumerate(names):
        ratios = [
            rows[name]["regret"] / max(rows["default, full information"]["regret"], 1e-9) for rows in results.values()
        ]
        ax.bar(np.arange(len(results)) + i * width, ratios, width, label=name)
    ax.axhline(1.0, color="black", lw=0.8)
    ax.set_xticks(np.arange(len(results)) + 0.4 - width / 2, list(results), rotation=30, ha="right")
    ax.set_ylabel("regret / default's full-information regret")
    ax.set_title("Design ladder on development splits (the test split is never read)")
    ax.legend(fontsize=7, ncol=3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def paired_verdict(
    results: dict[str, dict[str, dict]],
    variant: str,
    base: str,
    draws: int = 10_000,
    level: float = 0.90,
    seed: int = 0,
) -> dict:
    """``variant`` against ``base`` over the trace-seed pairs of ``results``: the mean of
    ``log(regret_variant / regret_base)`` (negative: the variant is better), its ``level`` bootstrap interval
    (pairs resampled with replacement) and the verdict of the adoption rule."""
    logs = np.array(
        [np.log(max(rows[variant]["regret"], 1e-9) / max(rows[base]["regret"], 1e-9)) for rows in results.values()]
    )
    means = np.random.default_rng(seed).choice(logs, size=(draws, logs.size)).mean(axis=1)
    low, high = np.quantile(means, [(1 - level) / 2, (1 + level) / 2])
    verdict = "better" if high < 0 else "worse" if low > 0 else "within noise"
    return {
        "mean_log_ratio": float(logs.mean()),
        "interval": [float(low), float(high)],
        "pairs": int(logs.size),
        "verdict": verdict,
    }


def print_verdicts(results: dict[str, dict[str, dict]]) -> dict[str, dict]:
    """Each variant's verdict against the default (the variant whose name ends in ``(default)``)."""
    names = list(next(iter(results.values())))
    base = next(m for m in names if m.endswith("(default)"))
    verdicts = {m: paired_verdict(results, m, base) for m in names if m != base and "full information" not in m}
    print(
        f"\nadoption rule, against {base} over {len(results)} trace-seed pairs (90% bootstrap interval of the "
        "mean log regret ratio; better only when it lies below 0):"
    )
    for m, v in verdicts.items():
        print(
            f"  {m:<30} {v['mean_log_ratio']:+.3f}  [{v['interval'][0]:+.3f}, {v['interval'][1]:+.3f}]  {v['verdict']}"
        )
    return verdicts


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, required=True, help="folder for design.json, design.csv, design.png")
    parser.add_argument("--pods", type=int, default=6, help="evenly spaced real pods to include (default 6)")
    parser.add_argument("--seeds", type=int, default=1, help="seeds per trace (default 1)")
    parser.add_argument(
        "--first-seed",
        type=int,
        default=0,
        help="the first seed (default 0): a confirmatory run on seeds an earlier run did not use",
    )
    parser.add_argument("--fleet", action="store_true", help="add the 91-pod fleet as one more trace")
    parser.add_argument(
        "--rungs",
        nargs="+",
        choices=list(ladder()),
        metavar="NAME",
        help="only these variants besides the default (default: the whole ladder)",
    )
    parser.add_argument(
        "--traces",
        nargs="+",
        choices=list(traces(6)),
        metavar="NAME",
        help="only these traces (default: every trace; the pods among them at the default --pods 6)",
    )
    parser.add_argument(
        "--verdicts-of",
        type=Path,
        nargs="+",
        metavar="DESIGN_JSON",
        help="print the adoption rule's verdicts of stored runs' design.json (several: over the "
        "trace-seed pairs of all of them) and exit",
    )
    args = parser.parse_args()
    if args.verdicts_of:
        print_verdicts(
            {pair: rows for path in args.verdicts_of for pair, rows in json.loads(path.read_text())["traces"].items()}
        )
        return
    torch.set_num_threads(1)
    args.out.mkdir(parents=True, exist_ok=True)
    steal = StealMeter()
    started = time.perf_counter()
    results: dict[str, dict[str, dict]] = {}
    # each development series with its test part (the trace's validation split) in native units
    developed = {
        name: (development_series(prepare_series(values, name, context, context_names)), native_splits(values, name)[1])
        for name, (values, context, context_names) in traces(args.pods).items()
        if args.traces is None or name in args.traces
    }
    if args.fleet:
        fleet = load_dataset("pods").values
        developed["pods-fleet"] = (development_series(prepare_fleet(fleet, "pods")), native_splits(fleet, "pods")[1])
    for name, (series, native) in developed.items():
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            key = f"{name} seed {seed}" if args.seeds > 1 or args.first_seed else name
            results[key] = evaluate_trace(series, native, seed, args.rungs)
            print(f"{key:<18} " + "  ".join(f"{m} {r['regret']:.2f}" for m, r in results[key].items()), flush=True)
    names = list(next(iter(results.values())))
    ratios = {
        m: [rows[m]["regret"] / max(rows["default, full information"]["regret"], 1e-9) for rows in results.values()]
        for m in names
    }
    wins = {
        m: sum(
            rows[m]["regret"] <= min(rows[o]["regret"] for o in names if "full information" not in o)
            for rows in results.values()
        )
        for m in names
        if "full information" not in m
    }
    print("\nvariant                         mean regret / FI   geo-mean   lowest on   mean shortage")
    for m in names:
        shortage = np.mean([rows[m]["shortage_rate"] for rows in results.values()])
        print(
            f"{m:<30} {np.mean(ratios[m]):>14.3f} {np.exp(np.mean(np.log(ratios[m]))):>10.3f} "
            f"{wins.get(m, '-'):>10} {shortage:>14.3f}"
        )
    verdicts = print_verdicts(results)
    with (args.out / "design.csv").open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["trace", "variant", "regret", "mae", "shortage_rate", "regret_over_full_information"])
        for trace, rows in results.items():
            for m, r in rows.items():
                writer.writerow(
                    [
                        trace,
                        m,
                        f"{r['regret']:.6g}",
                        f"{r['mae']:.6g}",
                        f"{r['shortage_rate']:.4g}",
                        f"{r['regret'] / max(rows['default, full information']['regret'], 1e-9):.4g}",
                    ]
                )
    (args.out / "design.json").write_text(
        json.dumps(
            {
                "machine": describe(),
                "seconds": time.perf_counter() - started,
                "cpu_steal_share": steal.share(),
                "summary": {
                    m: {"mean_ratio": float(np.mean(ratios[m])), "wins": wins.get(m), "verdict": verdicts.get(m)}
                    for m in names
                },
                "traces": results,
            },
            indent=2,
        )
        + "\n"
    )
    plot(results, args.out / "design.png")
    print(f"written: {args.out / 'design.json'}, {args.out / 'design.csv'}, {args.out / 'design.png'}")


if __name__ == "__main__":
    main()
