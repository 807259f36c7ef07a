"""Calibration of raw reranker scores to relevance in [0, 1]: pure functions, no I/O."""

from __future__ import annotations

import re
from typing import Literal, get_args

import numpy as np
from numpy.typing import ArrayLike, NDArray

__all__ = ["CalibrationMethod", "apply_rank_decay", "beta_cdf", "calibrate", "default_calibration"]

CalibrationMethod = Literal["beta", "identity", "minmax", "sigmoid"]
"""How raw reranker scores become relevance in [0, 1] (see :func:`calibrate`)."""

_METHODS: tuple[str, ...] = get_args(CalibrationMethod)
_COHERE_RERANK_MODEL = re.compile(r"(^|[/.:])rerank-", re.IGNORECASE)


def beta_cdf(x: ArrayLike, a: float = 0.4, b: float = 0.4) -> NDArray[np.float64]:
    """The Beta(``a``, ``b``) cumulative distribution function of ``x`` clipped to [0, 1].

    It is increasing with ``0 → 0`` and ``1 → 1`` (and ``0.5 → 0.5`` whenever ``a == b``).
    With ``a = b < 1`` it is steep near 0 and 1 and flat in the middle, so it spreads apart
    scores that crowd near the ends, as Cohere's rerank scores do, and pulls middling scores
    towards 0.5 (with the default 0.4, 0.4: ``0.05 → 0.17``, ``0.2 → 0.32``, ``0.8 → 0.68``).
    """
    if a <= 0 or b <= 0:
        raise ValueError(f"Beta parameters must be positive, got a={a}, b={b}")
    values = np.clip(np.asarray(x, dtype=np.float64), 0.0, 1.0)
    from scipy.special import betainc  # scipy.special takes 0.2 s to import: on first use

    return np.asarray(betainc(a, b, values), dtype=np.float64)


def _minmax(x: NDArray[np.float64]) -> NDArray[np.float64]:
    finite = x[np.isfinite(x)]
    if finite.size == 0 or finite.max() <= finite.min():
        return np.full_like(x, 0.5)
    low, high = float(finite.min()), float(finite.max())
    return np.clip((x - low) / (high - low), 0.0, 1.0)


def calibrate(
    scores: ArrayLike,
    method: CalibrationMethod = "identity",
    *,
    beta_a: float = 0.4,
    beta_b: float = 0.4,
    sigmoid_center: float = 0.0,
    sigmoid_temperature: float = 1.0,
) -> NDArray[np.float64]:
    """Map raw reranker ``scores`` to relevance in [0, 1], element-wise and order-preserving.

    Methods:

    - ``"beta"``: :func:`beta_cdf` with ``beta_a``, ``beta_b`` (for scores already in [0, 1],
      such as Cohere's; the prior art uses Beta(0.4, 0.4)).
    - ``"identity"``: clip to [0, 1].
    - ``"minmax"``: rescale so the lowest score is 0 and the highest 1 (per call, so the values
      are relative to the candidates); when all scores are equal, every value is 0.5.
    - ``"sigmoid"``: ``1 / (1 + exp(-(score - sigmoid_center) / sigmoid_temperature))``, for
      unbounded scores such as cross-encoder logits.

    NaN scores become 0.
    """
    x = np.asarray(scores, dtype=np.float64)
    if method == "identity":
        out = np.clip(x, 0.0, 1.0)
    elif method == "beta":
        out = beta_cdf(x, beta_a, beta_b)
    elif method == "minmax":
        out = _minmax(x)
    elif method == "sigmoid":
        if sigmoid_temperature <= 0:
            raise ValueError(f"sigmoid_temperature must be positive, got {sigmoid_temperature}")
        from scipy.special import expit

        out = np.asarray(expit((x - sigmoid_center) / sigmoid_temperature), dtype=np.float64)
    else:
        raise ValueError(f"Unknown calibration method {method!r}; expected one of {_METHODS}")
    return np.nan_to_num(out, nan=0.0)


def apply_rank_decay(relevance: ArrayLike, decay: float | None) -> NDArray[np.float64]:
    """Multiply the relevance at rank ``r`` (0 = best) by ``exp(-r / decay)``.

    ``decay=None`` returns the relevance unchanged. ``relevance`` must be ordered best first.
    """
    values = np.asarray(relevance, dtype=np.float64)
    if decay is None:
        return values.copy()
    if decay <= 0:
        raise ValueError(f"rank decay must be positive, got {decay}")
    return values * np.exp(-np.arange(values.size, dtype=np.float64) / decay)


def default_calibration(model: str | None) -> CalibrationMethod:
    """The calibration used when a reranker's ``calibration`` is ``"auto"``.

    Cohere rerank models (``rerank-v3.5``, ``rerank-english-v3.0``, also behind a provider
    prefix such as ``cohere.rerank-v3-5:0``) get ``"beta"``; anything else ``"identity"``.
    """
    if model and _COHERE_RERANK_MODEL.search(model):
        return "beta"
    return "identity"
