"""Any LangChain ``BaseDocumentCompressor`` (``CohereRerank``, ``CrossEncoderReranker``, ...)
as a reranker."""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any

from langchain_core.callbacks import Callbacks
from langchain_core.documents import BaseDocumentCompressor, Document

from langchain_rse.rerank.base import RerankError, RerankResult, _WrappingReranker

__all__ = ["CompressorReranker"]

logger = logging.getLogger(__name__)

_POSITION_KEY = "_langchain_rse_rerank_position"
"""Private metadata key that maps a compressor's outputs back to its inputs."""


def _score_of(document: Document) -> float | None:
    """A finite numeric ``relevance_score`` from ``document.metadata``, else ``None``."""
    value: Any = document.metadata.get("relevance_score")
    if isinstance(value, bool):
        return None
    try:
        score = float(value)
    except (TypeError, ValueError):
        return None
    return score if math.isfinite(score) else None


class CompressorReranker(_WrappingReranker):
    """Use any LangChain ``BaseDocumentCompressor`` as a reranker.

    Example:
        .. code-block:: python

            from langchain_cohere import CohereRerank
            from langchain_rse.rerank import CompressorReranker

            reranker = CompressorReranker(compressor=CohereRerank(model="rerank-v3.5"))

    The inputs are copied and tagged with their position under a private metadata key (the
    caller's documents are never mutated), so outputs are mapped back by position, never by
    text. Scores are read from the outputs' ``metadata["relevance_score"]`` and the outputs
    are ordered by it. When any output lacks a numeric score, the compressor's output order is
    used instead: the output at rank ``r`` gets the score ``1 - r / n_inputs``, taken as the
    relevance without calibration (the rank decay still applies).

    ``calibration="auto"`` uses the compressor's ``model`` attribute when it has one (so
    ``CohereRerank`` gets ``"beta"``), else ``"identity"``; set ``"sigmoid"`` for compressors
    that emit logits.
    """

    compressor: BaseDocumentCompressor
    """The wrapped compressor; it must keep each document's metadata on its outputs."""

    def _model_name(self) -> str | None:
        model = getattr(self.compressor, "model", None)
        return model if isinstance(model, str) else None

    @property
    def _name(self) -> str:
        return type(self.compressor).__name__

    @staticmethod
    def _tagged(documents: Sequence[Document]) -> list[Document]:
        return [
            doc.model_copy(update={"metadata": {**doc.metadata, _POSITION_KEY: position}})
            for position, doc in enumerate(documents)
        ]

    def _failure(self, exc: BaseException, n_documents: int) -> RerankError:
        return RerankError(
            f"{self._name} failed to rerank {n_documents} documents: {type(exc).__name__}: {exc}"
        )

    def _read(self, outputs: Sequence[Document], n_documents: int) -> RerankResult:
        found: dict[int, float | None] = {}  # input position -> score, in output order
        for doc in outputs:
            metadata = getattr(doc, "metadata", None)
            position = metadata.get(_POSITION_KEY) if isinstance(metadata, Mapping) else None
            if type(position) is int and 0 <= position < n_documents and position not in found:
                found[position] = _score_of(doc)
        positions = list(found)
        skipped = len(outputs) - len(positions)
        if skipped and not positions:
            raise RerankError(
                f"{self._name} returned {skipped} document(s) without the metadata of its "
                "inputs, so they cannot be mapped back to the candidates"
            )
        if skipped:
            logger.warning(
                "%s returned %d document(s) that cannot be mapped back to the candidates; ignored",
                self._name,
                skipped,
            )
        scores = [s for s in found.values() if s is not None]
        if len(scores) == len(positions):
            order = sorted(range(len(positions)), key=lambda i: -scores[i])
            return self._result([positions[i] for i in order], [scores[i] for i in order])
        rank_scores = [1.0 - rank / n_documents for rank in range(len(positions))]
        return self._result(positions, rank_scores, calibrated=False)

    def _call(self, query: str, documents: Sequence[Document], callbacks: Callbacks) -> Any:
        return self.compressor.compress_documents(
            self._tagged(documents), query, callbacks=callbacks
        )

    async def _acall(self, query: str, documents: Sequence[Document], callbacks: Callbacks) -> Any:
        return await self.compressor.acompress_documents(
            self._tagged(documents), query, callbacks=callbacks
        )
