"""PIC-RL's Phase 3 generalised: each service chooses online among buffer rules on PIC-RL's own predictor.

The candidates share PIC-RL's controller (:class:`~picrl_core.controller.PicRLController`: its predictor, E-step and
calibrator), which acts as PIC-RL alone would: its action is its own order ``a^0 = clip(o_0, 0, 1)``, and it steps on
what the feedback ``(y_t, c_t)`` of the deployed ``a_t`` reveals of ``a^0``'s (:func:`own_feedback`):
``c^0 = c_t or y_t > a^0``, ``y^0 = min(y_t, a^0)``. Where ``a^0 <= a_t``, or the tick was not censored, that is
exactly ``(min(d_t, a^0), 1[d_t > a^0])``; where ``a^0 > a_t`` was undetermined, it is a lower bound ``d_t > y_t``
below the controller's action, which its E-step reads as censored and its calibrator as neither short nor over
(:func:`~picrl_core.calibrator.feedback`). Deployed on every tick, the controller is PIC-RL alone, bit for bit. After
its step, with its forecast ``(mu, sigma)``:

* ``o_0``: PIC-RL's own order (Eq. 11 through its order rule);
* ``o_1 = mu + q_t``: one-sided conformal on PIC-RL's residuals, ``q_t`` the ``ceil((P + 1)(1 - alpha_t))``-th
  smallest of the last ``P`` residuals (:func:`~picrl_core.rules.conformal.conformal_quantile`);
* ``o_2 = mu + b_t``: the censored newsvendor's stochastic gradient on a buffer over ``mu`` (Huh &
  Rusmevichientong 2009).

The deployed action is ``a_t = clip(o_{j_t}, 0, 1)``. What the feedback of ``a_t`` reveals of a candidate
``a^j = clip(o_j, 0, 1)`` (cost Eq. 1, ``c_u``, ``c_o``): on an uncensored tick the demand ``d = y``, so its cost
difference ``r^j = l(a^j, d) - l(a_t, d)`` is known; on a censored tick (``d > a_t``) a candidate ``a^j <= a_t`` was
short too and ``r^j = c_u (a_t - a^j)`` exactly; a candidate ``a^j > a_t`` has ``r^j`` in
``[-c_u (a^j - a_t), c_o (a^j - a_t)]``, and the choice reads its lower end, ``-c_u (a^j - a_t)``: the candidate
is taken to have covered the shortage (optimism under partial monitoring). The E-step's expectation under
``d | d > a_t ~ N(mu, sigma^2)`` would be the alternative, but a shortage that the forecast did not see coming is
the one it underrates, so it charged the higher candidate with over-provisioning exactly where the demand had left
the forecast behind (growth), and the choice stayed on the lower one (benchmarks/results/design/portfolio). The
E-step's expectation stands in for the candidate's shortage indicator ``s^j = 1[d > a^j]`` (``P(d > a^j | d >
a_t)``) in the conformal and gradient updates, and for the residual ``d - mu`` (``E[d | d > a_t] - mu``) in the
conformal pool.

The choice is follow-the-leader on forgotten cumulative costs with a switching price ``kappa`` (Eqs. in
docs/guide/algorithm.md): ``S^j_{t+1} = lambda S^j_t + r^j_t``; the deployed candidate changes to
``argmin_j S^j`` only when ``S^{j_t} - min_j S^j > kappa``. Its weight is ``w^j = exp(-S^j / kappa) / sum_i
exp(-S^i / kappa)`` (the chosen one's is on every action). A new service starts from the fleet's scores
``S_0`` (:attr:`PortfolioParameters.start_scores`, learnt on the validation split), not from equal ones, and on
PIC-RL (``j_0 = 0``) unless the fleet's leader is ahead of it by more than ``kappa``.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from picrl_core.artifact import ModelArtifact
from picrl_core.calibrator import SHORTAGE_TOLERANCE
from picrl_core.config import PicRLConfig
from picrl_core.controller import PicRLController
from picrl_core.controller_state import ControllerState
from picrl_core.costs import asymmetric_cost, critical_ratio
from picrl_core.mills import log_normal_survival, mean_above
from picrl_core.policy import PolicyNetwork
from picrl_core.rules.base import DeployableRule
from picrl_core.rules.conformal import conformal_quantile
from picrl_core.state_codec import StateCodec

CANDIDATES = ("pic-rl", "conformal", "sgd")  # o_0, o_1, o_2 of the module docstring
POOL = 64  # P: the residuals each service's conformal candidate keeps (float32, in its row)


@dataclass(frozen=True)
class PortfolioParameters:
    """The choice's constants and the fleet's start (JSON values in the artifact)."""

    forgetting: float  # lambda: the scores' discount per tick
    price: float  # kappa: the switching price and the weights' temperature, in cost units of the range
    aci_step: float  # gamma: adaptive conformal inference's step on alpha_t
    sgd_step: float  # epsilon: the buffer's gradient step
    calibration: tuple[float, ...]  # the P residuals every service's pool starts from
    start_scores: tuple[float, ...]  # S_0: the fleet's scores a new service starts from, one per candidate

    def __post_init__(self) -> None:
        if not 0.0 < self.forgetting < 1.0 or self.price <= 0.0 or self.aci_step < 0.0 or self.sgd_step < 0.0:
            raise ValueError(f"need 0 < forgetting < 1, price > 0 and non-negative steps; got {self}")
        if len(self.calibration) != POOL or len(self.start_scores) != len(CANDIDATES):
            raise ValueError(f"need {POOL} calibration residuals and {len(CANDIDATES)} start scores")

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> PortfolioParameters:
        return cls(
            float(values["forgetting"]),
            float(values["price"]),
            float(values["aci_step"]),
            float(values["sgd_step"]),
            tuple(float(v) for v in values["calibration"]),
            tuple(float(v) for v in values["start_scores"]),
        )

    def to_dict(self) -> dict[str, Any]:
        return {f.name: list(v) if isinstance(v, tuple) else v for f in fields(self) for v in (getattr(self, f.name),)}


_OWN: list[tuple[Any, ...]] = [
    ("orders", "<f8", (len(CANDIDATES),)),  # o_j for the pending tick, before their clip
    ("pool", "<f4", (POOL,)),  # the conformal candidate's last P residuals, oldest first
    ("alpha", "<f8"),  # alpha_t
    ("offset", "<f8"),  # b_t
    ("scores", "<f8", (len(CANDIDATES),)),  # S^j_t
    ("chosen", "<i8"),  # j_t
    ("weight", "<f8"),  # w^{j_t}
    ("deployed", "<f8"),  # a_t: the action in force (the chosen order's clip, or the capacity a scheduler applied)
    ("streak", "<i8"),  # a_t's feedback's consecutive censored ticks (the controller's are a^0's)
]
OWN_NAMES = tuple(name for name, *_ in _OWN)


@dataclass
class PortfolioState:
    """The controller's state (its ``action`` is PIC-RL's own order ``a^0``) and the choice's own records (the
    deployed action ``a_t`` among them)."""

    controller: ControllerState
    own: np.recarray

    def __len__(self) -> int:
        return len(self.controller)

    @property
    def keys(self) -> np.ndarray:
        return self.controller.keys

    @property
    def tick(self) -> np.ndarray:
        return self.controller.tick

    @tick.setter
    def tick(self, value: np.ndarray) -> None:
        self.controller.tick = value

    @property
    def action(self) -> np.ndarray:
        return np.asarray(self.own.deployed)

    @action.setter
    def action(self, value: np.ndarray) -> None:
        self.own.deployed = value

    @property
    def censor_streak(self) -> np.ndarray:
        return np.asarray(self.own.streak)

    def __getattr__(self, name: str) -> np.ndarray:  # the action record's breakdown: the controller's
        if name in ("mu", "sigma", "k", "eta", "margin", "bias", "escape"):
            value: np.ndarray = getattr(self.controller, name)
            return value
        raise AttributeError(name)


class PortfolioCodec:
    """One flat row: the controller's fields (:class:`~picrl_core.state_codec.StateCodec`) then the choice's."""

    def __init__(self, controller: StateCodec) -> None:
        self.controller = controller
        self.dtype = np.dtype(controller.dtype.descr + _OWN)
        self.own_dtype = np.dtype(_OWN)

    def pack(self, state: PortfolioState, out: np.ndarray | None = None) -> np.ndarray:
        rows = np.empty(len(state), dtype=self.dtype) if out is None else out
        for name in self.controller.dtype.names or ():
            rows[name] = getattr(state.controller, name)
        for name in OWN_NAMES:
            rows[name] = state.own[name]
        return rows

    def unpack(self, rows: np.ndarray) -> PortfolioState:
        if rows.dtype != self.dtype:
            raise ValueError(f"rows have layout {rows.dtype}, expected {self.dtype}")
        controller = ControllerState(
            **{name: np.array(rows[name], dtype=rows.dtype[name].base) for name in self.controller.dtype.names or ()}
        )
        own = np.zeros(len(rows), dtype=self.own_dtype).view(np.recarray)
        for name in OWN_NAMES:
            own[name] = rows[name]
        return PortfolioState(controller, own)


def own_feedback(y: np.ndarray, censored: np.ndarray, own: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """What the feedback ``(y, c)`` of the deployed action says of another action ``own``: ``c^0 = c or y > own``
    (beyond :data:`~picrl_core.calibrator.SHORTAGE_TOLERANCE`, as the calibrator reads a shortage) and ``y^0 =
    min(y, own)`` where ``c^0``, else ``y``; exact unless ``c`` and ``own`` is above ``y`` (then a lower bound: the
    module docstring). For ``own`` the deployed action it is ``(y, c)`` itself."""
    short = censored | (y > own + SHORTAGE_TOLERANCE)
    return np.where(short, np.minimum(y, own), y), short


def truncated_survival(mu: np.ndarray, sigma: np.ndarray, bound: np.ndarray, above: np.ndarray) -> np.ndarray:
    """``P(d > above | d > bound)`` for ``d ~ N(mu, sigma^2)``, ``above >= bound`` (log survivals: no underflow)."""
    z_bound, z_above = (bound - mu) / sigma, (above - mu) / sigma
    return np.exp(np.minimum(log_normal_survival(z_above) - log_normal_survival(z_bound), 0.0))


class PortfolioRule(DeployableRule):
    """The per-service choice among :data:`CANDIDATES` on one PIC-RL controller (the module docstring)."""

    method = "portfolio"

    def __init__(
        self, predictor: Any, policy: PolicyNetwork, config: PicRLConfig, parameters: PortfolioParameters
    ) -> None:
        self.controller = PicRLController(predictor, policy, config)
        self.cost = config.cost
        self.alpha = 1.0 - critical_ratio(config.cost)  # the newsvendor's shortage rate
        self.settings = parameters
        self._codec = PortfolioCodec(StateCodec.for_config(config))

    @classmethod
    def from_artifact(cls, artifact: ModelArtifact) -> PortfolioRule:
        predictor, policy, _ = artifact.networks()
        return cls(predictor, policy, artifact.config, PortfolioParameters.from_dict(artifact.parameters))

    @property
    def codec(self) -> PortfolioCodec:
        return self._codec

    def parameters(self) -> dict[str, Any]:
        return self.settings.to_dict()

    def choice(self, state: PortfolioState) -> tuple[list[str], np.ndarray]:
        return [CANDIDATES[j] for j in state.own.chosen.tolist()], np.array(state.own.weight)

    def initial_state(
        self,
        keys: np.ndarray,
        history: np.ndarray,
        low: np.ndarray,
        high: np.ndarray,
        history_context: np.ndarray | None = None,
        start_tick: int | np.ndarray = 0,
    ) -> PortfolioState:
        controller = self.controller.initial_state(keys, history, history_context, start_tick)
        n, s = len(controller), self.settings
        own = np.zeros(n, dtype=self._codec.own_dtype).view(np.recarray)
        own.pool = np.asarray(s.calibration, dtype=np.float32)
        own.alpha = self.alpha
        own.offset = np.clip(np.quantile(np.asarray(s.calibration, dtype=np.float32), 1.0 - self.alpha), -1.0, 1.0)
        own.scores = np.asarray(s.start_scores, dtype=np.float64)
        own.chosen = 0  # PIC-RL alone, left at once only where the fleet's start scores lead it by more than kappa
        return self._decide(controller, own)

    def step(
        self,
        state: PortfolioState,
        y: np.ndarray,
        censored: np.ndarray,
        context: np.ndarray | None = None,
        missing: np.ndarray | None = None,
    ) -> tuple[PortfolioState, None]:
        if missing is not None and np.any(missing):
            raise ValueError(f"{self.method} decides one resource per service: no tick goes unobserved")
        pending, s, cost = state.controller, self.settings, self.cost
        y, censored = np.asarray(y, dtype=np.float64), np.asarray(censored, dtype=bool)
        a, mu, sigma = state.action, pending.mu, pending.sigma
        candidates = np.clip(state.own.orders, 0.0, 1.0)  # (B, J)
        a_j, mu_j, sigma_j, _ = np.broadcast_arrays(a[:, None], mu[:, None], sigma[:, None], candidates)
        above = censored[:, None] & (candidates > a_j)  # undetermined: censored below the candidate
        # r^j: exact where determined, the bound's lower end where not (the candidate covered the shortage)
        known = asymmetric_cost(candidates, y[:, None], cost) - asymmetric_cost(a, y, cost)[:, None]
        known = np.where(censored[:, None], cost.c_under * (a_j - candidates), known)
        relative = np.where(above, -cost.c_under * (candidates - a_j), known)
        # s^j: the candidate's shortage (its probability where undetermined); over where it was not short
        short = np.where(
            above,
            truncated_survival(mu_j, sigma_j, a_j, candidates),
            np.where(censored[:, None], 1.0, y[:, None] > candidates),
        )
        over = np.where(censored[:, None], 1.0 - short, y[:, None] < candidates)
        own = state.own.copy()
        residual = np.where(censored, mean_above(mu, sigma, a), y) - mu  # the E-step's d - mu when censored
        own.pool = np.concatenate([own.pool[:, 1:], residual.astype(np.float32)[:, None]], axis=1)
        own.alpha = own.alpha + s.aci_step * (self.alpha - short[:, 1])
        own.offset = np.clip(own.offset + s.sgd_step * (cost.c_under * short[:, 2] - cost.c_over * over[:, 2]), -1, 1)
        own.scores = s.forgetting * own.scores + relative
        own.streak = np.where(censored, own.streak + 1, 0)
        controller, _ = self.controller.step(pending, *own_feedback(y, censored, pending.action), context)
        return self._decide(controller, own), None

    def _decide(self, controller: ControllerState, own: np.recarray) -> PortfolioState:
        """The candidates' orders after the controller's decision, the choice with its switching price, and the
        action deployed."""
        mu = controller.mu
        pool = own.pool.astype(np.float64)
        own.orders = np.stack(
            [self.controller.unclipped(controller), mu + conformal_quantile(pool, own.alpha), mu + own.offset], axis=1
        )
        rows = np.arange(len(own))
        chosen = np.asarray(own.chosen)
        leader = np.argmin(own.scores, axis=1)
        lead = own.scores[rows, chosen] - own.scores[rows, leader]
        own.chosen = chosen = np.where(lead > self.settings.price, leader, chosen)
        logits = -(own.scores - own.scores[rows, leader][:, None]) / self.settings.price
        weights = np.exp(logits)
        own.weight = weights[rows, chosen] / weights.sum(axis=1)
        own.deployed = np.clip(own.orders[rows, chosen], 0.0, 1.0)
        return PortfolioState(controller, own)

    def unclipped(self, state: PortfolioState) -> np.ndarray:
        return np.array(state.own.orders[np.arange(len(state)), state.own.chosen])

    def rescale(
        self, state: PortfolioState, low: np.ndarray, high: np.ndarray, new_low: np.ndarray, new_high: np.ndarray
    ) -> PortfolioState:
        """The controller as :meth:`~picrl_core.controller.PicRLController.rescale` moves it; the orders move as levels,
        the residuals, the buffer and the scores (costs are linear in the unit) as spreads."""
        low, high = np.asarray(low, np.float64), np.asarray(high, np.float64)
        new_low, new_high = np.asarray(new_low, np.float64), np.asarray(new_high, np.float64)
        ratio = (high - low) / (new_high - new_low)
        shift = (low - new_low) / (new_high - new_low)
        stays = (low == new_low) & (high == new_high)
        own = state.own.copy()
        own.orders = state.own.orders * ratio[:, None] + shift[:, None]
        own.deployed = np.clip(state.own.deployed * ratio + shift, 0.0, 1.0)
        own.pool = (state.own.pool * ratio[:, None]).astype(np.float32)
        own.offset = state.own.offset * ratio
        own.scores = state.own.scores * ratio[:, None]
        own[stays] = state.own[stays]
        return PortfolioState(self.controller.rescale(state.controller, low, high, new_low, new_high), own)
