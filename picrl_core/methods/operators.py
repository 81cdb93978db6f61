"""The operator and statistical rows of Tables 2 and 3: conformal, Thompson sampling, SPO+, Autopilot,
VPA, the censored newsvendors (Tobit, Kaplan-Meier, stochastic gradient), the naive learner of Proposition 1,
the full-information references and the two hindsight references (not methods: they read the test split).

``fit_vpa`` and ``fit_autopilot`` take ``step_seconds`` (default 60 s, the DLRM step; 57 s for the
GenAI traces): their entries are ``timed``, and :meth:`Method.fitted` passes the trace's period.
"""

from __future__ import annotations

from picrl_core.methods.autopilot import fit_autopilot
from picrl_core.methods.base import Method
from picrl_core.methods.censored_sgd import fit_censored_sgd, fit_censored_sgd_residual
from picrl_core.methods.conformal import fit_conformal
from picrl_core.methods.naive import fit_naive
from picrl_core.methods.newsvendor import fit_kaplan_meier, fit_tobit
from picrl_core.methods.oracle import fit_oracle, fit_oracle_mu
from picrl_core.methods.spo import fit_spo
from picrl_core.methods.thompson import fit_thompson
from picrl_core.methods.vpa import fit_vpa

HUH_2009 = (
    "Huh & Rusmevichientong, A Nonparametric Asymptotic Analysis of Inventory Planning with Censored "
    "Demand (Mathematics of Operations Research 2009)"
)

METHODS: list[Method] = [
    Method(
        "conformal",
        "Conformal",
        "Angelopoulos & Bates, A Gentle Introduction to Conformal Prediction "
        "(2023); Gibbs & Candes, Adaptive Conformal Inference Under Distribution Shift (NeurIPS 2021)",
        "phase-3",
        fit_conformal,
        deployable=True,
    ),
    Method(
        "conformal-fi",
        "Conformal, full information",
        "One-sided conformal run with the demand revealed every tick (no censoring)",
        "reference",
        fit_conformal,
        censoring=False,
    ),
    Method(
        "conformal-coupled",
        "Conformal, coupled flags",
        "One-sided conformal reading the coupled censoring flags of a multi-resource fleet (picrl_core.resources)",
        "multi-resource",
        fit_conformal,
        coupled=True,
        multi_resource_only=True,
    ),
    Method(
        "thompson",
        "Thompson Sampling",
        "Agrawal & Goyal, Further Optimal Regret Bounds for Thompson Sampling (AISTATS 2013)",
        "phase-2+3",
        fit_thompson,
        deployable=True,
    ),
    Method(
        "spo", "SPO+", 'Elmachtoub & Grigas, Smart "Predict, then Optimize" (Management Science 2022)', "full", fit_spo
    ),
    Method(
        "autopilot",
        "Autopilot",
        "Rzadca et al., Autopilot: Workload Autoscaling at Google (EuroSys 2020)",
        "full",
        fit_autopilot,
        timed=True,
    ),
    Method(
        "vpa",
        "Kubernetes VPA",
        "kubernetes/autoscaler, vertical-pod-autoscaler recommender "
        "(decaying histogram, p90 target, 15% margin, OOM bump-up)",
        "operator",
        fit_vpa,
        timed=True,
        deployable=True,
    ),
    Method(
        "tobit",
        "Tobit newsvendor",
        "Tobin, Estimation of Relationships for Limited Dependent Variables "
        "(Econometrica 1958); critical-fractile newsvendor",
        "operator",
        fit_tobit,
    ),
    Method(
        "kaplan-meier",
        "Kaplan-Meier newsvendor",
        "Huh, Levi, Rusmevichientong & Orlin, Adaptive "
        "Data-Driven Inventory Control with Censored Demand Based on Kaplan-Meier Estimator (Operations "
        "Research 2011)",
        "operator",
        fit_kaplan_meier,
        deployable=True,
    ),
    Method("sgd", "Censored SGD newsvendor", HUH_2009, "operator", fit_censored_sgd, deployable=True),
    Method(
        "sgd-residual",
        "Censored SGD on the LSTM's mu",
        f"{HUH_2009}, as a residual tracker on the Phase-1 predictor",
        "operator",
        fit_censored_sgd_residual,
        deployable=True,
    ),
    Method(
        "naive",
        "Naive (uncensored-only)",
        "PIC-RL paper, Proposition 1 (instability under mixture)",
        "operator",
        fit_naive,
    ),
    Method(
        "oracle",
        "Persistence + hindsight buffer",
        "The previous true demand plus the best constant buffer for the test split, in hindsight (reads the test "
        "split; not a bound)",
        "hindsight",
        fit_oracle,
        coupled=True,
    ),
    Method(
        "oracle-mu",
        "PIC-RL's mu + hindsight buffer",
        "PIC-RL's Phase-1 forecast mu on the true history plus the best constant buffer for the test split, in "
        "hindsight (reads the test split; not a bound)",
        "hindsight",
        fit_oracle_mu,
        coupled=True,
    ),
]
