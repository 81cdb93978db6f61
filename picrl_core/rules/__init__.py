"""The deployable decision rules, one file each, behind one interface (:mod:`picrl_core.rules.base`): PIC-RL's
controller (:mod:`~picrl_core.rules.pic_rl`, its predictor variants too), the choice among buffer rules on it
(:mod:`~picrl_core.rules.portfolio`) and the baselines a worker can run.
:mod:`picrl_core.deployable` lists them by method name."""

# the deployable methods by name, in the registry's order (torch-free, for a command's --help)
DEPLOYABLE_METHODS = (
    "pic-rl",
    "tft",
    "informer",
    "autoformer",
    "portfolio",
    "recent-max",
    "conformal",
    "sgd",
    "sgd-residual",
    "kaplan-meier",
    "thompson",
    "vpa",
)
