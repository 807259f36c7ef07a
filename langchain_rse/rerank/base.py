"""The reranker interface and its result, calibration of raw scores to relevance in [0, 1],
the offline rerankers (:class:`CompressorReranker` around any LangChain
``BaseDocumentCompressor``, :class:`EmbeddingReranker` by embedding cosine) and
:func:`as_reranker`."""

from __future__ import annotations

import asyncio
import logging
import math
import re
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, Literal, SupportsFloat, TypeVar, cast, get_args

import numpy as np
from langchain_core.callbacks import Callbacks
from langchain_core.documents import BaseDocumentCompressor, Document
from langchain_core.embeddings import Embeddings
from numpy.typing import ArrayLike, NDArray
from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "BaseReranker",
    "CalibratedReranker",
    "CalibrationMethod",
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

logger = logging.getLogger(__name__)


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

    strict: bool = False
    """Raise :class:`RerankError` from the retriever when reranking fails, instead of
    falling back to the fused ranking (with a warning and ``rerank_fallback: True``)."""

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


Output = TypeVar("Output")
"""What a wrapped model's call returns."""


class _WrappingReranker(CalibratedReranker, Generic[Output]):
    """A reranker around a LangChain model's sync and async call: no call for no documents,
    and the model's failures raised as :class:`RerankError`."""

    @abstractmethod
    def _call(self, query: str, documents: Sequence[Document], callbacks: Callbacks) -> Output: ...

    @abstractmethod
    async def _acall(
        self, query: str, documents: Sequence[Document], callbacks: Callbacks
    ) -> Output: ...

    @abstractmethod
    def _read(self, output: Output, n_documents: int) -> RerankResult: ...

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


_POSITION_KEY = "_langchain_rse_rerank_position"
"""Private metadata key that maps a compressor's outputs back to its inputs."""


def _score_of(document: Document) -> float | None:
    """A finite numeric ``relevance_score`` from ``document.metadata``, else ``None``."""
    value = document.metadata.get("relevance_score")
    if isinstance(value, bool):
        return None
    try:
        score = float(cast("SupportsFloat", value))  # anything: float() and the except decide
    except (TypeError, ValueError):
        return None
    return score if math.isfinite(score) else None


class CompressorReranker(_WrappingReranker[Sequence[Document]]):
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

    def _call(
        self, query: str, documents: Sequence[Document], callbacks: Callbacks
    ) -> Sequence[Document]:
        return self.compressor.compress_documents(
            self._tagged(documents), query, callbacks=callbacks
        )

    async def _acall(
        self, query: str, documents: Sequence[Document], callbacks: Callbacks
    ) -> Sequence[Document]:
        return await self.compressor.acompress_documents(
            self._tagged(documents), query, callbacks=callbacks
        )


def _cosines(query: Sequence[float], vectors: Sequence[Sequence[float]]) -> NDArray[np.float64]:
    q = np.asarray(query, dtype=np.float64)
    m = np.asarray(vectors, dtype=np.float64).reshape(len(vectors), q.size)
    norms = np.linalg.norm(m, axis=1) * np.linalg.norm(q)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = (m @ q) / norms
    return np.nan_to_num(out, nan=0.0)


class EmbeddingReranker(_WrappingReranker[tuple[list[float], list[list[float]]]]):
    """Rerank by cosine similarity between the query's and each candidate's embedding.

    An offline reranker: no API key, no network, any LangChain ``Embeddings``. It is weaker
    than a cross-encoder such as Cohere's: it re-scores with a bi-encoder, and with the
    retriever's own model it restores the dense order within the fused candidates. It gives
    RSE a relevance from similarity rather than from fused rank alone. The candidate texts are
    embedded at query time (``candidate_pool`` of them per query); wrap the model in
    LangChain's ``CacheBackedEmbeddings`` to embed each chunk once.

    Example:
        .. code-block:: python

            from langchain_rse import EmbeddingReranker, RSERetriever
            from langchain_rse.embeddings import LocalEmbeddings

            retriever = RSERetriever(
                reranker=EmbeddingReranker(embeddings=LocalEmbeddings()), rse_params="reranked"
            )

    The default calibration is ``"minmax"`` over the candidates times a rank decay of 20
    (``exp(-rank / 20)``): on the CUAD dev split it did as well as the best absolute (sigmoid)
    calibration and, unlike one, it does not depend on where a model's cosines sit (the
    bundled multilingual-e5-small crowds them between 0.75 and 0.92; other models spread them
    elsewhere). For an absolute scale, set ``calibration="sigmoid"`` with ``sigmoid_center``
    near the cosine of a typical relevant chunk (0.84 for e5-small) and
    ``sigmoid_temperature=0.02``. See ``benchmarks/RESULTS.md``; pair it with
    ``rse_params="reranked"``.

    **Abstaining on off-topic questions.** Min-max is relative: the least bad candidate of any
    question gets relevance 1, so RSE always returns a segment ("a recipe for lasagna" asked of
    contracts gets a contract clause). The absolute sigmoid lets RSE's ``min_segment_value`` reject
    them: with the bundled e5-small, ``calibration="sigmoid", sigmoid_center=0.84,
    sigmoid_temperature=0.02`` and ``rse_params="reranked"`` returned nothing for 48 of 50 off-topic
    questions on the CUAD dev contracts with the same recall@4k on the real questions (43.2%;
    precision 4.58% vs 4.68%; ``benchmarks/bench_quality.py --offtopic``), with 600-character
    chunks; with the default 300-character chunks, whose cosines run a little higher,
    ``sigmoid_temperature=0.01`` keeps it (46 of 50, recall@4k 0.2 points lower). It is not the
    default because the centre belongs to the model: with a model whose cosines sit lower, the same
    centre would return nothing for every question. Chunk mode (``mode="chunks"``) never abstains:
    it returns the top ``k`` whatever their relevance.
    """

    embeddings: Embeddings
    """The model that embeds the query and the candidates."""
    calibration: Literal["auto", "beta", "identity", "minmax", "sigmoid"] = "minmax"
    rank_decay: float | None = Field(default=20.0, gt=0)

    def _call(
        self, query: str, documents: Sequence[Document], callbacks: Callbacks
    ) -> tuple[list[float], list[list[float]]]:
        texts = [d.page_content for d in documents]
        return self.embeddings.embed_query(query), self.embeddings.embed_documents(texts)

    async def _acall(
        self, query: str, documents: Sequence[Document], callbacks: Callbacks
    ) -> tuple[list[float], list[list[float]]]:
        texts = [d.page_content for d in documents]
        query_vector = await self.embeddings.aembed_query(query)
        return query_vector, await self.embeddings.aembed_documents(texts)

    def _read(self, output: tuple[list[float], list[list[float]]], n: int) -> RerankResult:
        cos = _cosines(*output)
        order = sorted(range(cos.size), key=lambda i: -cos[i])
        return self._result(order, [float(cos[i]) for i in order])

    def _failure(self, exc: BaseException, n_documents: int) -> RerankError:
        return RerankError(
            f"{type(self.embeddings).__name__} failed to embed the query or {n_documents} "
            f"candidates: {type(exc).__name__}: {exc}"
        )


def as_reranker(value: object) -> BaseReranker | None:
    """``value`` as a :class:`BaseReranker`: ``None`` and rerankers pass through, a LangChain
    ``BaseDocumentCompressor`` is wrapped in a :class:`CompressorReranker`.

    Raises ``TypeError`` for anything else.
    """
    if value is None or isinstance(value, BaseReranker):
        return value
    if isinstance(value, BaseDocumentCompressor):
        return CompressorReranker(compressor=value)
    raise TypeError(
        "A reranker must be a langchain_rse BaseReranker, a LangChain BaseDocumentCompressor "
        f"or None, got {type(value).__module__}.{type(value).__qualname__}"
    )
