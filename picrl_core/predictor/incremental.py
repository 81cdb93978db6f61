"""The incremental predictor (``PredictorConfig.kind = "incremental"``): the same Gaussian LSTM, carried.

The paper's predictor (``kind = "windowed"``) re-reads the whole ``W``-step window from a zero state at
every tick: ``W`` LSTM cell steps per service per tick. The incremental one keeps the LSTM's ``(h, c)``
per service in the controller state (``ControllerState.memory``, ``2 * layers * hidden`` floats) and
advances one cell step per tick with the newest ``[y, c, ctx]`` row; a cold start runs the history
window once (:class:`IncrementalForecaster`). Its network is a :class:`~picrl_core.predictor.model.GaussianLSTM`
(same weights, same head, same artifact layout); what differs is how it is trained and used, so the artifact's
config says which one it holds (``predictor.kind``, :mod:`picrl_core.predictor.kinds`).

Training (:class:`SequenceSampler`): sequences of ``4 W`` steps of the training split, each
from a zero state, re-censored in blocks of ``W`` steps like the windowed model's windows
(``censor_prob`` of the blocks under a synthetic threshold), Gaussian NLL (Eq. 3) on every prediction
after the first ``W`` steps, back-propagated through the whole sequence. Validation runs the LSTM over
the whole validation split as one stream, as the controller runs it, and scores the same targets as
the windowed model's evaluation (every step after the first ``W``); early stopping and the temperature
of ``sigma`` use that NLL.
"""

from __future__ import annotations

import numpy as np
import torch

from picrl_core.batching import INVARIANT_CHUNK, in_fixed_chunks
from picrl_core.config import PredictorConfig
from picrl_core.predictor.model import (
    Forecast,
    Forecasts,
    GaussianLSTM,
    PredictorInputError,
    censor_noise_std,
    forecast_metrics,
    gaussian_nll,
    gaussian_output,
    pic_inputs,
)

_SEQUENCE_WINDOWS = 4  # a training sequence is this many windows long; the first one only warms the state up


def memory_size(cfg: PredictorConfig) -> int:
    """Floats of ``(h, c)`` per service: ``2 * layers * hidden``."""
    return 2 * cfg.layers * cfg.hidden


def _join_memory(h: list[torch.Tensor] | torch.Tensor, c: list[torch.Tensor] | torch.Tensor) -> np.ndarray:
    """Each layer's ``(B, H)`` ``h`` then ``c`` side by side: the ``(B, 2 L H)`` memory rows."""
    return np.concatenate([layer.numpy() for layer in (*h, *c)], axis=1)


def start_memory(
    model: GaussianLSTM, windows: np.ndarray, chunk: int = INVARIANT_CHUNK
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Cold start: the window ``(B, W, 2 + C)`` read from a zero state -> ``(mu, sigma)`` float64 ``(B,)``
    for the next step and the memory ``(B, 2 L H)`` float32 after the window's last row (batch-invariant
    for a fixed ``chunk``)."""
    windows = np.asarray(windows, dtype=np.float32)
    cfg = model.cfg
    if windows.shape[0] == 0:
        return np.empty(0), np.empty(0), np.zeros((0, memory_size(cfg)), np.float32)

    def forward(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        x = torch.from_numpy(rows)
        _, (h, c) = model.lstm(x)
        mu, sigma = gaussian_output(model.head, h[-1], x[:, -1, 0], cfg.sigma_min)
        return mu.numpy(), sigma.numpy(), _join_memory(h, c)

    with torch.inference_mode():
        mu, sigma, memory = in_fixed_chunks(forward, windows, chunk)
    return mu.astype(np.float64), sigma.astype(np.float64), memory


def advance_memory(
    model: GaussianLSTM, newest: np.ndarray, memory: np.ndarray, chunk: int = INVARIANT_CHUNK
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One LSTM cell step per service: the newest input row ``(B, 2 + C)`` and the carried memory
    ``(B, 2 L H)`` -> ``(mu, sigma)`` float64 for the next step and the new memory (batch-invariant for
    a fixed ``chunk``: every matrix product runs on exactly ``chunk`` rows, as in
    :func:`~picrl_core.batching.in_fixed_chunks`, and the elementwise rest on a chunk's own rows only).

    A short last chunk leaves the rows after its own in the products' input buffers as they are: a product's row
    reads its own input row only, so they change no bit of the others (and cost a small batch no elementwise work)."""
    cfg = model.cfg
    rows, hidden, layers = newest.shape[0], cfg.hidden, cfg.layers
    if rows == 0:
        return np.empty(0), np.empty(0), np.zeros((0, memory_size(cfg)), np.float32)
    newest, memory = np.asarray(newest, dtype=np.float32), np.asarray(memory, dtype=np.float32)
    lstm = model.lstm
    weights = [
        (
            getattr(lstm, f"weight_ih_l{k}"),
            getattr(lstm, f"weight_hh_l{k}"),
            getattr(lstm, f"bias_ih_l{k}"),
            getattr(lstm, f"bias_hh_l{k}"),
        )
        for k in range(layers)
    ]
    # the products' inputs, ``chunk`` rows each: every layer's input (the newest row, then the layer below's h; the
    # last one is the head's) and every layer's previous h
    layer_in = [np.zeros((chunk, newest.shape[1]), np.float32)] + [
        np.zeros((chunk, hidden), np.float32) for _ in range(layers)
    ]
    previous = [np.zeros((chunk, hidden), np.float32) for _ in range(layers)]
    layer_in_t, previous_t = [torch.from_numpy(x) for x in layer_in], [torch.from_numpy(h) for h in previous]
    mu, sigma = np.empty(rows, np.float32), np.empty(rows, np.float32)
    new_memory = np.empty((rows, memory_size(cfg)), np.float32)
    with torch.inference_mode():
        for lo in range(0, rows, chunk):
            count = min(chunk, rows - lo)
            part = slice(lo, lo + count)
            layer_in[0][:count] = newest[part]
            for k, (w_ih, w_hh, b_ih, b_hh) in enumerate(weights):  # one cell step per layer (no nn.LSTM overhead)
                h_at = slice(k * hidden, (k + 1) * hidden)
                c_at = slice((layers + k) * hidden, (layers + k + 1) * hidden)
                previous[k][:count] = memory[part, h_at]
                h_k, c_k = _cell_step(layer_in_t[k], previous_t[k], memory[part, c_at], w_ih, w_hh, b_ih, b_hh)
                new_memory[part, h_at], new_memory[part, c_at] = h_k, c_k
                layer_in[k + 1][:count] = h_k
            m, s = gaussian_output(model.head, layer_in_t[layers], layer_in_t[0][:, 0], cfg.sigma_min)
            mu[part], sigma[part] = m.numpy()[:count], s.numpy()[:count]
    return mu.astype(np.float64), sigma.astype(np.float64), new_memory


def _cell_step(
    x: torch.Tensor,
    h: torch.Tensor,
    c: np.ndarray,
    w_ih: torch.Tensor,
    w_hh: torch.Tensor,
    b_ih: torch.Tensor,
    b_hh: torch.Tensor,
) -> tuple[np.ndarray, np.ndarray]:
    """One LSTM cell step, ``torch.lstm_cell``'s arithmetic in its order (gates ``[i, f, g, o] = W_ih x + b_ih +
    W_hh h + b_hh``; ``c' = f c + i g``, ``h' = o tanh(c')``), with numpy's float32 tanh: ~10x faster than torch's
    on this CPU, within an ulp of it, and per element the same in any batch. ``x`` and ``h`` are a chunk's
    product inputs, ``c`` ``(n, H)`` the chunk's own rows (its first ``n``); returns their ``(h', c')``."""
    gates = torch.nn.functional.linear(x, w_ih, b_ih) + torch.nn.functional.linear(h, w_hh, b_hh)
    count, hidden = c.shape
    squashed = torch.sigmoid(gates).numpy()[:count]  # one call for i, f and o (g's sigmoid is unused)
    ingate, forget, outgate = squashed[:, :hidden], squashed[:, hidden : 2 * hidden], squashed[:, 3 * hidden :]
    cell = np.tanh(gates.numpy()[:count, 2 * hidden : 3 * hidden])
    c_new = forget * c + ingate * cell
    return outgate * np.tanh(c_new), c_new


class IncrementalForecaster:
    """:class:`~picrl_core.predictor.model.Forecaster` of the incremental predictor: a cold start reads the window
    from a zero state (:func:`start_memory`), a tick takes one cell step on the window's newest row
    (:func:`advance_memory`); both batch-invariant for a fixed ``chunk``."""

    memory_size = staticmethod(memory_size)

    def __init__(self, model: GaussianLSTM, chunk: int = INVARIANT_CHUNK) -> None:
        self.model, self.chunk = model, chunk

    def start(self, observations: np.ndarray, censored: np.ndarray, context: np.ndarray) -> Forecast:
        return start_memory(self.model, pic_inputs(observations, censored, context), self.chunk)

    def advance(
        self, observations: np.ndarray, censored: np.ndarray, context: np.ndarray, memory: np.ndarray
    ) -> Forecast:
        newest = np.concatenate([observations[:, -1:], censored[:, -1:].astype(np.float32), context[:, -1]], axis=1)
        return advance_memory(self.model, newest, memory, self.chunk)


def _sequence_outputs(model: GaussianLSTM, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(mu, sigma)`` ``(B, T)`` after every step of sequences ``x`` ``(B, T, 2 + C)`` from a zero state."""
    out, _ = model.lstm(x)
    rows, steps, hidden = out.shape
    mu, sigma = gaussian_output(
        model.head, out.reshape(rows * steps, hidden), x[:, :, 0].reshape(-1), model.cfg.sigma_min
    )
    return mu.reshape(rows, steps), sigma.reshape(rows, steps)


def _inputs(d: np.ndarray, context: np.ndarray | None) -> np.ndarray:
    """Uncensored input rows ``[d, 0, ctx]`` ``(T, 2 + C)`` float32 of a series."""
    channels = 0 if context is None else context.shape[1]
    x = np.zeros((len(d), 2 + channels), np.float32)
    x[:, 0] = d
    if context is not None:
        x[:, 2:] = context
    return x


def _training_sequences(
    d: np.ndarray,
    context: np.ndarray | None,
    starts: np.ndarray,
    length: int,
    block: int,
    rng: np.random.Generator,
    censor_prob: float,
) -> tuple[np.ndarray, np.ndarray]:
    """Sequences ``X`` ``(N, length, 2 + C)`` starting at ``starts`` and their targets ``(N, length)`` (the
    demand one step later); blocks of ``block`` steps are censored with probability ``censor_prob`` under
    a threshold ``clip(d + eps, 0, 1)``, ``eps ~ N(0, s)`` with ``s`` drawn per block (:func:`~picrl_core.
    predictor.censor_noise_std` of the block's demand)."""
    index = starts[:, None] + np.arange(length)[None, :]
    demand = d[index]
    n, blocks = len(starts), -(-length // block)
    censored_block = np.repeat(rng.random((n, blocks)) < censor_prob, block, axis=1)[:, :length]
    padded = np.pad(demand, ((0, 0), (0, blocks * block - length)), mode="edge")  # the last block may be short
    stds = censor_noise_std(padded.reshape(n, blocks, block), rng)
    noise = np.repeat(stds, block, axis=1)[:, :length]
    threshold = np.clip(demand + rng.standard_normal((n, length)) * noise, 0.0, 1.0)
    cens = censored_block & (demand > threshold)
    channels = 0 if context is None else context.shape[1]
    x = np.empty((n, length, 2 + channels), np.float32)
    x[:, :, 0] = np.where(cens, threshold, demand)
    x[:, :, 1] = cens
    if context is not None:
        x[:, :, 2:] = context[index]
    return x, d[index + 1].astype(np.float32)


def stream_forecasts(
    model: GaussianLSTM, series: np.ndarray, context: np.ndarray | None, window: int, services: int = 1
) -> Forecasts:
    """``(mu, sigma, target)`` of the whole (uncensored) series run as one stream per service, scored on
    every step after the first ``window`` (the windowed evaluation's targets)."""
    per = len(series) // services
    mu, sigma, target = [], [], []
    with torch.no_grad():
        for s in range(services):
            part = slice(s * per, (s + 1) * per)
            x = torch.from_numpy(_inputs(series[part], None if context is None else context[part]))[None]
            m, sd = _sequence_outputs(model, x[:, :-1])
            mu.append(m[0, window - 1 :].numpy().astype(np.float64))
            sigma.append(sd[0, window - 1 :].numpy().astype(np.float64))
            target.append(series[part][window:])
    return np.concatenate(mu), np.concatenate(sigma), np.concatenate(target)


def evaluate_stream(
    model: GaussianLSTM, series: np.ndarray, context: np.ndarray | None, window: int, services: int = 1
) -> dict[str, float]:
    """NLL (Eq. 3), MAE of ``mu`` and 1/2-sigma coverage of the incremental predictor run over ``series``."""
    return forecast_metrics(stream_forecasts(model, np.asarray(series, np.float64), context, window, services))


class SequenceSampler:
    """:class:`~picrl_core.predictor.model.EpochSampler` of the incremental kind: each epoch ``max_train_windows / 4``
    sequences of ``4 W`` steps (the windowed model's LSTM cell steps per epoch; none straddling two of a fleet's
    ``services`` series), in minibatches of ``batch_size / 4``; the loss is Eq. (3) on every prediction after the
    first ``W`` steps, back-propagated through the whole sequence."""

    def __init__(self, train: np.ndarray, context: np.ndarray | None, cfg: PredictorConfig, services: int) -> None:
        self.train, self.context, self.cfg = train, context, cfg
        window = cfg.window
        self.length = min(_SEQUENCE_WINDOWS * window, len(train) // services - 2)
        if self.length <= window:
            raise PredictorInputError(
                f"the training split is too short for incremental sequences of {window + 1} steps"
            )
        per = len(train) // services
        self.every = (np.arange(services)[:, None] * per + np.arange(per - self.length - 1)[None, :]).reshape(-1)
        self.per_epoch = min(self.every.size, max(1, cfg.max_train_windows // _SEQUENCE_WINDOWS))
        self.batch = max(1, cfg.batch_size // _SEQUENCE_WINDOWS)

    def draw(self, rng: np.random.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        starts = self.every[rng.permutation(self.every.size)[: self.per_epoch]]
        x, t = _training_sequences(
            self.train, self.context, starts, self.length, self.cfg.window, rng, self.cfg.censor_prob
        )
        return torch.from_numpy(x), torch.from_numpy(t)

    def loss(self, model: GaussianLSTM, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        mu, sigma = _sequence_outputs(model, x)
        first = self.cfg.window - 1
        return gaussian_nll(mu[:, first:], sigma[:, first:], t[:, first:])
