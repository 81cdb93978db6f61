"""Exploratory: where PIC-RL's regret comes from on development splits (open-loop shift analysis).

Kept as the record of README.md's first table. From the repository root:

    python benchmarks/results/design/margin-step/open_loop_diagnostic.py genai-mem genai-ctx
"""
import sys, json
sys.path.insert(0, "benchmarks")
from dataclasses import replace
import numpy as np, torch
torch.set_num_threads(1)
from select_design import traces, FULL
from picrl_core.config import PicRLConfig
from picrl_core.costs import mean_service_metrics
from picrl_core.methods.base import run_pic_loop
from picrl_core.methods.conformal import fit_conformal
from picrl_core.pipeline import evaluation_inputs, phase1_predictor, train_offline
from picrl_core.series import development_series, prepare_series
from picrl_core.simulator import simulate
from picrl_core.controller import PicRLController
from picrl_core.training_memo import shared_training

names = sys.argv[1:]
T = traces(6)
out = {}
for name in names:
    values, ctx, cn = T[name]
    series = development_series(prepare_series(values, name, ctx, cn))
    base = replace(FULL.apply(PicRLConfig()), seed=0)
    with shared_training():
        art = train_offline(series, base)
        inputs = evaluation_inputs(series, art.config.predictor.window)
        d = np.asarray(inputs["demand"])
        ctrl = PicRLController(art.predictor, art.policy, art.config)
        tr = simulate(ctrl, d, inputs["history"], context=inputs["context"], history_context=inputs["history_context"])
        cost = art.config.cost
        def reg(a): return mean_service_metrics(np.clip(a, 0, 1), d, cost).to_dict()["regret"]
        pred = phase1_predictor(series, base)
        conf = fit_conformal(series, base, predictor=pred)
        loopc = run_pic_loop(conf, d, inputs["history"], context=inputs["context"], history_context=inputs["history_context"])
    a = tr.action[:, 0]; dd = d[:, 0]; s = tr.sigma[:, 0]; short = dd > a
    shifts = np.linspace(-0.03, 0.03, 61)
    rs = [reg(tr.action + c) for c in shifts]
    best = int(np.argmin(rs))
    ac = loopc.actions
    rc = [reg(ac + c) for c in shifts]; bc = int(np.argmin(rc))
    # components
    buf = tr.k[:, 0] * s
    row = dict(regret=reg(tr.action), shortage=short.mean(), best_shift=shifts[best], regret_best_shift=rs[best],
               conformal=reg(ac), conf_short=float((d > ac).mean()), conf_best_shift=shifts[bc], conf_regret_best_shift=rc[bc],
               sigma_short=s[short].mean(), sigma_over=s[~short].mean(), kbuf_mean=buf.mean(), kbuf_std=buf.std(),
               k_mean=tr.k[:, 0].mean(), k_std=tr.k[:, 0].std(), margin_mean=tr.margin[:, 0].mean(), margin_std=tr.margin[:, 0].std(),
               bias_mean=tr.bias[:, 0].mean(), mae_mu=np.abs(tr.mu[:, 0] - dd).mean(),
               regret_mu_plus_zs=reg(tr.mu + 0.4307 * tr.sigma), regret_no_k=reg(tr.action - tr.k * tr.sigma),
               regret_mu_only_shift=min(reg(tr.mu + c) for c in shifts))
    out[name] = row
    print(name, {k: round(float(v), 4) for k, v in row.items()}, flush=True)
json.dump(out, open(f"open_loop_{'_'.join(names)}.json", "w"), default=float)
