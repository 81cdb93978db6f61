"""Controller states survive packing into fixed-size rows, byte for byte."""

from __future__ import annotations

from dataclasses import fields

import numpy as np
import torch

from picrl_core.config import PicRLConfig
from picrl_core.controller import PicRLController
from picrl_core.controller_state import ControllerState
from picrl_core.policy import PolicyNetwork
from picrl_core.predictor.model import GaussianLSTM
from picrl_core.state_codec import StateCodec


def _state(config: PicRLConfig, services: int) -> ControllerState:
    torch.manual_seed(0)
    controller = PicRLController(GaussianLSTM(config.predictor), PolicyNetwork(config.policy), config)
    rng = np.random.default_rng(1)
    state = controller.initial_state(
        np.arange(services, dtype=np.uint64), rng.uniform(0.2, 0.8, (services, 40)), start_tick=5
    )
    y = np.minimum(rng.uniform(0, 1, services), state.action)
    return controller.step(state, y, y >= state.action)[0]


def test_pack_unpack_round_trip_is_exact_and_rows_are_small(tiny_config: PicRLConfig) -> None:
    state = _state(tiny_config, 6)
    codec = StateCodec.for_config(tiny_config)
    rows = codec.pack(state)
    back = codec.unpack(np.frombuffer(rows.tobytes(), dtype=codec.dtype))
    for f in fields(ControllerState):
        original, restored = getattr(state, f.name), getattr(back, f.name)
        assert restored.dtype == original.dtype and np.array_equal(restored, original), f.name
    assert codec.row_bytes == len(rows.tobytes()) // 6
    assert codec.row_bytes < 2048


def test_one_row_can_be_unpacked_alone(tiny_config: PicRLConfig) -> None:
    state = _state(tiny_config, 3)
    codec = StateCodec.for_config(tiny_config)
    raw = codec.pack(state).tobytes()
    second = codec.unpack(np.frombuffer(raw[codec.row_bytes : 2 * codec.row_bytes], dtype=codec.dtype))
    assert second.action[0] == state.action[1] and second.tick[0] == state.tick[1]
