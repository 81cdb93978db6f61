"""Every method of the comparison (paper Tables 2 and 3), by name: PIC-RL, its ablations and the baselines
(the recent-maximum rule, :mod:`picrl_core.methods.headroom`, last)."""

from picrl_core.methods.base import LoopResult, Method, Provisioner, run_pic_loop
from picrl_core.methods.headroom import METHOD as RECENT_MAX
from picrl_core.methods.learned import METHODS as LEARNED
from picrl_core.methods.operators import METHODS as OPERATORS

REGISTRY: dict[str, Method] = {method.name: method for method in (*LEARNED, *OPERATORS, RECENT_MAX)}

__all__ = ["REGISTRY", "LoopResult", "Method", "Provisioner", "run_pic_loop"]
