"""The learned methods of the comparison: PIC-RL, its phase substitutions (Table 2) and ablations (Table 3).

Every entry but Pensieve runs the one PIC-RL implementation (:mod:`picrl_core.methods.pic_rl`)
with one phase substituted or one config switch flipped.
"""

from __future__ import annotations

from functools import partial

from picrl_core.methods.base import Method
from picrl_core.methods.cql import fit_cql
from picrl_core.methods.pensieve import fit_pensieve
from picrl_core.methods.pic_rl import ABLATIONS, fit_pic_rl, fit_pic_rl_per_resource
from picrl_core.methods.predictors import GaussianAutoformer, GaussianInformer, GaussianTFT, fit_with_predictor

PAPER = "PIC-RL (this paper, pic-rl.tex, Algorithm 1)"

METHODS: list[Method] = [
    Method("pic-rl", "PIC-RL (Ours)", PAPER, "pic-rl", fit_pic_rl, coupled=True, deployable=True),
    Method(
        "pic-rl-fi",
        "PIC-RL, full information",
        f"{PAPER}, run with the demand revealed every tick (no censoring)",
        "reference",
        fit_pic_rl,
        censoring=False,
        coupled=True,
    ),
    Method(
        "pic-rl-per-resource",
        "PIC-RL per resource",
        f"{PAPER}, reading each resource's own shortage flag only "
        "(the coupling ignored, as a per-resource autoscaler does)",
        "multi-resource",
        fit_pic_rl_per_resource,
        multi_resource_only=True,
    ),
    Method(
        "tft",
        "TFT",
        "Lim et al., Temporal Fusion Transformers for interpretable multi-horizon time series "
        "forecasting, International Journal of Forecasting 37(4), 2021",
        "phase-1",
        partial(fit_with_predictor, GaussianTFT),
        deployable=True,
    ),
    Method(
        "informer",
        "Informer",
        "Zhou et al., Informer: beyond efficient transformer for long sequence time-series forecasting, AAAI 2021",
        "phase-1",
        partial(fit_with_predictor, GaussianInformer),
        deployable=True,
    ),
    Method(
        "autoformer",
        "Autoformer",
        "Wu et al., Autoformer: decomposition transformers with auto-correlation "
        "for long-term series forecasting, NeurIPS 2021",
        "phase-1",
        partial(fit_with_predictor, GaussianAutoformer),
        deployable=True,
    ),
    Method(
        "cql",
        "CQL",
        "Kumar et al., Conservative Q-learning for offline reinforcement learning, NeurIPS 2020",
        "phase-2",
        fit_cql,
    ),
    Method(
        "pensieve",
        "Pensieve",
        "Mao et al., Neural adaptive video streaming with Pensieve, SIGCOMM 2017",
        "phase-2+3",
        fit_pensieve,
    ),
    *(
        Method(a.name, a.label, f"{PAPER}, ablation {a.name.upper()} (Table 3)", "ablation", a.fit, coupled=True)
        for a in ABLATIONS
    ),
]
