"""The one vectorised PIC-RL controller (Algorithm 1, Phase 3 "Predict / Plan / Act / Fast update").

``step(state, y, c)`` takes a batch of per-service states and their censored feedback
``(y_t, c_t) = (min(d_t, a_t), 1[d_t > a_t])`` for the action in force, and returns the new states
(holding the decision for the next tick) plus the transitions for the replay buffer. It never sees
the demand ``d_t``. The simulator, the embedded runner and the stream workers all call it, so the
same inputs and policy give the same decisions everywhere.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from functools import cache

import numpy as np
import torch

from picrl_core.batching import in_fixed_chunks
from picrl_core.calibrator import escape_step, feedback, reactive_step, release_escape, track_temperature
from picrl_core.censored_estimator import ROWS_PER_THREAD, CensoredDemandEstimate, estimate_censored_demand
from picrl_core.config import EstimatorConfig, PicRLConfig
from picrl_core.controller_state import ControllerState, rescale_state
from picrl_core.features import state_features
from picrl_core.idle import busy_responsibility
from picrl_core.mills import mean_above
from picrl_core.noise import counter_normal
from picrl_core.orders.choice import order_rule
from picrl_core.policy import N_OUTPUTS, PolicyNetwork, gaussian_log_prob, risk_centre, squash
from picrl_core.predictor.kinds import kind_of
from picrl_core.predictor.model import Forecast, GaussianLSTM
from picrl_core.repeats import (
    REPEAT_TOLERANCE,
    gaussian_responsibility,
    inside_range,
    mean_above_or_repeat,
    repeats_in,
    track_repeats,
)
from picrl_core.reward import expected_cost, step_reward


@dataclass
class Transition:
    """``(s_t, action params, r_t, s_{t+1})`` per service, as stored in the replay buffer."""

    features: np.ndarray  # (B, F) float32 s_t
    pre: np.ndarray  # (B, 2) float32 pre-squash (eta, k) sample
    log_prob: np.ndarray  # (B,) float32 behaviour log-probability
    reward: np.ndarray  # (B,) float64 surrogate when censored, true cost otherwise
    next_features: np.ndarray  # (B, F) float32 s_{t+1}
    censored: np.ndarray  # (B,) bool
    action: np.ndarray  # (B,) float64 a_t


@dataclass(frozen=True)
class Feedback:
    """What one tick's feedback ``(y_t, c_t)`` says of the pending actions (:meth:`PicRLController.step`'s observe
    stage). Rows whose demand nobody saw (``unseen``) are neither short nor over, and their streaks hold."""

    y: np.ndarray  # (B,) float64 y_t = min(d_t, a_t)
    censored: np.ndarray  # (B,) bool c_t as reported
    unseen: np.ndarray | None  # (B,) bool rows whose demand went unobserved; None when there are none
    shortage: np.ndarray  # (B,) bool d_t > a_t
    over: np.ndarray  # (B,) bool d_t < a_t
    seen: np.ndarray  # (B,) bool the demand was seen: uncensored and not short
    censor_streak: np.ndarray  # (B,) int64 consecutive censored ticks, this one included
    over_streak: np.ndarray  # (B,) int64 consecutive over-provisioned ticks, this one included
    reward: np.ndarray  # (B,) float64 r_t (Eq. 9-10)


@dataclass(frozen=True)
class FastVariables:
    """The per-service variables Phase 3's fast loop carries from tick to tick (the calibrate stage)."""

    margin: np.ndarray  # (B,) float64 m
    bias: np.ndarray  # (B,) float64 b
    temperature: np.ndarray  # (B,) float64 the online scale of sigma
    escape: np.ndarray  # (B,) float64 the censoring-streak escape e
    repeat_share: np.ndarray  # (B,) float64 running share of seen ticks that repeated the last seen demand
    last_seen: np.ndarray  # (B,) float64 the last demand seen uncensored


@dataclass(frozen=True)
class Window:
    """The last ``W`` ticks of PIC inputs each decision reads, oldest first."""

    observations: np.ndarray  # (B, W) float32 y (a shortage may hold its E-step, impute_shortage)
    censored: np.ndarray  # (B, W) bool c
    context: np.ndarray  # (B, W, C) float32


@dataclass(frozen=True)
class DecisionInputs:
    """What :meth:`PicRLController._decide` reads: the window and the carried state after a feedback, or a cold
    start's (``memory`` None, ``start_margin`` in units of the first sigma)."""

    keys: np.ndarray  # (B,) uint64 service keys
    tick: np.ndarray  # (B,) int64 the tick the decision is for
    window: Window
    fast: FastVariables
    censor_streak: np.ndarray  # (B,) int64
    over_streak: np.ndarray  # (B,) int64
    memory: np.ndarray | None = None  # the predictor's memory before the window's newest row; None: a cold start
    estimate_start: tuple[np.ndarray, np.ndarray] | None = None  # the last tick's censored-demand estimate
    start_margin: float = 0.0
    seen: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None  # (e_t, seen_t, y_t): the escape to release


class PicRLController:
    """Predict -> plan -> act, and the fast calibrator update, for any number of services at once."""

    def __init__(
        self,
        predictor: GaussianLSTM,
        policy: PolicyNetwork,
        config: PicRLConfig,
        *,
        explore: bool | None = None,
        seed: int | None = None,
        chunk: int | None = None,
    ) -> None:
        self.predictor = predictor.eval()
        self.set_policy(policy)
        self.config = config
        self.explore = config.online.explore if explore is None else explore
        self.seed = config.seed if seed is None else seed
        self.chunk = config.online.inference_chunk if chunk is None else chunk  # rows per forward pass
        if self.chunk < 1:
            raise ValueError(f"inference chunk must be >= 1; got {self.chunk}")
        self.window = config.predictor.window
        self.context_channels = config.predictor.context_channels
        self.forecaster = kind_of(config.predictor).forecaster(self.predictor, self.chunk)  # Phase 1, as its kind runs
        # each service's online temperature of sigma; ablation A1 (no uncertainty) has one constant sigma
        self.scales_sigma = config.calibrator.online_scale and config.ablation.use_uncertainty
        self.risk_centre = risk_centre(config)  # the k range's centre (an inverse normal cdf: once, not per tick)
        self.order_rule = order_rule(config)  # the Gaussian order, the repeat mixture or the hurdle: once, not per tick

    def set_policy(self, policy: PolicyNetwork) -> None:
        """Hot-swap the acting policy (slow-loop update or a new published version)."""
        self.policy = policy.eval()
        # its layers' parameters, read once: in-place updates of them (the slow loop's EMA) still act at once
        self._layers = _plain_mlp(policy.body) if type(policy) is PolicyNetwork else None
        self._std: tuple[tuple[int, int], np.ndarray, np.ndarray] | None = None  # _policy_std's, with what it read

    def initial_state(
        self,
        keys: np.ndarray,
        history: np.ndarray,
        history_context: np.ndarray | None = None,
        start_tick: int | np.ndarray = 0,
    ) -> ControllerState:
        """Cold start from uncensored history ``(B, H)`` (H >= 1) and its context ``(B, H, C)``.

        The window takes the last W history values; a shorter history is padded on the left by
        repeating its first value. Bias and streaks start at zero (Algorithm 1, line 17); the margin at
        ``calibrator.initial_margin`` times the first forecast's sigma and the temperature at
        ``calibrator.initial_scale`` (the levels of the model's validation run, :func:`~picrl_core.pipeline.
        validation_run`) with ``calibrator.start_from_validation``; else at 0 and 1, the paper's start.
        """
        history = np.asarray(history, dtype=np.float32)
        if history.ndim != 2 or history.shape[1] < 1:
            raise ValueError(f"history must have shape (services, steps >= 1); got {history.shape}")
        n = history.shape[0]
        context = self._check_context(history_context, history.shape, "history_context")
        observations, context = _last_window(history, context, self.window)
        zeros = np.zeros(n)
        calibrator = self.config.calibrator
        warm = calibrator.start_from_validation
        scale = calibrator.initial_scale if warm and self.scales_sigma else 1.0
        fast = FastVariables(
            margin=zeros,
            bias=zeros.copy(),
            temperature=np.full(n, scale),
            escape=zeros.copy(),
            repeat_share=repeats_in(history[:, -self.window :], self.order_rule.acts_on_repeat),
            last_seen=observations[:, -1].astype(np.float64),
        )  # the padding is no repeat
        return self._decide(
            DecisionInputs(
                keys=np.asarray(keys, dtype=np.uint64).reshape(n),
                tick=np.broadcast_to(np.asarray(start_tick, dtype=np.int64), (n,)).copy(),
                window=Window(observations, np.zeros_like(observations, dtype=bool), context),
                fast=fast,
                censor_streak=np.zeros(n, np.int64),
                over_streak=np.zeros(n, np.int64),
                start_margin=calibrator.initial_margin if warm else 0.0,
            )
        )

    def step(
        self,
        state: ControllerState,
        y: np.ndarray,
        censored: np.ndarray,
        context: np.ndarray | None = None,
        missing: np.ndarray | None = None,
    ) -> tuple[ControllerState, Transition]:
        """Consume feedback ``(y_t, c_t)`` (and this tick's context ``(B, C)``) for the pending
        actions; return the states with the decisions for the next tick, and the transitions. Four stages:
        observe (:meth:`_observe`), calibrate (:meth:`_calibrate`), window and E-step (:meth:`_window`), decide
        (:meth:`_decide`).

        ``missing`` (``(B,)`` bool): rows whose demand went unobserved this tick (a soft resource of a pod that a
        hard shortage killed, :func:`picrl_core.resources.unobserved`). Nothing is learnt from them: the
        calibrator, the streaks and the temperature hold, the reward is the forecast's expected cost
        (:func:`~picrl_core.reward.expected_cost`), and the window keeps the pending forecast ``mu`` as an
        uncensored point, the E-step of a missing value, instead of ``(y, c)``."""
        obs = self._observe(state, y, censored, missing)
        fast = self._calibrate(state, obs)
        window = self._window(state, obs, context)
        new = self._decide(
            DecisionInputs(
                keys=state.keys,
                tick=state.tick + 1,
                window=window,
                fast=fast,
                censor_streak=obs.censor_streak,
                over_streak=obs.over_streak,
                memory=state.memory,
                estimate_start=(state.est_mean, state.est_std) if self.config.estimator.warm_start else None,
                seen=(state.escape, obs.seen if obs.unseen is None else obs.seen & ~obs.unseen, obs.y),
            )
        )
        transition = Transition(
            features=state.features,
            pre=state.pre,
            log_prob=state.log_prob,
            reward=obs.reward,
            next_features=new.features,
            censored=obs.censored,
            action=state.action,
        )
        return new, transition

    def _observe(
        self, state: ControllerState, y: np.ndarray, censored: np.ndarray, missing: np.ndarray | None
    ) -> Feedback:
        """Observe: whether each pending action was short or over, the streaks, and the reward of Eq. (9)-(10) (the
        forecast's expected cost where the demand went unobserved)."""
        y = np.asarray(y, dtype=np.float64).reshape(len(state))
        censored = np.asarray(censored, dtype=bool).reshape(len(state))
        unseen = None if missing is None else np.asarray(missing, dtype=bool).reshape(len(state))
        unseen = unseen if unseen is not None and unseen.any() else None
        a = state.action
        shortage, over = feedback(y, a, censored)
        seen_censored = censored
        if unseen is not None:  # no feedback from a demand nobody saw (at a capacity of 0, y = 0 would read as short)
            shortage, over, seen_censored = shortage & ~unseen, over & ~unseen, censored & ~unseen
        censor_streak = np.where(seen_censored, state.censor_streak + 1, 0)
        over_streak = np.where(over, state.over_streak + 1, 0)
        if unseen is not None:  # the streaks hold through it
            censor_streak = np.where(unseen, state.censor_streak, censor_streak)
            over_streak = np.where(unseen, state.over_streak, over_streak)
        cfg = self.config
        reward = step_reward(a, y, seen_censored, state.mu, state.sigma, censor_streak, cfg.cost, cfg.reward)
        if unseen is not None:
            reward[unseen] = -expected_cost(a[unseen], state.mu[unseen], state.sigma[unseen], cfg.cost)
        return Feedback(
            y=y,
            censored=censored,
            unseen=unseen,
            shortage=shortage,
            over=over,
            seen=~shortage & ~censored,
            censor_streak=censor_streak,
            over_streak=over_streak,
            reward=reward,
        )

    def _calibrate(self, state: ControllerState, obs: Feedback) -> FastVariables:
        """Calibrate: the fast loop's step on the feedback: margin and bias (Eq. 12; under the hurdle's order not
        after an order at the floor's atom, :mod:`picrl_core.idle`), the temperature of sigma, the censoring-streak
        escape and the repeat share with the last demand seen. Rows whose demand went unobserved keep their
        temperature and escape."""
        cfg = self.config
        y, censored, unseen, shortage, a = obs.y, obs.censored, obs.unseen, obs.shortage, state.action
        stepped_short, stepped_over = shortage, obs.over
        idle = self.order_rule.pending_idle(state.observations, state.censored)  # the hurdle's idle mass, else None
        if idle is not None:  # an order at the floor was no quantile of the margin
            busy_order = idle < self.order_rule.fractile
            stepped_short, stepped_over = shortage & busy_order, obs.over & busy_order
        margin, bias = reactive_step(state.margin, state.bias, state.eta, stepped_short, stepped_over, state.sigma, cfg)
        observed = ~censored if unseen is None else ~censored & ~unseen
        after_seen, missed = state.censor_streak == 0, None
        if self.order_rule.acts_on_repeat:  # a shortage at or above v did not repeat; a clipped v is no value seen
            missed = shortage & (a >= state.last_seen - REPEAT_TOLERANCE)
            after_seen = after_seen & inside_range(state.last_seen)
        gaussian_share = (
            gaussian_responsibility(
                y, censored, state.mu, state.sigma, a, state.repeat_share, state.last_seen, after_seen
            )
            if cfg.calibrator.scale_skips_repeats
            else None
        )
        if idle is not None:  # a tick the floor's atom explains leaves the temperature alone
            busy = busy_responsibility(y, observed, idle)
            gaussian_share = busy if gaussian_share is None else gaussian_share * busy
        temperature = (
            track_temperature(state.temperature, y, state.mu, state.sigma, censored, cfg.calibrator, gaussian_share)
            if self.scales_sigma
            else state.temperature
        )
        repeat_share, last_seen = track_repeats(
            state.repeat_share, state.last_seen, y, observed, after_seen, cfg.estimator.repeat_rate, missed
        )
        escape = (
            escape_step(state.escape, shortage, obs.seen, obs.censor_streak, state.sigma, cfg.calibrator)
            if cfg.calibrator.escape
            else state.escape
        )
        if unseen is not None:  # the temperature and the escape hold
            temperature = np.where(unseen, state.temperature, temperature)
            escape = np.where(unseen, state.escape, escape)
        return FastVariables(
            margin=margin,
            bias=bias,
            temperature=temperature,
            escape=escape,
            repeat_share=repeat_share,
            last_seen=last_seen,
        )

    def _window(self, state: ControllerState, obs: Feedback, context: np.ndarray | None) -> Window:
        """Window and E-step: the window moves one tick on. Its new point is ``(y_t, c_t)``, a shortage's Tobit
        E-step with ``estimator.impute_window`` (:func:`impute_shortage`), or the pending forecast ``mu`` where the
        demand went unobserved (the E-step of a missing value); this tick's context row joins the context."""
        window_y, window_c = (
            impute_shortage(obs.y, obs.censored, obs.shortage, state, self.config.estimator)
            if self.config.estimator.impute_window
            else (obs.y, obs.censored)
        )
        if obs.unseen is not None:
            window_y, window_c = np.where(obs.unseen, state.mu, window_y), window_c & ~obs.unseen
        row_context = self._check_context(
            None if context is None else np.asarray(context)[:, None, :], (len(state), 1), "context"
        )
        return Window(
            observations=_shift(state.observations, window_y.astype(np.float32)),
            censored=_shift(state.censored, window_c),
            context=_shift(state.context, row_context[:, 0, :]),
        )

    def _check_context(self, context: np.ndarray | None, shape: tuple[int, int], name: str) -> np.ndarray:
        """Context as ``(B, H, C)`` float32; an empty ``C = 0`` array when the model has no context."""
        channels = self.context_channels
        if context is None:
            if channels:
                raise ValueError(f"{name} is required: the predictor was trained with {channels} context channel(s)")
            return np.zeros((*shape, 0), dtype=np.float32)
        context = np.asarray(context, dtype=np.float32)
        if context.shape != (*shape, channels):
            raise ValueError(f"{name} must have shape {(*shape, channels)}; got {context.shape}")
        return context

    def _decide(self, inputs: DecisionInputs) -> ControllerState:
        """Decide: predict (mu, sigma), build s_t, plan (eta, k) and act: a = clip(mu + k*sigma + m + b + e, 0, 1),
        with ``e`` the censoring-streak escape (0 unless ``calibrator.escape``; :func:`~picrl_core.calibrator.
        escape_step`). A cold start adds ``start_margin`` sigma to the margin (:meth:`initial_state`); ``seen``'s
        escape :func:`~picrl_core.calibrator.release_escape` releases at the new forecast.

        The censored-demand estimator starts from ``estimate_start`` (the previous tick's estimate, whose
        window differs by one point) where given, and from the window's sample moments otherwise. The
        predictor advances ``memory`` by the window's newest row, or reads the whole window when there is none
        (a cold start)."""
        keys, tick, fast = inputs.keys, inputs.tick, inputs.fast
        observations, censored, context = inputs.window.observations, inputs.window.censored, inputs.window.context
        censor_streak, over_streak = inputs.censor_streak, inputs.over_streak
        margin, escape = fast.margin, fast.escape
        cfg = self.config
        recent = slice(-cfg.estimator.window, None)

        def estimate() -> CensoredDemandEstimate:
            return estimate_censored_demand(
                observations[:, recent].astype(np.float64),
                censored[:, recent],
                censor_streak,
                cfg.estimator,
                cfg.reward,
                start=inputs.estimate_start,
                threads=cfg.online.estimator_threads,
            )

        # With estimator threads and enough services, the estimator (it does not read the forecast) runs beside
        # the predictor.
        parallel = cfg.online.estimator_threads > 1 and len(keys) >= ROWS_PER_THREAD
        running = _side_thread().submit(estimate) if parallel else None
        mu, sigma, memory = self._predict(observations, censored, context, inputs.memory)
        censored_demand = estimate() if running is None else running.result()
        if not cfg.ablation.use_uncertainty:  # A1: no state-dependent uncertainty, the best constant std instead
            sigma = np.full_like(sigma, float(self.predictor.head.residual_rms))
        if self.scales_sigma:  # the service's own temperature (track_temperature)
            sigma = sigma * fast.temperature
        if inputs.start_margin:
            margin = margin + inputs.start_margin * sigma
        if inputs.seen is not None and cfg.calibrator.escape:
            escape = release_escape(escape, *inputs.seen, mu, cfg.calibrator)
        features = state_features(
            margin=margin,
            bias=fast.bias,
            observations=observations[:, recent],
            censored=censored[:, recent],
            censor_streak=censor_streak,
            over_streak=over_streak,
            tick=tick,
            mu=mu,
            sigma=sigma,
            estimate=censored_demand,
            n_max=cfg.reward.n_max,
            horizon=cfg.policy.horizon,
        )
        pre, log_prob = self._plan(features, keys, tick)
        eta, k = squash(pre, cfg.policy, self.risk_centre)
        # the method: np.clip without its wrapper
        action = self._order(
            mu, k, sigma, margin, fast.bias, escape, fast.repeat_share, fast.last_seen, censor_streak, inputs.window
        ).clip(0.0, 1.0)
        return ControllerState(
            keys=keys,
            tick=tick,
            observations=observations,
            censored=censored,
            context=context,
            margin=margin,
            bias=fast.bias,
            censor_streak=censor_streak,
            over_streak=over_streak,
            action=action,
            mu=mu,
            sigma=sigma,
            eta=eta,
            k=k,
            pre=pre,
            log_prob=log_prob,
            features=features,
            est_mean=censored_demand.mean,
            est_std=censored_demand.std,
            memory=memory,
            temperature=fast.temperature,
            escape=escape,
            repeat_share=fast.repeat_share,
            last_seen=fast.last_seen,
        )

    def rescale(
        self, state: ControllerState, low: np.ndarray, high: np.ndarray, new_low: np.ndarray, new_high: np.ndarray
    ) -> ControllerState:
        """``state`` carried to the ranges ``[new_low, new_high]`` (:func:`~picrl_core.controller_state.rescale_state`),
        with the incremental predictor's memory of each service whose range moved read again from its rescaled window
        (a cold start, as :meth:`_predict` makes without memory): no affine map carries an LSTM's hidden state to
        other units, and a memory of the old ones held the forecast near the old range's top for some 20 ticks after a
        range grown twofold (``benchmarks/results/design/range-move-memory``)."""
        moved = np.flatnonzero((np.asarray(low) != np.asarray(new_low)) | (np.asarray(high) != np.asarray(new_high)))
        carried = rescale_state(state, low, high, new_low, new_high)
        if not moved.size or carried.memory.shape[1] == 0:  # nothing moved, or the windowed predictor (no memory)
            return carried
        memory = carried.memory.copy()
        window = (carried.observations[moved], carried.censored[moved], carried.context[moved])
        memory[moved] = self.forecaster.start(*window)[2]
        return replace(carried, memory=memory)

    def unclipped(self, state: ControllerState) -> np.ndarray:
        """The action of the decisions in ``state`` before its clip to ``[0, 1]`` (a stream worker reads it to say
        whether the range cut it)."""
        return self._order(
            state.mu,
            state.k,
            state.sigma,
            state.margin,
            state.bias,
            state.escape,
            state.repeat_share,
            state.last_seen,
            state.censor_streak,
            Window(state.observations, state.censored, state.context),
        )

    def _order(
        self,
        mu: np.ndarray,
        k: np.ndarray,
        sigma: np.ndarray,
        margin: np.ndarray,
        bias: np.ndarray,
        escape: np.ndarray,
        repeat_share: np.ndarray,
        last_seen: np.ndarray,
        censor_streak: np.ndarray,
        window: Window,
    ) -> np.ndarray:
        """Eq. (11) before its clip, :func:`unclipped_action`, turned into the order by the controller's rule
        (:attr:`order_rule`: the paper's Gaussian order, the repeat mixture or the hurdle, :mod:`picrl_core.orders`)."""
        planned = unclipped_action(mu, k, sigma, margin, bias, escape, self.config.ablation.use_k_sigma)
        return self.order_rule.order(
            planned, sigma, repeat_share, last_seen, censor_streak == 0, window.observations, window.censored
        )

    def _predict(
        self, observations: np.ndarray, censored: np.ndarray, context: np.ndarray, memory: np.ndarray | None
    ) -> Forecast:
        """Phase 1's ``(mu, sigma)`` for the next tick and the predictor's new memory: from a cold start when there
        is no memory yet, else one tick on from it."""
        if memory is None:
            return self.forecaster.start(observations, censored, context)
        return self.forecaster.advance(observations, censored, context, memory)

    def _plan(self, features: np.ndarray, keys: np.ndarray, tick: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Policy output in pre-squash space: the Gaussian mean, plus counter-based noise when exploring."""
        if features.shape[0] == 0:
            return np.zeros((0, N_OUTPUTS), np.float32), np.zeros(0, np.float32)
        noise = counter_normal(self.seed, keys, tick, N_OUTPUTS).astype(np.float32) if self.explore else None
        if self._layers is None:  # any other policy: through its modules

            def forward(rows: np.ndarray) -> tuple[np.ndarray, ...]:
                mean, std = self.policy(torch.from_numpy(rows))
                return mean.numpy(), std.numpy()

            with torch.inference_mode():
                mean_t, std_t = (torch.from_numpy(out) for out in in_fixed_chunks(forward, features, self.chunk))
                pre_t = mean_t if noise is None else mean_t + std_t * torch.from_numpy(noise)
                return pre_t.numpy().copy(), gaussian_log_prob(mean_t, std_t, pre_t).numpy().copy()
        # PolicyNetwork's std is one (2,) vector for every row: its log is taken once, so each row's log density is
        # plain arithmetic (gaussian_log_prob's, in float32), the same in any batch.
        std, log_std = self._policy_std()
        mean = self._plain_mean(self._layers, features)
        pre = mean if noise is None else mean + std * noise
        z = (pre - mean) / std
        log_prob = (np.float32(-0.5) * z * z - log_std - _HALF_LOG_2PI).sum(axis=1, dtype=np.float32)
        return pre, log_prob

    def _plain_mean(
        self, layers: list[tuple[torch.Tensor, torch.Tensor | None, bool]], features: np.ndarray
    ) -> np.ndarray:
        """The plain MLP's output ``(B, 2)``: nn.Linear's own function, without the per-module call overhead, on
        exactly ``chunk`` rows per product (as :func:`~picrl_core.batching.in_fixed_chunks`; a short last chunk
        leaves the rows after its own as they are, which a product's other rows never read), and numpy's float32
        tanh in place on a chunk's own rows: ~10x faster than torch's here, within an ulp of it, and per element
        the same in any batch."""
        rows, chunk = features.shape[0], self.chunk
        mean = np.empty((rows, N_OUTPUTS), np.float32)
        x = np.zeros((chunk, features.shape[1]), np.float32)
        x_t = torch.from_numpy(x)
        with torch.inference_mode():
            for lo in range(0, rows, chunk):
                count = min(chunk, rows - lo)
                x[:count] = features[lo : lo + count]
                out = x_t
                for weight, bias, squashed in layers:
                    out = torch.nn.functional.linear(out, weight, bias)
                    if squashed:
                        own = out.numpy()[:count]
                        np.tanh(own, out=own)
                mean[lo : lo + count] = out.numpy()[:count]
        return mean

    def _policy_std(self) -> tuple[np.ndarray, np.ndarray]:
        """PolicyNetwork's std ``exp(clamp(log_std, -5, 1))`` and its log, float32 ``(2,)``: computed again only when
        ``log_std`` changed (its version counter moves with every in-place update, the slow loop's EMA too; its
        storage with a swapped ``.data``)."""
        log_std = self.policy.log_std
        read = (log_std._version, log_std.data_ptr())
        if self._std is None or self._std[0] != read:
            with torch.inference_mode():
                std_t = log_std.clamp(-5.0, 1.0).exp()
                self._std = (read, std_t.numpy(), std_t.log().numpy())
        return self._std[1], self._std[2]


_HALF_LOG_2PI = np.float32(0.5 * np.log(2.0 * np.pi))


@cache
def _side_thread() -> ThreadPoolExecutor:
    """The thread the censored-demand estimator runs in beside the predictor (``online.estimator_threads > 1``)."""
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix="picrl-estimate")


def _plain_mlp(body: torch.nn.Module) -> list[tuple[torch.Tensor, torch.Tensor | None, bool]] | None:
    """``(weight, bias, tanh after)`` per layer of a ``Sequential`` of ``Linear`` and ``Tanh`` layers, else None."""
    if not isinstance(body, torch.nn.Sequential):
        return None
    layers: list[tuple[torch.Tensor, torch.Tensor | None, bool]] = []
    for module in body:
        if isinstance(module, torch.nn.Linear):
            layers.append((module.weight, module.bias, False))
        elif isinstance(module, torch.nn.Tanh) and layers and not layers[-1][2]:
            layers[-1] = (layers[-1][0], layers[-1][1], True)
        else:
            return None
    return layers


def unclipped_action(
    mu: np.ndarray,
    k: np.ndarray,
    sigma: np.ndarray,
    margin: np.ndarray,
    bias: np.ndarray,
    escape: np.ndarray,
    use_k_sigma: bool = True,
) -> np.ndarray:
    """Eq. (11) before its clip to ``[0, 1]``: ``mu + k sigma + m + b + e`` (``k sigma`` dropped by ablation A4), the
    one sum the controller plans (:meth:`PicRLController.unclipped` is what it acts on)."""
    buffer = k * sigma if use_k_sigma else 0.0
    return mu + buffer + margin + bias + escape


def impute_shortage(
    y: np.ndarray, censored: np.ndarray, shortage: np.ndarray, pending: ControllerState, cfg: EstimatorConfig
) -> tuple[np.ndarray, np.ndarray]:
    """What the window keeps of a tick with ``estimator.impute_window``: a shortage (``d > a``, seen as ``y = a``)
    as its Tobit E-step ``E[d | d > a]`` under the forecast ``N(mu, sigma^2)`` its action was planned with, and
    uncensored (the E-step of data augmentation for censored time series, Park, Genton & Ghosh, Can. J. Stat.
    2007); every other tick as it came. With ``estimator.impute_repeat`` the forecast is the mixture of that
    Gaussian and a repeat of the last demand seen (:func:`~picrl_core.repeats.mean_above_or_repeat`). The reward,
    the calibrator and the temperature still read ``(y, c)``."""
    imputed = shortage & censored
    window_y = y.copy()
    rows = imputed.nonzero()[0]
    if rows.size:  # the E-step only where it is kept (elementwise, so a row's value does not depend on the others)
        mu, sigma, bound = pending.mu[rows], pending.sigma[rows], pending.action[rows]
        window_y[rows] = (
            mean_above_or_repeat(mu, sigma, bound, pending.repeat_share[rows], pending.last_seen[rows])
            if cfg.impute_repeat
            else mean_above(mu, sigma, bound)
        )
    return window_y, censored & ~imputed


def _shift(window: np.ndarray, newest: np.ndarray) -> np.ndarray:
    """Drop the oldest entry of each window row and append ``newest`` (axis 1)."""
    return np.concatenate([window[:, 1:], newest[:, None, ...]], axis=1)


def _last_window(history: np.ndarray, context: np.ndarray, window: int) -> tuple[np.ndarray, np.ndarray]:
    """The last ``window`` steps of history and context, left-padded by repeating the first step."""
    missing = window - history.shape[1]
    if missing > 0:
        history = np.concatenate([np.repeat(history[:, :1], missing, axis=1), history], axis=1)
        context = np.concatenate([np.repeat(context[:, :1], missing, axis=1), context], axis=1)
    return history[:, -window:].copy(), context[:, -window:].copy()
