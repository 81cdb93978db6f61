"""Phase-1 substitutions of the comparison (Table 2): TFT, Informer and Autoformer with a Gaussian head.

Each model is a compact implementation of its published architecture's core mechanism, sized by
``PredictorConfig.hidden``, and a drop-in for :class:`~picrl_core.predictor.model.GaussianLSTM`: it reads
the same window ``(B, W, 2 + C)`` of PIC inputs ``[y, c, ctx...]``, returns ``(mu, sigma)`` with
``sigma >= cfg.sigma_min`` through the same Gaussian head, and is trained by the same NLL, Eq. (3),
on the same windows (``train_predictor(..., model_factory=...)``). Phases 2 and 3 are kept.

Every model is deterministic and batch-invariant (a row's output depends on that row only, as
``predict_gaussian`` requires), and computes the same in train and eval mode: no dropout, no batch
normalisation, and no random sampling at forward time.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from picrl_core.config import PicRLConfig, PredictorConfig
from picrl_core.methods.pic_rl import PicRLProvisioner
from picrl_core.pipeline import train_offline, with_windowed_predictor
from picrl_core.predictor.model import gaussian_head, gaussian_output
from picrl_core.series import PreparedSeries

HEADS = 4  # attention heads of every model (hidden must be divisible by it)
FEEDFORWARD = 2  # feed-forward width / hidden (the references use 4, 2048 for 512; halved to keep the models small)
INFORMER_FACTOR = 5  # ProbSparse sampling factor c: u = c ln L queries, c ln L keys sampled (Zhou et al.)
AUTOFORMER_FACTOR = 1  # auto-correlation factor c: top c ln L delays (Wu et al.)
MOVING_AVERAGE = 25  # kernel of Autoformer's series decomposition (capped at the window)


def _check(cfg: PredictorConfig) -> None:
    if cfg.window < 2 or cfg.hidden < HEADS or cfg.hidden % HEADS or cfg.context_channels < 0:
        raise ValueError(
            f"these predictors need window >= 2, context_channels >= 0 and hidden a multiple of "
            f"{HEADS}; got window={cfg.window}, hidden={cfg.hidden}"
        )
    if cfg.sigma_min <= 0:
        raise ValueError(f"predictor sigma_min must be positive, got {cfg.sigma_min}")


# --- TFT (Lim et al., "Temporal Fusion Transformers for interpretable multi-horizon time series
# forecasting", International Journal of Forecasting 37(4), 2021) ----------------------------------


class GatedResidualNetwork(nn.Module):
    """TFT Eq. (2)-(5): ``LayerNorm(skip(a) + GLU(W1 ELU(W2 a + b2) + b1))`` (no static context here)."""

    def __init__(self, d_in: int, d_hidden: int, d_out: int) -> None:
        super().__init__()
        self.skip = nn.Linear(d_in, d_out) if d_in != d_out else nn.Identity()
        self.inner = nn.Linear(d_in, d_hidden)
        self.outer = nn.Linear(d_hidden, d_hidden)
        self.gate = GatedSkip(d_hidden, d_out)

    def forward(self, a: torch.Tensor) -> torch.Tensor:
        return self.gate(self.outer(F.elu(self.inner(a))), self.skip(a))


class GatedSkip(nn.Module):
    """TFT's gated add & norm: ``LayerNorm(residual + GLU(x))``, ``GLU(x) = sigma(W4 x) * (W5 x)``."""

    def __init__(self, d_in: int, d_out: int) -> None:
        super().__init__()
        self.glu = nn.Linear(d_in, 2 * d_out)
        self.norm = nn.LayerNorm(d_out)

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        value, gate = self.glu(x).chunk(2, dim=-1)
        return self.norm(residual + torch.sigmoid(gate) * value)


class VariableSelection(nn.Module):
    """TFT Eq. (6)-(8): each input variable gets a linear embedding and its own GRN; softmax weights
    from a GRN over all embeddings select among them, per time step."""

    def __init__(self, variables: int, d: int) -> None:
        super().__init__()
        # one nn.Linear(1, d) per variable, stored together (the same uniform(-1, 1) initialisation)
        self.embed_weight = nn.Parameter(torch.empty(variables, d).uniform_(-1.0, 1.0))
        self.embed_bias = nn.Parameter(torch.empty(variables, d).uniform_(-1.0, 1.0))
        self.weights = GatedResidualNetwork(variables * d, d, variables)
        self.per_variable = nn.ModuleList(GatedResidualNetwork(d, d, d) for _ in range(variables))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xi = x[..., None] * self.embed_weight + self.embed_bias  # (B, W, V, d)
        v = torch.softmax(self.weights(xi.flatten(-2)), dim=-1)  # (B, W, V)
        processed = torch.stack([grn(xi[..., j, :]) for j, grn in enumerate(self.per_variable)], dim=-2)
        return (v[..., None] * processed).sum(dim=-2)


class InterpretableAttention(nn.Module):
    """TFT's interpretable multi-head attention: head-specific queries and keys, one value projection
    shared by all heads, head outputs averaged, then a linear map. Only the forecast position (the
    last) queries."""

    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads, self.d_head = heads, d // heads
        self.query = nn.Linear(d, d)
        self.key = nn.Linear(d, d)
        self.value = nn.Linear(d, self.d_head)
        self.out = nn.Linear(self.d_head, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, w, _ = x.shape
        q = self.query(x[:, -1:]).view(b, 1, self.heads, self.d_head).transpose(1, 2)  # (B, H, 1, e)
        k = self.key(x).view(b, w, self.heads, self.d_head).transpose(1, 2)  # (B, H, W, e)
        attn = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(self.d_head), dim=-1)
        return self.out((attn @ self.value(x)[:, None]).mean(dim=1))[:, 0]  # (B, d)


class GaussianTFT(nn.Module):
    """TFT for one-step-ahead forecasting with a Gaussian head.

    Variable selection -> LSTM encoder (the sequence-to-sequence layer; there are no known future
    inputs, so the forecast position is the last observed step) -> gated skip -> enrichment GRN
    (no static covariates) -> interpretable multi-head attention -> gated skip -> position-wise GRN
    -> gated skip to the LSTM output -> ``mu = y_last + head_mu``, ``sigma = softplus(.) + sigma_min``.
    """

    def __init__(self, cfg: PredictorConfig) -> None:
        super().__init__()
        _check(cfg)
        d = cfg.hidden
        self.cfg = cfg
        self.input_size = 2 + cfg.context_channels
        self.select = VariableSelection(self.input_size, d)
        self.lstm = nn.LSTM(d, d, batch_first=True)
        self.lstm_gate = GatedSkip(d, d)
        self.enrich = GatedResidualNetwork(d, d, d)
        self.attention = InterpretableAttention(d, HEADS)
        self.attention_gate = GatedSkip(d, d)
        self.position_wise = GatedResidualNetwork(d, d, d)
        self.output_gate = GatedSkip(d, d)
        self.head = gaussian_head(d, cfg)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        selected = self.select(x)
        phi = self.lstm_gate(self.lstm(selected)[0], selected)  # (B, W, d)
        theta = self.enrich(phi)
        delta = self.attention_gate(self.attention(theta), theta[:, -1])
        psi = self.output_gate(self.position_wise(delta), phi[:, -1])
        return gaussian_output(self.head, psi, x[:, -1, 0], self.cfg.sigma_min)


# --- Informer (Zhou et al., "Informer: beyond efficient transformer for long sequence time-series
# forecasting", AAAI 2021) -------------------------------------------------------------------------


def _positional_encoding(length: int, d: int) -> torch.Tensor:
    """Sinusoidal position encoding (Vaswani et al. 2017), ``(length, d)``."""
    position = torch.arange(length, dtype=torch.float32)[:, None]
    frequency = torch.exp(torch.arange(0, d, 2, dtype=torch.float32) * (-math.log(10000.0) / d))
    encoding = torch.zeros(length, d)
    encoding[:, 0::2] = torch.sin(position * frequency)
    encoding[:, 1::2] = torch.cos(position * frequency)[:, : d // 2]
    return encoding


class TokenEmbedding(nn.Module):
    """Informer/Autoformer value embedding: a width-3 circular convolution over time, ``c -> d``."""

    def __init__(self, channels: int, d: int) -> None:
        super().__init__()
        self.conv = nn.Conv1d(channels, d, kernel_size=3, padding=1, padding_mode="circular")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x.transpose(1, 2)).transpose(1, 2)


class ProbSparseAttention(nn.Module):
    """Informer's ProbSparse self-attention: each query's sparsity ``M(q, K) = max_j q k_j - sum_j q k_j
    / L_K`` is measured on ``U = c ln L_K`` sampled keys (drawn once, when the layer is built, so the
    forward pass is deterministic); only the ``u = c ln L_Q`` queries with the largest ``M`` attend,
    the others output ``mean(V)`` (with a causal mask: the mean of the values up to their position).

    At these window lengths ``u`` is close to ``L_Q``, so the active rows are taken from one fused
    attention over all queries rather than gathered: the output is the same.
    """

    def __init__(self, queries: int, keys: int, causal: bool) -> None:
        super().__init__()
        self.causal = causal
        self.n_top = min(queries, max(1, INFORMER_FACTOR * math.ceil(math.log(queries))))
        n_sample = min(keys, max(1, INFORMER_FACTOR * math.ceil(math.log(keys))))
        sample = torch.randint(keys, (queries, n_sample))  # key indices sampled for each query
        counts = torch.zeros(queries, keys).scatter_add_(1, sample, torch.ones(queries, n_sample))
        self.register_buffer("sample_counts", counts)  # how often query i sampled key j

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """``q`` ``(B, H, L_Q, e)``, ``k``/``v`` ``(B, H, L_K, e)`` -> ``(B, H, L_Q, e)``."""
        n_keys = k.shape[2]
        scores = q @ k.transpose(-2, -1)  # unscaled: the scale does not change the ranking
        sampled_max = scores.masked_fill(self.sample_counts == 0, float("-inf")).amax(dim=-1)
        sampled_sum = (q * (self.sample_counts @ k)).sum(dim=-1)
        top = (sampled_max - sampled_sum / n_keys).topk(self.n_top, dim=-1).indices  # (B, H, u)
        active = torch.zeros(q.shape[:3], dtype=torch.bool).scatter_(2, top, True)
        if self.causal:
            lazy = v.cumsum(dim=2) / torch.arange(1, n_keys + 1, dtype=v.dtype)[:, None]
        else:
            lazy = v.mean(dim=2, keepdim=True)
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        return torch.where(active[..., None], attended, lazy)


class FullAttention(nn.Module):
    """Canonical scaled dot-product attention (Informer's decoder cross-attention)."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v)


class AttentionLayer(nn.Module):
    """Multi-head projections around an attention kernel on ``(B, H, L, e)`` tensors."""

    def __init__(self, kernel: nn.Module, d: int, heads: int) -> None:
        super().__init__()
        self.kernel, self.heads = kernel, heads
        self.query, self.key, self.value, self.out = (nn.Linear(d, d) for _ in range(4))

    def forward(self, queries: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        def split(x: torch.Tensor) -> torch.Tensor:
            return x.view(x.shape[0], x.shape[1], self.heads, -1).transpose(1, 2)

        out = self.kernel(split(self.query(queries)), split(self.key(keys)), split(self.value(keys)))
        return self.out(out.transpose(1, 2).flatten(2))


def _feed_forward(d: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(d, FEEDFORWARD * d), nn.GELU(), nn.Linear(FEEDFORWARD * d, d))


class InformerEncoderLayer(nn.Module):
    """ProbSparse self-attention and a feed-forward block, each with a residual and layer norm."""

    def __init__(self, length: int, d: int) -> None:
        super().__init__()
        self.attention = AttentionLayer(ProbSparseAttention(length, length, causal=False), d, HEADS)
        self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.feed_forward = _feed_forward(d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.norm1(x + self.attention(x, x))
        return self.norm2(x + self.feed_forward(x))


class DistillingLayer(nn.Module):
    """Informer Eq. (5), self-attention distilling: ``MaxPool(ELU(Conv1d(x)))`` halves the length.
    Layer norm replaces the batch norm of the reference so a row's output never depends on its batch."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.conv = nn.Conv1d(d, d, kernel_size=3, padding=1, padding_mode="circular")
        self.norm = nn.LayerNorm(d)
        self.pool = nn.MaxPool1d(kernel_size=3, stride=2, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.elu(self.norm(self.conv(x.transpose(1, 2)).transpose(1, 2)))
        return self.pool(y.transpose(1, 2)).transpose(1, 2)


class GaussianInformer(nn.Module):
    """Informer for one-step-ahead forecasting with a Gaussian head.

    Encoder: two ProbSparse self-attention layers with a distilling layer between them. Decoder
    (generative inference): the last ``W // 2`` steps plus one zero placeholder for the target step,
    masked ProbSparse self-attention, full cross-attention to the encoder, feed-forward; the
    placeholder's output feeds ``mu = y_last + head_mu``, ``sigma = softplus(.) + sigma_min``.
    """

    def __init__(self, cfg: PredictorConfig) -> None:
        super().__init__()
        _check(cfg)
        d, w = cfg.hidden, cfg.window
        self.cfg = cfg
        self.input_size = 2 + cfg.context_channels
        self.label_len = max(1, w // 2)
        decoder_len = self.label_len + 1
        self.register_buffer("encoder_position", _positional_encoding(w, d), persistent=False)
        self.register_buffer("decoder_position", _positional_encoding(decoder_len, d), persistent=False)
        self.encoder_embedding = TokenEmbedding(self.input_size, d)
        self.decoder_embedding = TokenEmbedding(self.input_size, d)
        self.encoder = nn.ModuleList([InformerEncoderLayer(w, d), InformerEncoderLayer((w + 1) // 2, d)])
        self.distil = DistillingLayer(d)
        self.encoder_norm = nn.LayerNorm(d)
        self.self_attention = AttentionLayer(ProbSparseAttention(decoder_len, decoder_len, causal=True), d, HEADS)
        self.cross_attention = AttentionLayer(FullAttention(), d, HEADS)
        self.decoder_norms = nn.ModuleList(nn.LayerNorm(d) for _ in range(4))
        self.feed_forward = _feed_forward(d)
        self.head = gaussian_head(d, cfg)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        enc = self.encoder_embedding(x) + self.encoder_position
        enc = self.encoder[1](self.distil(self.encoder[0](enc)))
        enc = self.encoder_norm(enc)
        placeholder = torch.zeros_like(x[:, :1])
        dec = self.decoder_embedding(torch.cat([x[:, -self.label_len :], placeholder], dim=1)) + self.decoder_position
        norm1, norm2, norm3, final = self.decoder_norms
        dec = norm1(dec + self.self_attention(dec, dec))
        dec = norm2(dec + self.cross_attention(dec, enc))
        dec = final(norm3(dec + self.feed_forward(dec)))
        return gaussian_output(self.head, dec[:, -1], x[:, -1, 0], self.cfg.sigma_min)


# --- Autoformer (Wu et al., "Autoformer: decomposition transformers with auto-correlation for
# long-term series forecasting", NeurIPS 2021) -----------------------------------------------------


class SeriesDecomposition(nn.Module):
    """Autoformer Eq. (1): ``trend = AvgPool(Padding(x))``, ``seasonal = x - trend``, with the series
    padded by repeating its end values. For a series of ``length`` steps the moving average is one
    fixed ``(length, length)`` matrix, applied along time."""

    def __init__(self, kernel: int, length: int) -> None:
        super().__init__()
        front = (kernel - 1) // 2
        source = (torch.arange(length)[:, None] + torch.arange(kernel)[None, :] - front).clamp(0, length - 1)
        average = torch.zeros(length, length).scatter_add_(1, source, torch.full((length, kernel), 1.0 / kernel))
        self.register_buffer("average", average, persistent=False)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # x^T A^T: one matrix product over all rows; ``A @ x`` would first copy A once per row (broadcast)
        trend = torch.matmul(x.transpose(1, 2), self.average.T).transpose(1, 2)
        return x - trend, trend


class AutoCorrelation(nn.Module):
    """Autoformer's auto-correlation: period-based dependencies ``R(tau) = IFFT(FFT(Q) conj(FFT(K)))``
    (Wiener-Khinchin), the top ``c ln L`` delays per series (averaged over heads and channels) are
    softmax-weighted and the values rolled by each delay are aggregated. Delays are chosen per
    series, as in the reference's inference path, for training too (batch invariance).

    Computed on the ``(B, L, H e)`` rows the heads are a view of: the mean over heads and channels is taken
    of the cross-spectrum, before the one inverse transform (the transform is linear), and one aggregation
    matrix per series serves every head and channel."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """``q`` ``(B, H, L, e)``, ``k``/``v`` ``(B, H, S, e)`` -> ``(B, H, L, e)``."""
        rows, heads, length, channels = q.shape
        q, k, v = (x.transpose(1, 2).flatten(2) for x in (q, k, v))  # (B, L or S, H e)
        if k.shape[1] < length:  # pad (or cut) keys and values to the query length
            pad = length - k.shape[1]
            k, v = F.pad(k, (0, 0, 0, pad)), F.pad(v, (0, 0, 0, pad))
        k, v = k[:, :length], v[:, :length]
        spectrum = (torch.fft.rfft(q, dim=1) * torch.conj(torch.fft.rfft(k, dim=1))).mean(dim=2)
        correlation = torch.fft.irfft(spectrum, n=length, dim=1)  # (B, L)
        top_k = max(1, int(AUTOFORMER_FACTOR * math.log(length)))
        weights, delays = correlation.topk(top_k, dim=-1)
        # sum_i w_i roll(V, -tau_i) as one matrix per series: row t holds w_i at column (t + tau_i) mod L
        index = (torch.arange(length)[None, :, None] + delays[:, None, :]) % length  # (B, L, top_k)
        weights = torch.softmax(weights, dim=-1)[:, None, :].expand(-1, length, -1)
        aggregate = torch.zeros(rows, length, length, dtype=v.dtype).scatter_add_(2, index, weights)
        return (aggregate @ v).view(rows, length, heads, channels).transpose(1, 2)


class AutoformerEncoderLayer(nn.Module):
    """Auto-correlation and a feed-forward block, each followed by a series decomposition that keeps
    only the seasonal part."""

    def __init__(self, d: int, kernel: int, length: int) -> None:
        super().__init__()
        self.attention = AttentionLayer(AutoCorrelation(), d, HEADS)
        self.feed_forward = _feed_forward(d)
        self.decompose = SeriesDecomposition(kernel, length)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x, _ = self.decompose(x + self.attention(x, x))
        return self.decompose(x + self.feed_forward(x))[0]


class SeasonalLayerNorm(nn.Module):
    """Autoformer's layer norm for the seasonal part: layer norm, then the time mean removed."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.norm(x)
        return x - x.mean(dim=1, keepdim=True)


class GaussianAutoformer(nn.Module):
    """Autoformer for one-step-ahead forecasting with a Gaussian head.

    The window is decomposed; the decoder starts from the last ``W // 2`` seasonal values plus a
    zero placeholder, and from the matching trend of ``y`` plus the window mean of ``y``. Two encoder
    layers, one decoder layer (self and cross auto-correlation; the trend taken out by each of its
    three decompositions is projected and accumulated). The prediction is Autoformer's
    ``trend + seasonal`` at the placeholder: ``mu = trend + head_mu(seasonal hidden)``,
    ``sigma = softplus(head_sigma(seasonal hidden)) + sigma_min``.
    """

    def __init__(self, cfg: PredictorConfig) -> None:
        super().__init__()
        _check(cfg)
        d, w = cfg.hidden, cfg.window
        self.cfg = cfg
        self.input_size = 2 + cfg.context_channels
        self.label_len = max(1, w // 2)
        kernel = min(MOVING_AVERAGE, w if w % 2 else w - 1)
        self.decompose = SeriesDecomposition(kernel, w)
        self.decompose_decoder = SeriesDecomposition(kernel, self.label_len + 1)
        self.encoder_embedding = TokenEmbedding(self.input_size, d)
        self.decoder_embedding = TokenEmbedding(self.input_size, d)
        self.encoder = nn.ModuleList(AutoformerEncoderLayer(d, kernel, w) for _ in range(2))
        self.encoder_norm = SeasonalLayerNorm(d)
        self.self_attention = AttentionLayer(AutoCorrelation(), d, HEADS)
        self.cross_attention = AttentionLayer(AutoCorrelation(), d, HEADS)
        self.feed_forward = _feed_forward(d)
        self.trend_projection = nn.Conv1d(d, 1, kernel_size=3, padding=1, padding_mode="circular", bias=False)
        self.decoder_norm = SeasonalLayerNorm(d)
        self.head = gaussian_head(d, cfg)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        seasonal, trend = self.decompose(x)
        seasonal_init = torch.cat([seasonal[:, -self.label_len :], torch.zeros_like(x[:, :1])], dim=1)
        trend_init = torch.cat([trend[:, -self.label_len :, :1], x[:, :, :1].mean(dim=1, keepdim=True)], dim=1)
        enc = self.encoder_embedding(x)
        for layer in self.encoder:
            enc = layer(enc)
        enc = self.encoder_norm(enc)
        dec = self.decoder_embedding(seasonal_init)
        dec, trend1 = self.decompose_decoder(dec + self.self_attention(dec, dec))
        dec, trend2 = self.decompose_decoder(dec + self.cross_attention(dec, enc))
        dec, trend3 = self.decompose_decoder(dec + self.feed_forward(dec))
        residual_trend = self.trend_projection((trend1 + trend2 + trend3).transpose(1, 2)).transpose(1, 2)
        level = (trend_init + residual_trend)[:, -1, 0]
        return gaussian_output(self.head, self.decoder_norm(dec)[:, -1], level, self.cfg.sigma_min)


def fit_with_predictor(
    model_factory: Callable[[PredictorConfig], nn.Module], series: PreparedSeries, config: PicRLConfig
) -> PicRLProvisioner:
    """Phase 1 with ``model_factory`` (same NLL, windows and early stopping as the LSTM), then
    Phase 2 pretraining with it and Phase 3: PIC-RL with only the predictor substituted. A transformer reads
    a window, so the substitution is for the windowed LSTM (``predictor.kind = "windowed"``)."""
    return PicRLProvisioner.from_artifact(
        train_offline(series, with_windowed_predictor(config), model_factory=model_factory)
    )
