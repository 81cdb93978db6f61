"""Policy and value networks of Sec. 3.2.1: ``(eta_t, k_t) = pi_phi(s_t)`` and ``V_psi(s_t)``.

The policy is a diagonal Gaussian over two pre-squash variables; a sigmoid maps them into the
ranges ``eta in [0.5, 3]`` (calibrator step multiplier, the paper's) and ``k in z* + [-1, 1]`` (risk-buffer
coefficient around the newsvendor fractile, :func:`risk_centre`; the paper's ``[0, 2]`` in its preset).
Acting deterministically uses the Gaussian mean; exploring adds ``std * noise``.
"""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np
import torch
from torch import nn

from picrl_core.config import PicRLConfig, PolicyConfig
from picrl_core.costs import critical_ratio
from picrl_core.features import FEATURE_NAMES

N_FEATURES = len(FEATURE_NAMES)
N_OUTPUTS = 2  # (eta, k)


def _mlp(inputs: int, hidden: int, outputs: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Linear(inputs, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh(), nn.Linear(hidden, outputs)
    )


class PolicyNetwork(nn.Module):
    """``pi_phi(s)``: Gaussian mean from an MLP over the state features, state-independent log-std."""

    def __init__(self, cfg: PolicyConfig) -> None:
        super().__init__()
        self.body = _mlp(N_FEATURES, cfg.hidden, N_OUTPUTS)
        self.log_std = nn.Parameter(torch.full((N_OUTPUTS,), cfg.init_log_std))
        with torch.no_grad():  # start near the middle of both ranges with a small output layer
            last = self.body[-1]
            assert isinstance(last, nn.Linear)
            last.weight.mul_(0.1)
            last.bias.zero_()

    def forward(self, features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean and std of the pre-squash Gaussian, each ``(B, 2)``."""
        mean = self.body(features)
        std = self.log_std.clamp(-5.0, 1.0).exp().expand_as(mean)
        return mean, std


class ValueNetwork(nn.Module):
    """``V_psi(s)``: the critic, a baseline for the policy gradient."""

    def __init__(self, cfg: PolicyConfig) -> None:
        super().__init__()
        self.body = _mlp(N_FEATURES, cfg.hidden, 1)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.body(features).squeeze(-1)


def gaussian_log_prob(mean: torch.Tensor, std: torch.Tensor, pre: torch.Tensor) -> torch.Tensor:
    """Log density of the pre-squash sample under the diagonal Gaussian, summed over (eta, k)."""
    z = (pre - mean) / std
    return (-0.5 * z.pow(2) - std.log() - 0.5 * math.log(2.0 * math.pi)).sum(-1)


def gaussian_kl(mean_p: torch.Tensor, std_p: torch.Tensor, mean_q: torch.Tensor, std_q: torch.Tensor) -> torch.Tensor:
    """``KL(N_p || N_q)`` of diagonal Gaussians, summed over dimensions (closed form)."""
    return (torch.log(std_q / std_p) + (std_p.pow(2) + (mean_p - mean_q).pow(2)) / (2.0 * std_q.pow(2)) - 0.5).sum(-1)


def risk_centre(config: PicRLConfig) -> float:
    """Where the risk-buffer range is centred: the critical fractile ``z* = Phi^{-1}(c_under / (c_under +
    c_over))`` of a (calibrated) Gaussian forecast when ``policy.k_around_fractile`` (``mu + z* sigma`` is then
    the newsvendor's order, Eq. 1, and the policy learns the state-dependent deviation from it), else 0."""
    if not config.policy.k_around_fractile:
        return 0.0
    return NormalDist().inv_cdf(critical_ratio(config.cost))


def squash(pre: np.ndarray, cfg: PolicyConfig, centre: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """Map pre-squash samples ``(B, 2)`` to ``eta in [eta_low, eta_high]`` and ``k in centre + [k_low, k_high]``."""
    gate = 1.0 / (1.0 + np.exp(-pre.astype(np.float64)))
    eta = cfg.eta_low + (cfg.eta_high - cfg.eta_low) * gate[:, 0]
    k = centre + cfg.k_low + (cfg.k_high - cfg.k_low) * gate[:, 1]
    return eta, k
