"""Every hyper-parameter of PIC-RL in one typed config, one dataclass per phase.

Defaults follow the paper (``pic-rl.tex``) where it gives a value and are documented here where
it does not. Configs are frozen: derive variants with :func:`dataclasses.replace`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields, is_dataclass
from typing import Any


@dataclass(frozen=True)
class CostConfig:
    """Asymmetric linear cost, Eq. (1): ``l(a, d) = c_under (d-a)_+ + c_over (a-d)_+``."""

    c_under: float = 2.0  # price of one unit of shortage (paper: 2)
    c_over: float = 1.0  # price of one unit of idle capacity (paper: 1)


@dataclass(frozen=True)
class PredictorConfig:
    """Phase 1 (Sec. 3.1): Gaussian LSTM predictor trained by NLL, Eq. (3)."""

    window: int = 32  # length of the observation window fed to the LSTM
    hidden: int = 32  # LSTM hidden units
    layers: int = 1  # stacked LSTM layers
    context_channels: int = 0  # extra input channels (e.g. duty cycle for GenAI-Ctx)
    sigma_min: float = 1e-3  # floor on the predicted std (keeps the NLL finite)
    epochs: int = 40  # upper bound; early stopping usually ends sooner
    batch_size: int = 256
    lr: float = 2e-3
    patience: int = 5  # epochs without validation-NLL improvement before stopping
    censor_prob: float = 0.3  # share of training windows re-censored so the model sees PIC inputs
    max_train_windows: int = 20_000  # windows sampled per epoch (bounded epoch time on long traces)
    calibrate_sigma: bool = True  # temperature of sigma fitted on the validation split by NLL; paper: False
    # "windowed": the LSTM re-reads the last `window` steps from a zero state every tick (the paper's);
    # "incremental": it carries (h, c) per service and takes one cell step per tick (picrl_core.predictor.incremental)
    kind: str = "incremental"

    def __post_init__(self) -> None:
        if self.kind not in ("windowed", "incremental"):
            raise ValueError(f"predictor.kind must be 'windowed' or 'incremental'; got {self.kind!r}")


@dataclass(frozen=True)
class EstimatorConfig:
    """Censored-demand estimator: Tobit maximum likelihood over the recent window."""

    window: int = 32  # most recent (y, c) pairs used
    iterations: int = 25  # at most this many Newton iterations (a service stops once converged)
    sigma_floor: float = 1e-3  # lower bound on the estimated std
    warm_start: bool = True  # Newton starts from the previous tick's estimate (kept in the state row), not cold
    # the window keeps a shortage tick as its Tobit E-step E[d | d > a] under that tick's forecast, uncensored, instead
    # of the bound a with its flag (controller.impute_shortage). The default's censoring hedge, in place of Eq. 9's
    # pessimism (reward.use_pessimism); paper: False
    impute_window: bool = True
    # with impute_window, the E-step's forecast is a mixture: the last demand seen, repeated with each service's
    # running share p of seen ticks that repeated the one before, or N(mu, sigma^2) (picrl_core.repeats). A series
    # that never repeats (p = 0) gets the Gaussian E-step exactly; paper: False
    impute_repeat: bool = True
    repeat_rate: float = 1 / 32  # step of p's running share: one estimator window
    # the action is the critical-fractile quantile of that same mixture forecast (picrl_core.repeats.repeat_quantile):
    # after a seen tick the last demand seen is an atom of mass p, so with p large enough the action sits on it; p then
    # also counts a shortage at an action at or above the last seen demand as no repeat, and leaves out repeats at the
    # range's bounds (values the scaling clipped); paper: False
    act_on_repeat: bool = True
    # a point mass at the range's floor (a hurdle) in that forecast (picrl_core.idle): its mass pi is the window's
    # share of pairs that start in the last tick's state (idle: seen at 0, or busy) and move to idle; the action is the
    # hurdle mixture's critical-fractile quantile (0 where pi >= tau), a tick seen at the floor leaves the online
    # temperature alone, and an order at the floor takes no margin step. A service that never idles (pi = 0) keeps
    # its order; paper: False
    idle_hurdle: bool = True

    def __post_init__(self) -> None:
        if not 0.0 < self.repeat_rate <= 1.0:
            raise ValueError(f"estimator.repeat_rate must be in (0, 1]; got {self.repeat_rate}")


@dataclass(frozen=True)
class RewardConfig:
    """Pessimistic surrogate reward, Eq. (9)-(10): ``Psi(n) = 1 + beta * min(n, N_max)``."""

    beta: float = 0.5  # growth of pessimism per consecutive censored step
    n_max: int = 10  # cap on the consecutive-censoring count inside Psi
    use_censored_reward: bool = True  # ablation A2 switches this off (censored steps get the naive cost)
    # Psi of Eq. 9 (the paper's censoring hedge); off by default (Psi = 1), where the window's E-step
    # (estimator.impute_window) hedges instead; ablation A3 switches off whichever of the two is on. Paper: True
    use_pessimism: bool = False


@dataclass(frozen=True)
class CalibratorConfig:
    """Phase 3 reactive calibrator, Eq. (12) / Algorithm 1 fast update (see ``calibrator.over_weights``)."""

    rule: str = "pinball"  # "pinball": both step on the cost's subgradient; "paper": Eq. (12) as printed
    margin_in_sigma: bool = True  # the margin's step is delta_m * sigma_t (standardized units); paper: False
    # margin step (fast variable), in units of sigma_t when margin_in_sigma; paper: 0.004
    delta_m: float = 0.025
    delta_b: float = 0.0005  # bias step (slow drift-tracking variable)
    gamma: float = 0.5  # rule "paper" only: bias decrease ratio on over-provisioned steps
    margin_limit: float = 0.5  # |m| is clipped to this bound
    bias_limit: float = 0.5  # |b| is clipped to this bound
    # per-service temperature of sigma learned online from the feedback (calibrator.track_temperature): an EM step
    # of the Tobit likelihood, E[z^2] for an uncensored residual and E[z^2 | z > z_c] for a censored one
    online_scale: bool = True  # paper: False
    scale_rate: float = 1.0 / 32  # EMA weight of one tick in the temperature's second moment
    scale_min: float = 1.0 / 64  # the temperature's range
    scale_max: float = 8.0
    # the temperature is the scale of the repeat mixture's Gaussian part (picrl_core.repeats), so its EM step weighs
    # each tick by the Gaussian's posterior responsibility: a seen tick that repeated the last seen demand belongs
    # to the mixture's atom and leaves T where it is; a shortage counts 1 - w, w the repeat's posterior given d > a.
    # Paper: False (no online temperature)
    scale_skips_repeats: bool = True
    select_scale_rate: bool = True  # pick scale_rate among pipeline.SCALE_RATES on the validation split
    # A new service starts its margin at initial_margin sigma_0 and its temperature at initial_scale: the levels
    # the model's own closed-loop run on the validation split settled at (pipeline.validation_run), not at 0 and 1
    # (Algorithm 1, line 17); training sets the two levels; paper: False
    start_from_validation: bool = True
    initial_margin: float = 0.0  # in units of sigma_0, the service's first forecast std (after its temperature)
    initial_scale: float = 1.0  # the temperature a new service starts at (online_scale)
    # the censoring-streak escape (calibrator.escape_step): from the second shortage in a row the action rises by a few
    # margin steps, then each step escape_growth times the last (an exponential search), and once the demand is seen
    # it is released by escape_release; paper: False
    escape: bool = True
    escape_limit: float = 1.0  # the escape's cap, in scaled units (1: the whole range)
    # the escape's first step, in margin steps (delta_m sigma_t); it grows by escape_growth from there
    escape_start: float = 4.0
    # the escape's growth: each further shortage of a streak adds escape_growth times the last step (2: doubling)
    # and what it does once the demand is seen (calibrator.release_escape): "halve" it; "hold": halve it, but not
    # below what keeps the action's centre at that demand until the forecast reaches it; "handover": only that
    escape_growth: float = 4.0
    escape_release: str = "handover"

    def __post_init__(self) -> None:
        if self.rule not in ("pinball", "paper"):
            raise ValueError(f"calibrator.rule must be 'pinball' or 'paper'; got {self.rule!r}")
        if not (0.0 < self.scale_rate <= 1.0 and 0.0 < self.scale_min <= 1.0 <= self.scale_max):
            raise ValueError(
                "calibrator.scale_rate must be in (0, 1] and scale_min <= 1 <= scale_max (both > 0); "
                f"got {self.scale_rate}, [{self.scale_min}, {self.scale_max}]"
            )
        if not self.escape_limit > 0.0:
            raise ValueError(f"calibrator.escape_limit must be > 0; got {self.escape_limit}")
        if not self.escape_growth >= 1.0:
            raise ValueError(f"calibrator.escape_growth must be >= 1; got {self.escape_growth}")
        if self.escape_release not in ("halve", "hold", "handover"):
            raise ValueError(
                f"calibrator.escape_release must be 'halve', 'hold' or 'handover'; got {self.escape_release!r}"
            )
        if not self.escape_start > 0.0:
            raise ValueError(f"calibrator.escape_start must be > 0; got {self.escape_start}")
        if not self.scale_min <= self.initial_scale <= self.scale_max:
            raise ValueError(f"calibrator.initial_scale must lie in [scale_min, scale_max]; got {self.initial_scale}")


@dataclass(frozen=True)
class PolicyConfig:
    """Policy and value networks (Sec. 3.2.1); outputs eta in [0.5, 3] and k in z* + [-1, 1] (paper: [0, 2])."""

    hidden: int = 64
    eta_low: float = 0.5
    eta_high: float = 3.0
    k_low: float = -1.0  # k's range is centre + [k_low, k_high]; paper: [0, 2] around 0
    k_high: float = 1.0
    k_around_fractile: bool = True  # centre = Phi^-1(c_under / (c_under + c_over)), the fractile; paper: False
    init_log_std: float = -1.0  # exploration std in pre-squash space at initialisation
    horizon: int = 512  # ticks that make "progress through the episode" reach 1


@dataclass(frozen=True)
class PretrainConfig:
    """Phase 2 (Sec. 3.2.4): actor-critic on simulator rollouts of the training split."""

    iterations: int = 150  # paper's Figure 4 shows 150 iterations
    chunk_len: int = 128  # steps per rollout chunk
    chunks: int = 64  # chunks rolled out in parallel per iteration (vectorised controller)
    # Each rollout episode of chunk_len steps is played over this many iterations (chunks * segments
    # episodes side by side, chunk_len / segments steps each iteration): the same transitions per
    # iteration in fewer, wider controller steps. 1: fresh chunks every iteration (the original scheme).
    segments: int = 8
    discount: float = 0.95
    gae_lambda: float = 0.9
    lr_actor: float = 1e-3
    lr_critic: float = 2e-3
    entropy_coef: float = 1e-3
    value_coef: float = 0.5
    grad_clip: float = 1.0


@dataclass(frozen=True)
class OnlineConfig:
    """Phase 3 slow loop: KL-regularised policy refinement from replay, with parameter EMA."""

    n_update: int = 64  # slow update every N_update ticks (each tick brings one transition per service)
    buffer_size: int = 4096  # bounded replay buffer (transitions)
    batch_size: int = 256
    gradient_steps: int = 4
    lr: float = 3e-4
    kl_coef: float = 1.0  # weight of KL(pi_new || pi_old); ablation A5 sets 0
    ema_decay: float = 0.9  # acting parameters = EMA of updated ones; ablation A6 sets 0
    explore: bool = False  # sample (eta, k) with counter-based noise (reproducible per service/tick); paper: True
    discount: float = 0.95
    # Rows per network forward pass when acting (picrl_core.batching): a service's decision is bit-identical
    # whatever batch it arrives in as long as this is fixed, so the stream and the simulator read it from the
    # same artifact. 128 suits batches of many services; 1 makes a single service ~6x (LSTM) to ~20x
    # (transformer predictors) cheaper per step. Phase 2 rollouts always use 128 (they are large batches).
    inference_chunk: int = 128
    # threads the censored-demand estimator splits a batch's services over (numpy releases the GIL; the same bits
    # for any count). Pays at 10,000+ services with torch itself on one thread (torch.set_num_threads(1)).
    estimator_threads: int = 1


@dataclass(frozen=True)
class AblationConfig:
    """Ablations of Table 3 as switches of the one implementation (A1, A4, A7; A2/A3/A5/A6 live in
    :class:`RewardConfig` and :class:`OnlineConfig`)."""

    use_uncertainty: bool = True  # A1: sigma_t is the constant that fits validation residuals best (no online scale)
    use_k_sigma: bool = True  # A4: the risk buffer k*sigma is dropped from the action
    pretrain: bool = True  # A7: Phase 2 is skipped (random policy initialisation)


@dataclass(frozen=True)
class PicRLConfig:
    """The whole method: one config per phase plus the global seed."""

    seed: int = 0
    cost: CostConfig = field(default_factory=CostConfig)
    predictor: PredictorConfig = field(default_factory=PredictorConfig)
    estimator: EstimatorConfig = field(default_factory=EstimatorConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    calibrator: CalibratorConfig = field(default_factory=CalibratorConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    pretrain: PretrainConfig = field(default_factory=PretrainConfig)
    online: OnlineConfig = field(default_factory=OnlineConfig)
    ablation: AblationConfig = field(default_factory=AblationConfig)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PicRLConfig:
        """Inverse of :meth:`to_dict`; unknown keys are an error (a typo must not pass silently)."""
        return _build(cls, data, "config")


def _build(cls: type, data: dict[str, Any], where: str) -> Any:
    known = {f.name: f for f in fields(cls)}
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise ValueError(f"{where}: unknown setting(s) {', '.join(unknown)}")
    kwargs: dict[str, Any] = {}
    for name, value in data.items():
        factory = known[name].default_factory
        default = factory() if callable(factory) else None
        if is_dataclass(default) and isinstance(value, dict):
            kwargs[name] = _build(type(default), value, f"{where}.{name}")
        else:
            kwargs[name] = value
    return cls(**kwargs)
