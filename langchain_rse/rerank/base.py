"""The reranker interface, its result, calibrated scoring, and :func:`as_reranker`."""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from langchain_core.callbacks import Callbacks
from langchain_core.documents import BaseDocumentCompressor, Document
from pydantic import BaseModel, ConfigDict, Field

from langchain_rse.rerank.calibration import (
    CalibrationMethod,
    apply_rank_decay,
    calibrate,
    default_calibration,
)

__all__ = ["BaseReranker", "CalibratedReranker", "RerankError", "RerankResult", "as_reranker"]


class RerankError(RuntimeError):
    """The reranker failed after its retries; the retriever falls back or raises (strict)."""


@dataclass(frozen=True)
class RerankResult:
    """Reranked candidates, best first, identified by their position in the input."""

    indices: list[int]
    """Positions into the input documents, best first (may omit some inputs)."""
    scores: list[float]
    """The reranker's raw scores, aligned with ``indices``."""
    relevance: list[float]
    """Calibrated relevance in [0, 1] for RSE, aligned with ``indices``."""


class BaseReranker(ABC):
    """Scores candidate chunks against a query."""

    @abstractmethod
    def rerank(
        self, query: str, documents: Sequence[Document], *, callbacks: Callbacks = None
    ) -> RerankResult:
        """Rerank ``documents`` (their ``page_content`` is the enriched chunk text).

        Raises :class:`RerankError` when the reranker cannot answer.
        """

    async def arerank(
        self, query: str, documents: Sequence[Document], *, callbacks: Callbacks = None
    ) -> RerankResult:
        """Async :meth:`rerank`; the default runs it in a thread."""
        return await asyncio.to_thread(self.rerank, query, documents, callbacks=callbacks)


class CalibratedReranker(BaseReranker, BaseModel):
    """Base for rerankers that turn raw scores into relevance with a configurable calibration."""

    model_config = ConfigDict(populate_by_name=True, arbitrary_types_allowed=True)

    calibration: Literal["auto", "beta", "identity", "minmax", "sigmoid"] = "auto"
    """How raw scores become relevance (see :func:`calibrate`); ``"auto"`` picks the model's
    default (:func:`default_calibration`)."""
    beta_a: float = Field(default=0.4, gt=0)
    """First shape parameter of the ``"beta"`` calibration."""
    beta_b: float = Field(default=0.4, gt=0)
    """Second shape parameter of the ``"beta"`` calibration."""
    sigmoid_center: float = 0.0
    """Score that maps to 0.5 under the ``"sigmoid"`` calibration."""
    sigmoid_temperature: float = Field(default=1.0, gt=0)
    """Score scale of the ``"sigmoid"`` calibration (larger = flatter)."""
    rank_decay: float | None = Field(default=None, gt=0)
    """If set, relevance = calibrated score × ``exp(-rank / rank_decay)`` (rank 0 = best)."""

    def _model_name(self) -> str | None:
        """The model whose default calibration ``"auto"`` resolves to."""
        return None

    @property
    def calibration_method(self) -> CalibrationMethod:
        """The calibration actually applied (``"auto"`` resolved)."""
        if self.calibration == "auto":
            return default_calibration(self._model_name())
        return self.calibration

    def relevance(self, scores: Sequence[float]) -> list[float]:
        """Calibrated relevance for raw ``scores`` ordered best first (rank decay included)."""
        calibrated = calibrate(
            scores,
            self.calibration_method,
            beta_a=self.beta_a,
            beta_b=self.beta_b,
            sigmoid_center=self.sigmoid_center,
            sigmoid_temperature=self.sigmoid_temperature,
        )
        return [float(v) for v in apply_rank_decay(calibrated, self.rank_decay)]

    def _result(
        self, indices: list[int], scores: list[float], *, calibrated: bool = True
    ) -> RerankResult:
        """Package a best-first ranking; ``calibrated=False`` keeps ``scores`` (already in
        [0, 1]) as relevance apart from the rank decay."""
        if calibrated:
            relevance = self.relevance(scores)
        else:
            relevance = [float(v) for v in apply_rank_decay(scores, self.rank_decay)]
        return RerankResult(indices=indices, scores=scores, relevance=relevance)


class _WrappingReranker(CalibratedReranker):
    """A reranker around a LangChain model's sync and async call: no call for no documents,
    and the model's failures raised as :class:`RerankError`."""

    @abstractmethod
    def _call(self, query: str, documents: Sequence[Document], callbacks: Callbacks) -> Any: ...

    @abstractmethod
    async def _acall(
        self, query: str, documents: Sequence[Document], callbacks: Callbacks
    ) -> Any: ...

    @abstractmethod
    def _read(self, output: Any, n_documents: int) -> RerankResult: ...

    @abstractmethod
    def _failure(self, exc: BaseException, n_documents: int) -> RerankError: ...

    def rerank(
        self, query: str, documents: Sequence[Document], *, callbacks: Callbacks = None
    ) -> RerankResult:
        """Rerank ``documents`` against ``query`` with the wrapped model."""
        if not documents:
            return RerankResult([], [], [])
        try:
            output = self._call(query, documents, callbacks)
        except Exception as exc:
            raise self._failure(exc, len(documents)) from exc
        return self._read(output, len(documents))

    async def arerank(
        self, query: str, documents: Sequence[Document], *, callbacks: Callbacks = None
    ) -> RerankResult:
        """Async :meth:`rerank` with the model's native async call."""
        if not documents:
            return RerankResult([], [], [])
        try:
            output = await self._acall(query, documents, callbacks)
        except Exception as exc:
            raise self._failure(exc, len(documents)) from exc
        return self._read(output, len(documents))


def as_reranker(value: object) -> BaseReranker | None:
    """``value`` as a :class:`BaseReranker`: ``None`` and rerankers pass through, a LangChain
    ``BaseDocumentCompressor`` is wrapped in a
    :class:`~langchain_rse.rerank.compressor.CompressorReranker`.

    Raises ``TypeError`` for anything else.
    """
    if value is None or isinstance(value, BaseReranker):
        return value
    if isinstance(value, BaseDocumentCompressor):
        from langchain_rse.rerank.compressor import CompressorReranker

        return CompressorReranker(compressor=value)
    raise TypeError(
        "A reranker must be a langchain_rse BaseReranker, a LangChain BaseDocumentCompressor "
        f"or None, got {type(value).__module__}.{type(value).__qualname__}"
    )
