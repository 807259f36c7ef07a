"""Query-time reranking of fused candidates, and calibration of scores to relevance in [0, 1].

Rerankers: :class:`CohereReranker` (Cohere's ``/v2/rerank``), :class:`CompressorReranker` (any
LangChain ``BaseDocumentCompressor``) and :class:`EmbeddingReranker` (embedding cosine,
offline); :func:`as_reranker` accepts any of them, a compressor, or ``None``.
"""

from langchain_rse.rerank.base import (
    BaseReranker,
    CalibratedReranker,
    CalibrationMethod,
    CompressorReranker,
    EmbeddingReranker,
    RerankError,
    RerankResult,
    apply_rank_decay,
    as_reranker,
    beta_cdf,
    calibrate,
    default_calibration,
)
from langchain_rse.rerank.cohere import CohereReranker

__all__ = [
    "BaseReranker",
    "CalibratedReranker",
    "CalibrationMethod",
    "CohereReranker",
    "CompressorReranker",
    "EmbeddingReranker",
    "RerankError",
    "RerankResult",
    "apply_rank_decay",
    "as_reranker",
    "beta_cdf",
    "calibrate",
    "default_calibration",
]
