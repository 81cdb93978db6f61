"""The trainer publishes a candidate only when it differs from the published version (``min_kl``) and scores better."""

from __future__ import annotations

import copy

import pytest
import torch

from picrl_core.config import PolicyConfig
from picrl_core.policy import N_FEATURES, PolicyNetwork
from stream.trainer import TrainerSettings, policy_kl


def test_the_kl_to_the_published_version_is_zero_for_a_copy_and_grows_with_the_shift() -> None:
    torch.manual_seed(0)
    policy = PolicyNetwork(PolicyConfig())
    features = torch.randn(256, N_FEATURES)
    assert policy_kl(copy.deepcopy(policy), policy, features) == 0.0
    moved = copy.deepcopy(policy)
    with torch.no_grad():
        for p in moved.parameters():
            p.add_(1e-3 * torch.randn_like(p))
    small = policy_kl(moved, policy, features)
    with torch.no_grad():
        for p in moved.parameters():
            p.add_(3e-2 * torch.randn_like(p))
    assert 0.0 < small < TrainerSettings.min_kl <= policy_kl(moved, policy, features)


def test_min_kl_is_a_setting_that_refuses_a_negative_threshold() -> None:
    assert TrainerSettings("localhost:9092").min_kl == 1e-4
    with pytest.raises(ValueError, match="min_kl"):
        TrainerSettings("localhost:9092", min_kl=-1.0)
