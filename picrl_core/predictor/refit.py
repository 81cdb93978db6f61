"""Phase 3's slow loop for the predictor: the Phase-1 LSTM refitted on the replay by the censored likelihood.

Phase 1 fits the LSTM on the fully observed training split (Eq. 3). Online, the controller sees
``(y_t, c_t) = (min(d_t, a_t), 1[d_t > a_t])`` only, so the refit maximises the Tobit likelihood of the PIC
observation model (Sec. 2) over each service's replayed ticks: with ``z = (y - mu) / sigma`` and
``(mu, sigma) = f_theta(x_{<t})`` the forecast the predictor makes from the inputs before the tick,

    NLL(theta) = sum_{c=0} [log sigma + z^2 / 2 + log sqrt(2 pi)] - sum_{c=1} log(1 - Phi(z)),

mean over the ticks that train (every ``refit.holdout_every``-th, by service key and tick, is held out). It is tied
to the predictor acting, ``theta_ref``, as the policy's slow update is (:mod:`picrl_core.online`):

    L(theta) = NLL(theta) + kl_coef * mean KL(N(mu_theta, sigma_theta^2) || N(mu_ref, sigma_ref^2)),
    theta_acting <- ema_decay * theta_acting + (1 - ema_decay) * theta       (after each update)

and the refitted acting predictor replaces the one in force only when its censored NLL on the held-out ticks is
below the one in force's by at least ``refit.threshold`` (:func:`improves`). The replay keeps, per service, the
newest ``refit.ticks`` ticks of what the predictor read (the window's newest row ``[y, c, ctx]``, a shortage as its
E-step when the window imputes it) and the feedback ``(y, c)``; an input row's target is the next tick's feedback.
Sequences of ``4 W`` ticks are read from a zero state, the first ``W - 1`` outputs warming up, as Phase 1 trains.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import numpy as np
import torch

from picrl_core.config import RefitConfig
from picrl_core.noise import held_out
from picrl_core.policy import gaussian_kl
from picrl_core.predictor.incremental import sequence_outputs
from picrl_core.predictor.model import GaussianLSTM

_SEQUENCE_WINDOWS = 4  # a training sequence is this many windows long (Phase 1's incremental sequences)
_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)


def censored_nll_terms(mu: torch.Tensor, sigma: torch.Tensor, y: torch.Tensor, censored: torch.Tensor) -> torch.Tensor:
    """Each tick's negative Tobit log-likelihood: ``log sigma + z^2 / 2 + log sqrt(2 pi)`` where seen (``c = 0``),
    ``-log(1 - Phi(z))`` where censored, ``z = (y - mu) / sigma`` (``log(1 - Phi(z)) = log Phi(-z)``, torch's
    ``log_ndtr``: finite and differentiable far in both tails)."""
    z = (y - mu) / sigma
    seen = torch.log(sigma) + 0.5 * z * z + _HALF_LOG_2PI
    return torch.where(censored, -torch.special.log_ndtr(-z), seen)


def censored_nll(
    mu: torch.Tensor, sigma: torch.Tensor, y: torch.Tensor, censored: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """Mean of :func:`censored_nll_terms` over the ticks where ``mask`` holds."""
    terms = censored_nll_terms(mu, sigma, y, censored)
    return torch.where(mask, terms, torch.zeros_like(terms)).sum() / mask.sum().clamp(min=1)


def sequence_forecasts(model: GaussianLSTM, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(mu, sigma)`` ``(B, L - W + 1)`` after inputs ``x`` ``(B, L, 2 + C)``'s steps ``W - 1 .. L - 1``, as the
    model's kind reads them: the incremental LSTM as one stream from a zero state, the windowed one each step's
    last ``W`` rows."""
    window = model.cfg.window
    if model.cfg.kind == "incremental":
        mu, sigma = sequence_outputs(model, x)
        return mu[:, window - 1 :], sigma[:, window - 1 :]
    rows, length, channels = x.shape
    windows = x.unfold(1, window, 1).permute(0, 1, 3, 2).reshape(-1, window, channels)
    mu, sigma = model(windows)
    return mu.reshape(rows, length - window + 1), sigma.reshape(rows, length - window + 1)


@dataclass(frozen=True)
class ReplayRuns:
    """Sequences of replayed ticks: inputs ``(B, L, 2 + C)`` float32 and each input's target, the next tick's
    feedback ``y``, ``c`` and whether it is held out, ``(B, L)``."""

    inputs: torch.Tensor
    y: torch.Tensor
    censored: torch.Tensor
    held_out: torch.Tensor


class _Run:
    """One service's newest ``capacity`` contiguous ticks (doubled storage, shifted down when full)."""

    def __init__(self, capacity: int, channels: int) -> None:
        self.capacity = capacity
        self.inputs = np.zeros((2 * capacity, channels), np.float32)
        self.y = np.zeros(2 * capacity, np.float32)
        self.censored = np.zeros(2 * capacity, bool)
        self.held_out = np.zeros(2 * capacity, bool)
        self.start = self.end = 0
        self.last_tick = -2

    def __len__(self) -> int:
        return self.end - self.start

    def add(self, tick: int, inputs: np.ndarray, y: float, censored: bool, held: bool) -> None:
        if tick != self.last_tick + 1:  # a gap (or a restart): the run starts again
            self.start = self.end = 0
        if self.end == 2 * self.capacity:
            keep = slice(self.end - self.capacity + 1, self.end)
            for part in (self.inputs, self.y, self.censored, self.held_out):
                part[: self.capacity - 1] = part[keep]
            self.start, self.end = 0, self.capacity - 1
        self.start = max(self.start, self.end + 1 - self.capacity)
        at = self.end
        self.inputs[at], self.y[at], self.censored[at], self.held_out[at] = inputs, y, censored, held
        self.end += 1
        self.last_tick = tick

    def pairs(self, first: int, length: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Inputs ``first .. first + length - 1`` (from the run's start) and their targets, one tick later."""
        inputs = slice(self.start + first, self.start + first + length)
        targets = slice(inputs.start + 1, inputs.stop + 1)
        return self.inputs[inputs], self.y[targets], self.censored[targets], self.held_out[targets]


class PredictorReplay:
    """Per service, its newest ``cfg.ticks`` contiguous replayed ticks: the predictor's input row and the feedback."""

    def __init__(self, cfg: RefitConfig, channels: int) -> None:
        self.cfg, self.channels = cfg, channels
        self._runs: dict[int, _Run] = {}

    def add(self, keys: np.ndarray, ticks: np.ndarray, inputs: np.ndarray, y: np.ndarray, censored: np.ndarray) -> None:
        """Each row's tick: service ``keys`` (uint64), ``ticks``, the window row the predictor read next ``inputs``
        ``(B, 2 + C)`` and the tick's feedback ``(y, c)``."""
        held = held_out(keys, ticks, self.cfg.holdout_every)
        for row, key in enumerate(np.asarray(keys, np.uint64).tolist()):
            run = self._runs.get(key)
            if run is None:
                run = self._runs[key] = _Run(self.cfg.ticks, self.channels)
            run.add(int(ticks[row]), inputs[row], float(y[row]), bool(censored[row]), bool(held[row]))

    def rescale(
        self, keys: np.ndarray, low: np.ndarray, high: np.ndarray, new_low: np.ndarray, new_high: np.ndarray
    ) -> None:
        """Express the services' replayed ``y`` (feedback and input rows) in ``[new_low, new_high]`` instead of
        ``[low, high]`` (per service), as their state is when their range grows."""
        for row, key in enumerate(np.asarray(keys, np.uint64).tolist()):
            run = self._runs.get(key)
            if run is None or (low[row], high[row]) == (new_low[row], new_high[row]):
                continue
            scale, shift = (high[row] - low[row]) / (new_high[row] - new_low[row]), low[row] - new_low[row]
            for values in (run.y, run.inputs[:, 0]):
                values[:] = values * scale + shift / (new_high[row] - new_low[row])

    def draw(self, length: int, count: int, rng: np.random.Generator) -> ReplayRuns | None:
        """``count`` sequences of ``length`` inputs with their targets, uniform over every start in every service's
        run; None while no run holds ``length + 1`` ticks."""
        runs = [run for run in self._runs.values() if len(run) > length]
        if not runs:
            return None
        starts = np.array([len(run) - length for run in runs])
        picks = rng.integers(0, starts.sum(), size=count)
        owner = np.searchsorted(np.cumsum(starts), picks, side="right")
        offsets = picks - np.concatenate([[0], np.cumsum(starts)[:-1]])[owner]
        return _stacked([runs[o].pairs(int(s), length) for o, s in zip(owner, offsets)])

    def whole(self, least: int) -> list[ReplayRuns]:
        """Every service's whole run (those of more than ``least`` ticks), batched by length."""
        by_length: dict[int, list] = {}
        for run in self._runs.values():
            if len(run) - 1 > least:
                by_length.setdefault(len(run) - 1, []).append(run.pairs(0, len(run) - 1))
        return [_stacked(parts) for _, parts in sorted(by_length.items())]


def _stacked(parts: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]) -> ReplayRuns:
    inputs, y, censored, held = (np.stack(column) for column in zip(*parts))
    return ReplayRuns(torch.from_numpy(inputs), torch.from_numpy(y), torch.from_numpy(censored), torch.from_numpy(held))


def held_out_nll(model: GaussianLSTM, replay: PredictorReplay) -> float | None:
    """The censored NLL of ``model`` on the held-out ticks of every service's whole run (each read from a zero
    state, the first ``W - 1`` outputs warming up); None when there is none."""
    window = model.cfg.window
    total, count = 0.0, 0
    with torch.no_grad():
        for runs in replay.whole(window):
            mu, sigma = sequence_forecasts(model, runs.inputs)
            part = slice(window - 1, None)
            mask = runs.held_out[:, part]
            terms = censored_nll_terms(mu, sigma, runs.y[:, part], runs.censored[:, part])
            total += float(terms[mask].sum())
            count += int(mask.sum())
    return total / count if count else None


def improves(candidate: float | None, parent: float | None, threshold: float) -> bool:
    """The publish gate: a candidate replaces its parent when its held-out censored NLL is lower by at least
    ``threshold`` (nats per held-out tick)."""
    return candidate is not None and parent is not None and candidate <= parent - threshold


@dataclass(frozen=True)
class RefitStats:
    """One refit: the training loss's parts at its last step and how far the acting predictor moved."""

    nll: float
    kl: float
    kl_to_parent: float  # mean KL(acting_new || acting_old) on the last step's inputs


class PredictorRefit:
    """The predictor's slow learner: Adam on the censored NLL tied by KL to the acting predictor, then an EMA."""

    def __init__(self, predictor: GaussianLSTM, cfg: RefitConfig, seed: int) -> None:
        self.cfg = cfg
        self.learner = copy.deepcopy(predictor).train()
        self.acting = copy.deepcopy(predictor).eval()
        self._optimizer = torch.optim.Adam(self.learner.parameters(), lr=cfg.lr)
        self._rng = np.random.default_rng(seed + 2)
        self.updates = 0

    def update(self, replay: PredictorReplay) -> RefitStats | None:
        """``refit.gradient_steps`` steps on sequences drawn from ``replay``, then the EMA of the acting predictor
        (in place); None (nothing changes) while the replay holds no sequence."""
        cfg, window = self.cfg, self.acting.cfg.window
        length = _SEQUENCE_WINDOWS * window
        reference = copy.deepcopy(self.acting)
        nll = kl = torch.zeros(())
        runs = None
        for _ in range(cfg.gradient_steps):
            runs = replay.draw(length, cfg.sequences, self._rng)
            if runs is None:
                return None
            part = slice(window - 1, None)
            mu, sigma = sequence_forecasts(self.learner, runs.inputs)
            nll = censored_nll(mu, sigma, runs.y[:, part], runs.censored[:, part], ~runs.held_out[:, part])
            with torch.no_grad():
                ref_mu, ref_sigma = sequence_forecasts(reference, runs.inputs)
            kl = gaussian_kl(mu[..., None], sigma[..., None], ref_mu[..., None], ref_sigma[..., None]).mean()
            loss = nll + cfg.kl_coef * kl
            self._optimizer.zero_grad(set_to_none=True)
            loss.backward()
            self._optimizer.step()
        assert runs is not None
        with torch.no_grad():
            for acting, learned in zip(self.acting.parameters(), self.learner.parameters()):
                acting.mul_(cfg.ema_decay).add_(learned, alpha=1.0 - cfg.ema_decay)
            new = sequence_forecasts(self.acting, runs.inputs)
            old = sequence_forecasts(reference, runs.inputs)
            moved = float(gaussian_kl(*(v[..., None] for v in (*new, *old))).mean())
        self.updates += 1
        return RefitStats(nll.item(), kl.item(), max(moved, 0.0))
