"""Phase 1 (Sec. 3.1): the Gaussian LSTM demand predictor, in two kinds (``predictor.kind``).

- :mod:`~picrl_core.predictor.model`: the network, its NLL (Eq. 3), input checks and what both kinds share;
- :mod:`~picrl_core.predictor.windowed` and :mod:`~picrl_core.predictor.incremental`: the two kinds;
- :mod:`~picrl_core.predictor.kinds`: the one place that chooses between them;
- :mod:`~picrl_core.predictor.train`: Phase 1 training.
"""
