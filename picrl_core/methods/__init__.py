"""Every method of the comparison (paper Tables 2 and 3), by name: PIC-RL, its ablations and the baselines
(the per-service choice among buffer rules, :mod:`picrl_core.methods.portfolio`, after PIC-RL's family;
the recent-maximum rule, :mod:`picrl_core.methods.headroom`, last)."""

from picrl_core.methods.base import LoopResult, Method, Provisioner, run_pic_loop
from picrl_core.methods.headroom import METHOD as RECENT_MAX
from picrl_core.methods.learned import METHODS as LEARNED
from picrl_core.methods.operators import METHODS as OPERATORS
from picrl_core.methods.portfolio import METHOD as PORTFOLIO

REGISTRY: dict[str, Method] = {method.name: method for method in (*LEARNED, PORTFOLIO, *OPERATORS, RECENT_MAX)}

__all__ = ["REGISTRY", "LoopResult", "Method", "Provisioner", "run_pic_loop"]
