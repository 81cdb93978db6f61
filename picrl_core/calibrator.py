"""Phase 3 fast loop: the event-driven reactive calibrator, Eq. (12) and Algorithm 1."""
from __future__ import annotations

import numpy as np

from picrl_core.config import CalibratorConfig


def calibrate(margin: np.ndarray, bias: np.ndarray, eta: np.ndarray, censored: np.ndarray,
              over_provisioned: np.ndarray, cfg: CalibratorConfig) -> tuple[np.ndarray, np.ndarray]:
    """One reactive-calibrator step for a batch of services, Eq. (12):

        m_{t+1} = m_t + eta_t * delta_m * [1(c_t) - 1(not c_t and a_t > y_t)]
        b_{t+1} = b_t + eta_t * delta_b * [1(c_t) - gamma * 1(not c_t and a_t > y_t)]

    A shortage raises both the fast margin and the slow bias; an over-provisioned step lowers the
    margin fully and the bias by the smaller factor ``gamma``. Both stay within their configured
    bounds so a long streak cannot run them away.
    """
    shortage = censored.astype(np.float64)
    over = over_provisioned.astype(np.float64)
    margin = margin + eta * cfg.delta_m * (shortage - over)
    bias = bias + eta * cfg.delta_b * (shortage - cfg.gamma * over)
    return (np.clip(margin, -cfg.margin_limit, cfg.margin_limit),
            np.clip(bias, -cfg.bias_limit, cfg.bias_limit))
