"""Counter-based exploration noise and service keys (picrl_core.noise)."""

from __future__ import annotations

import numpy as np

from picrl_core.noise import counter_normal, service_key


def test_draw_is_a_pure_function_of_seed_key_tick_dim() -> None:
    keys = np.array([3, 3, 17, 2**62 + 5, 0], dtype=np.uint64)
    ticks = np.array([0, 1, 1, 123_456, 9], dtype=np.int64)
    full = counter_normal(7, keys, ticks, 3)
    assert full.shape == (5, 3)
    for i in range(5):  # each row alone
        np.testing.assert_array_equal(counter_normal(7, keys[i : i + 1], ticks[i : i + 1], 3)[0], full[i])
    order = np.array([4, 2, 0, 3, 1])  # any order and any sub-batch
    np.testing.assert_array_equal(counter_normal(7, keys[order], ticks[order], 3), full[order])
    np.testing.assert_array_equal(counter_normal(7, keys[[1, 3]], ticks[[1, 3]], 3), full[[1, 3]])
    # asking for fewer dimensions gives the leading columns of the same draws
    np.testing.assert_array_equal(counter_normal(7, keys, ticks, 2), full[:, :2])


def test_draw_changes_with_seed_key_and_tick() -> None:
    base = counter_normal(1, np.array([5], np.uint64), np.array([10]), 2)
    assert not np.array_equal(base, counter_normal(2, np.array([5], np.uint64), np.array([10]), 2))
    assert not np.array_equal(base, counter_normal(1, np.array([6], np.uint64), np.array([10]), 2))
    assert not np.array_equal(base, counter_normal(1, np.array([5], np.uint64), np.array([11]), 2))


def test_draws_look_standard_normal_and_uncorrelated() -> None:
    n_keys, n_ticks = 1000, 100
    keys = np.repeat(np.arange(n_keys, dtype=np.uint64), n_ticks)
    ticks = np.tile(np.arange(n_ticks, dtype=np.int64), n_keys)
    z = counter_normal(0, keys, ticks, 2)  # 100k rows, ordered (key, tick)
    assert np.all(np.isfinite(z))
    assert abs(z.mean()) < 0.01
    assert abs(z.std() - 1.0) < 0.01
    assert abs(np.mean(np.abs(z) > 1.959964) - 0.05) < 0.003  # two-sided 5% tail
    assert abs(np.corrcoef(z[:, 0], z[:, 1])[0, 1]) < 0.015  # between dimensions
    per_key = z[:, 0].reshape(n_keys, n_ticks)
    lagged = np.corrcoef(per_key[:, :-1].ravel(), per_key[:, 1:].ravel())[0, 1]
    assert abs(lagged) < 0.015  # between consecutive ticks of one service
    neighbour = np.corrcoef(per_key[:-1].ravel(), per_key[1:].ravel())[0, 1]
    assert abs(neighbour) < 0.015  # between consecutive keys at the same tick


def test_service_key_is_stable_and_distinct() -> None:
    assert service_key("svc-a") == 7733247446697429609  # pinned: the same in every process and release
    assert service_key("svc-a") == service_key("svc-a")
    ids = [f"service-{i}" for i in range(2000)] + ["", "svc-a", "svc-b", "SVC-A"]
    keys = [service_key(s) for s in ids]
    assert len(set(keys)) == len(ids)
    assert all(0 <= k < 2**63 for k in keys)  # fits a signed 64-bit integer and np.uint64
