"""Query-time reranking of fused candidates, and calibration of scores to relevance.

Two rerankers are provided:

- :class:`CohereReranker` calls Cohere's ``/v2/rerank`` endpoint through the ``cohere`` SDK
  (``ClientV2`` for sync calls, ``AsyncClientV2`` for native async calls). It splits large
  candidate lists into several requests, retries transient failures with exponential backoff
  and jitter (honouring ``Retry-After``), and never runs past its per-query ``timeout``.
- :class:`CompressorReranker` adapts any LangChain ``BaseDocumentCompressor`` (for example
  ``langchain_cohere.CohereRerank`` or ``CrossEncoderReranker``).
- :class:`EmbeddingReranker` scores candidates by the cosine similarity of their embeddings to
  the query's, with any LangChain ``Embeddings``: an offline stand-in that gives RSE a
  relevance that means the same thing from query to query (used to tune RSE on CUAD offline).

Both turn raw scores into a calibrated relevance in ``[0, 1]`` for Relevant Segment Extraction
(see :func:`calibrate`), optionally combined with a rank decay.
"""

from __future__ import annotations

import asyncio
import email.utils
import logging
import math
import random
import re
import time
import weakref
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any, Literal, get_args

import httpx
import numpy as np
from langchain_core.callbacks import Callbacks
from langchain_core.documents import BaseDocumentCompressor, Document
from langchain_core.embeddings import Embeddings
from langchain_core.utils import from_env, secret_from_env
from numpy.typing import ArrayLike, NDArray
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, SecretStr, model_validator
from scipy.special import betainc, expit
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    Retrying,
    retry_if_exception,
)

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

logger = logging.getLogger(__name__)

CalibrationMethod = Literal["beta", "identity", "minmax", "sigmoid"]
"""How raw reranker scores become relevance in [0, 1] (see :func:`calibrate`)."""

_CALIBRATION_METHODS: tuple[str, ...] = get_args(CalibrationMethod)
_COHERE_DEFAULT_BASE_URL = "https://api.cohere.com"
_COHERE_MAX_DOCUMENTS = 1000
_POSITION_KEY = "_langchain_rse_rerank_position"
"""Private metadata key that :class:`CompressorReranker` uses to map outputs back to inputs."""
_MISSING_KEY = (
    "No Cohere API key found: pass api_key=... to CohereReranker, or set the "
    "COHERE_API_KEY (or CO_API_KEY) environment variable."
)
_DEADLINE_GRACE_S = 0.25
"""Extra wait for a worker to report its own (more precise) error once the deadline passed."""


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
        import asyncio

        return await asyncio.to_thread(self.rerank, query, documents, callbacks=callbacks)


# --------------------------------------------------------------------------------------------
# Calibration: pure functions
# --------------------------------------------------------------------------------------------


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
    return np.asarray(betainc(a, b, values), dtype=np.float64)


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
        finite = x[np.isfinite(x)]
        if finite.size == 0:
            out = np.full_like(x, 0.5)
        else:
            low, high = float(finite.min()), float(finite.max())
            if high > low:
                out = np.clip((x - low) / (high - low), 0.0, 1.0)
            else:
                out = np.full_like(x, 0.5)
    elif method == "sigmoid":
        if sigmoid_temperature <= 0:
            raise ValueError(f"sigmoid_temperature must be positive, got {sigmoid_temperature}")
        out = np.asarray(expit((x - sigmoid_center) / sigmoid_temperature), dtype=np.float64)
    else:
        raise ValueError(
            f"Unknown calibration method {method!r}; expected one of {_CALIBRATION_METHODS}"
        )
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


_COHERE_RERANK_MODEL = re.compile(r"(^|[/.:])rerank-", re.IGNORECASE)


def default_calibration(model: str | None) -> CalibrationMethod:
    """The calibration used when a reranker's ``calibration`` is ``"auto"``.

    Cohere rerank models (``rerank-v3.5``, ``rerank-english-v3.0``, also behind a provider
    prefix such as ``cohere.rerank-v3-5:0``) get ``"beta"``; anything else ``"identity"``.
    """
    if model and _COHERE_RERANK_MODEL.search(model):
        return "beta"
    return "identity"


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


# --------------------------------------------------------------------------------------------
# Cohere
# --------------------------------------------------------------------------------------------


class _DeadlineExceeded(Exception):
    """No time is left in the per-query budget for another request."""


class _MalformedResponse(Exception):
    """The server answered 2xx with a body that is not a valid rerank response."""


@dataclass(frozen=True)
class _Deadline:
    """A point on the monotonic clock by which a query must finish."""

    end: float

    @classmethod
    def after(cls, seconds: float) -> _Deadline:
        return cls(time.monotonic() + seconds)

    def remaining(self) -> float:
        return max(0.0, self.end - time.monotonic())


def _status_code(exc: BaseException) -> int | None:
    """The HTTP status of a cohere ``ApiError`` (or anything shaped like one)."""
    code = getattr(exc, "status_code", None)
    return code if isinstance(code, int) else None


def _is_transient(exc: BaseException) -> bool:
    """Whether a failed rerank request is worth retrying."""
    if isinstance(exc, (httpx.TimeoutException, httpx.NetworkError, httpx.RemoteProtocolError)):
        return True
    if isinstance(exc, (_DeadlineExceeded, _MalformedResponse)):
        return False
    code = _status_code(exc)
    if code is None or type(exc).__name__ == "ParsingError":
        return False
    return code == 429 or (code >= 500 and code != 501)


def _retry_after(exc: BaseException | None) -> float | None:
    """Seconds the server asked us to wait (``Retry-After`` / ``Retry-After-Ms``), if any."""
    headers = getattr(exc, "headers", None)
    if not isinstance(headers, Mapping):
        return None
    lowered = {str(k).lower(): str(v).strip() for k, v in headers.items()}
    seconds: float | None = None
    if "retry-after-ms" in lowered:
        try:
            seconds = float(lowered["retry-after-ms"]) / 1000.0
        except ValueError:
            seconds = None
    if seconds is None and "retry-after" in lowered:
        value = lowered["retry-after"]
        try:
            seconds = float(value)
        except ValueError:
            try:
                seconds = email.utils.parsedate_to_datetime(value).timestamp() - time.time()
            except (TypeError, ValueError, IndexError):
                seconds = None
    if seconds is None or not math.isfinite(seconds):
        return None
    return max(0.0, seconds)


def _field(item: Any, name: str) -> Any:
    """``item.name`` or ``item[name]``."""
    if isinstance(item, Mapping):
        return item.get(name)
    return getattr(item, name, None)


def _read_results(response: Any, n_documents: int, offset: int) -> list[tuple[int, float]]:
    """``(input position, score)`` pairs from a rerank response for one batch, validated."""
    results = _field(response, "results")
    if not isinstance(results, list):
        raise _MalformedResponse("the response has no 'results' list")
    seen: set[int] = set()
    pairs: list[tuple[int, float]] = []
    for item in results:
        index = _field(item, "index")
        score = _field(item, "relevance_score")
        if (
            isinstance(index, bool)
            or not isinstance(index, int)
            or not 0 <= index < n_documents
            or index in seen
        ):
            raise _MalformedResponse(
                f"invalid or repeated result index {index!r} for {n_documents} documents"
            )
        if isinstance(score, bool) or not isinstance(score, (int, float)):
            raise _MalformedResponse(f"invalid relevance_score {score!r} for index {index}")
        if not math.isfinite(score):
            raise _MalformedResponse(f"non-finite relevance_score for index {index}")
        seen.add(index)
        pairs.append((offset + index, float(score)))
    return pairs


def _describe(exc: BaseException, timeout: float) -> str:
    """A one-line, key-free description of why a request failed."""
    if isinstance(exc, _DeadlineExceeded):
        return f"the per-query timeout of {timeout:g}s ran out"
    if isinstance(exc, _MalformedResponse):
        return f"malformed rerank response: {exc}"
    if isinstance(exc, httpx.TimeoutException):
        return f"request timed out ({type(exc).__name__})"
    if isinstance(exc, httpx.TransportError):
        return f"connection error ({type(exc).__name__}: {exc})"
    code = _status_code(exc)
    if code is not None:
        body = getattr(exc, "body", None)
        excerpt = repr(body)
        if len(excerpt) > 200:
            excerpt = excerpt[:200] + "..."
        if type(exc).__name__ == "ParsingError" or 200 <= code < 300:
            return f"unreadable response body (HTTP {code}): {excerpt}"
        return f"HTTP {code} ({type(exc).__name__}): {excerpt}"
    return f"unexpected error handling the request or its response: {type(exc).__name__}: {exc}"


class CohereReranker(CalibratedReranker):
    """Rerank candidates with Cohere's rerank API (``/v2/rerank``).

    Example:
        .. code-block:: python

            from langchain_rse import RSERetriever
            from langchain_rse.rerank import CohereReranker

            reranker = CohereReranker(model="rerank-v3.5", timeout=10)  # key from COHERE_API_KEY
            retriever = RSERetriever(vectorstore=vs, reranker=reranker)

    Every call has a deadline of ``timeout`` seconds in total: each HTTP attempt gets only the
    time left, the SDK's own retries are disabled, backoff sleeps that would cross the deadline
    are not taken (the call fails at once instead), and the caller stops waiting at the
    deadline whatever the network does. Failures raise :class:`RerankError`.
    """

    model: str = "rerank-v3.5"
    """Cohere rerank model name."""
    cohere_api_key: SecretStr | None = Field(
        alias="api_key",
        default_factory=secret_from_env(["COHERE_API_KEY", "CO_API_KEY"], default=None),
    )
    """API key; read from ``COHERE_API_KEY`` or ``CO_API_KEY`` if not passed."""
    base_url: str = Field(default_factory=from_env("CO_API_URL", default=_COHERE_DEFAULT_BASE_URL))
    """API root (``CO_API_URL`` or Cohere's); the SDK appends ``/v2/rerank``."""
    timeout: float = Field(default=30.0, gt=0)
    """Deadline in seconds for one :meth:`rerank` call, across all requests and retries."""
    max_retries: int = Field(default=3, ge=0)
    """Retries per request after the first attempt, on 429, 5xx, timeouts, connection errors."""
    backoff_base: float = Field(default=0.5, gt=0)
    """Backoff step in seconds before the first retry; doubles on each retry. The actual
    sleep is drawn uniformly between half and all of the step (jitter)."""
    backoff_max: float = Field(default=8.0, gt=0)
    """Largest backoff step in seconds (a server's ``Retry-After`` is honoured as is, unless
    it would cross the deadline, in which case the call fails at once)."""
    top_n: int | None = Field(default=None, ge=1)
    """Return only the best ``top_n`` candidates; ``None`` returns all."""
    max_tokens_per_doc: int | None = Field(default=None, ge=1)
    """Truncate each candidate to this many tokens server-side (``None``: Cohere's default)."""
    max_documents_per_request: int = Field(default=_COHERE_MAX_DOCUMENTS, ge=1)
    """More candidates than this are split into several requests and merged by score."""
    max_concurrent_requests: int = Field(default=4, ge=1)
    """How many of those requests run at once."""
    client_name: str | None = "langchain-rse"
    """Sent as ``X-Client-Name``."""
    client: Any = Field(default=None, repr=False, exclude=True)
    """Optional ready ``cohere.ClientV2`` (otherwise built from the fields above)."""
    async_client: Any = Field(default=None, repr=False, exclude=True)
    """Optional ready ``cohere.AsyncClientV2`` (otherwise built per event loop)."""

    _sync_client: Any = PrivateAttr(default=None)
    _async_clients: Any = PrivateAttr(default_factory=weakref.WeakKeyDictionary)

    @model_validator(mode="after")
    def _require_key(self) -> CohereReranker:
        if self.cohere_api_key is None and self.client is None and self.async_client is None:
            raise ValueError(_MISSING_KEY)
        return self

    def _model_name(self) -> str | None:
        return self.model

    # -- clients -----------------------------------------------------------------------------

    def _client_kwargs(self) -> dict[str, Any]:
        if self.cohere_api_key is None:
            raise ValueError(_MISSING_KEY)
        return {
            "api_key": self.cohere_api_key.get_secret_value(),
            "base_url": self.base_url,
            "client_name": self.client_name,
            "timeout": self.timeout,
            "max_retries": 0,
        }

    def _get_client(self) -> Any:
        """The sync ``cohere.ClientV2`` (built once)."""
        if self.client is not None:
            return self.client
        if self._sync_client is None:
            cohere = _import_cohere()
            self._sync_client = cohere.ClientV2(**self._client_kwargs())
        return self._sync_client

    def _get_async_client(self) -> Any:
        """The ``cohere.AsyncClientV2`` for the running event loop (httpx pools are per loop)."""
        if self.async_client is not None:
            return self.async_client
        loop = asyncio.get_running_loop()
        client = self._async_clients.get(loop)
        if client is None:
            cohere = _import_cohere()
            client = cohere.AsyncClientV2(**self._client_kwargs())
            self._async_clients[loop] = client
        return client

    # -- requests ----------------------------------------------------------------------------

    def _batches(self, n_documents: int) -> list[tuple[int, int]]:
        size = self.max_documents_per_request
        return [(start, min(start + size, n_documents)) for start in range(0, n_documents, size)]

    def _request_kwargs(
        self, query: str, texts: Sequence[str], deadline: _Deadline
    ) -> dict[str, Any]:
        remaining = deadline.remaining()
        if remaining <= 0:
            raise _DeadlineExceeded()
        kwargs: dict[str, Any] = {
            "model": self.model,
            "query": query,
            "documents": list(texts),
            "request_options": {"timeout": remaining, "max_retries": 0},
        }
        if self.top_n is not None:
            kwargs["top_n"] = min(self.top_n, len(texts))
        if self.max_tokens_per_doc is not None:
            kwargs["max_tokens_per_doc"] = self.max_tokens_per_doc
        return kwargs

    def _retry_policy(self, deadline: _Deadline) -> dict[str, Any]:
        """Keyword arguments for tenacity's ``Retrying`` / ``AsyncRetrying``."""

        def backoff(attempt: int) -> float:
            # "Equal jitter": between half and all of the capped exponential step.
            step = min(self.backoff_max, self.backoff_base * 2.0 ** (attempt - 1))
            return step / 2.0 + random.uniform(0.0, step / 2.0)

        def wait_for(state: RetryCallState) -> float:
            error = state.outcome.exception() if state.outcome is not None else None
            server_wait = _retry_after(error)
            return server_wait if server_wait is not None else backoff(state.attempt_number)

        def stop(state: RetryCallState) -> bool:
            # The wait is computed first; give up rather than sleep into the deadline.
            return (
                state.attempt_number > self.max_retries
                or state.upcoming_sleep >= deadline.remaining()
            )

        def log_retry(state: RetryCallState) -> None:
            error = state.outcome.exception() if state.outcome is not None else None
            logger.warning(
                "Cohere rerank attempt %d failed (%s); retrying in %.2fs",
                state.attempt_number,
                self._redact(_describe(error, self.timeout))
                if error is not None
                else "unknown error",
                state.upcoming_sleep,
            )

        return {
            "retry": retry_if_exception(_is_transient),
            "wait": wait_for,
            "stop": stop,
            "before_sleep": log_retry,
            "reraise": True,
        }

    def _redact(self, text: str) -> str:
        """Remove the API key from error text (a proxy may echo the request's headers)."""
        key = self.cohere_api_key.get_secret_value() if self.cohere_api_key else ""
        return text.replace(key, "***") if key else text

    def _failure(self, exc: BaseException, attempts: int) -> RerankError:
        return RerankError(
            f"Cohere rerank (model {self.model!r}, {self.base_url}) failed after "
            f"{attempts} attempt(s) within a {self.timeout:g}s timeout: "
            f"{self._redact(_describe(exc, self.timeout))}"
        )

    def _timed_out(self) -> RerankError:
        return RerankError(
            f"Cohere rerank (model {self.model!r}, {self.base_url}) did not finish within its "
            f"{self.timeout:g}s timeout"
        )

    def _request_batch(
        self, client: Any, query: str, texts: Sequence[str], offset: int, deadline: _Deadline
    ) -> list[tuple[int, float]]:
        """One batch, with retries; ``(input position, score)`` pairs."""
        attempts = 0
        pairs: list[tuple[int, float]] = []
        try:
            for attempt in Retrying(**self._retry_policy(deadline)):
                with attempt:
                    attempts += 1
                    response = client.rerank(**self._request_kwargs(query, texts, deadline))
                    pairs = _read_results(response, len(texts), offset)
        except Exception as exc:
            raise self._failure(exc, attempts) from exc
        return pairs

    async def _arequest_batch(
        self, client: Any, query: str, texts: Sequence[str], offset: int, deadline: _Deadline
    ) -> list[tuple[int, float]]:
        """Async :meth:`_request_batch`."""
        attempts = 0
        pairs: list[tuple[int, float]] = []
        try:
            async for attempt in AsyncRetrying(**self._retry_policy(deadline)):
                with attempt:
                    attempts += 1
                    response = await client.rerank(**self._request_kwargs(query, texts, deadline))
                    pairs = _read_results(response, len(texts), offset)
        except Exception as exc:
            raise self._failure(exc, attempts) from exc
        return pairs

    def _merge(self, pairs: list[tuple[int, float]]) -> RerankResult:
        """Merge batch results by score (ties: input order) and cut to ``top_n``."""
        ranked = sorted(pairs, key=lambda pair: (-pair[1], pair[0]))
        if self.top_n is not None:
            ranked = ranked[: self.top_n]
        return self._result([i for i, _ in ranked], [s for _, s in ranked])

    # -- public API --------------------------------------------------------------------------

    def rerank(
        self, query: str, documents: Sequence[Document], *, callbacks: Callbacks = None
    ) -> RerankResult:
        """Rerank ``documents`` against ``query`` with ``cohere.ClientV2``.

        ``callbacks`` is accepted for interface compatibility and not used.
        """
        if not documents:
            return RerankResult(indices=[], scores=[], relevance=[])
        texts = [doc.page_content for doc in documents]
        client = self._get_client()
        deadline = _Deadline.after(self.timeout)
        batches = self._batches(len(texts))
        executor = ThreadPoolExecutor(
            max_workers=min(len(batches), self.max_concurrent_requests),
            thread_name_prefix="langchain-rse-rerank",
        )
        try:
            futures: list[Future[list[tuple[int, float]]]] = [
                executor.submit(
                    self._request_batch, client, query, texts[start:stop], start, deadline
                )
                for start, stop in batches
            ]
            done, pending = wait(
                futures,
                timeout=deadline.remaining() + _DEADLINE_GRACE_S,
                return_when=FIRST_EXCEPTION,
            )
            for future in futures:
                error = future.exception() if future in done else None
                if error is not None:
                    raise error
            if pending:
                raise self._timed_out()
            return self._merge([pair for future in futures for pair in future.result()])
        finally:
            # Never block on a stuck worker: its own HTTP timeout ends it shortly.
            executor.shutdown(wait=False, cancel_futures=True)

    async def arerank(
        self, query: str, documents: Sequence[Document], *, callbacks: Callbacks = None
    ) -> RerankResult:
        """Rerank ``documents`` against ``query`` with ``cohere.AsyncClientV2`` (native async)."""
        if not documents:
            return RerankResult(indices=[], scores=[], relevance=[])
        texts = [doc.page_content for doc in documents]
        client = self._get_async_client()
        deadline = _Deadline.after(self.timeout)
        limit = asyncio.Semaphore(self.max_concurrent_requests)

        async def run(start: int, stop: int) -> list[tuple[int, float]]:
            async with limit:
                return await self._arequest_batch(client, query, texts[start:stop], start, deadline)

        tasks = [
            asyncio.ensure_future(run(start, stop)) for start, stop in self._batches(len(texts))
        ]
        try:
            done, pending = await asyncio.wait(
                tasks,
                timeout=deadline.remaining() + _DEADLINE_GRACE_S,
                return_when=asyncio.FIRST_EXCEPTION,
            )
        finally:
            unfinished = [task for task in tasks if not task.done()]
            for task in unfinished:
                task.cancel()
            if unfinished:
                await asyncio.gather(*unfinished, return_exceptions=True)
        errors = [task.exception() for task in tasks if task in done and not task.cancelled()]
        for error in errors:
            if error is not None:
                raise error
        if pending:
            raise self._timed_out()
        return self._merge([pair for task in tasks for pair in task.result()])


def _import_cohere() -> Any:
    try:
        import cohere
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError(
            "CohereReranker needs the cohere SDK: pip install 'langchain-rse[cohere]'"
        ) from exc
    return cohere


# --------------------------------------------------------------------------------------------
# Any LangChain document compressor
# --------------------------------------------------------------------------------------------


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


class CompressorReranker(CalibratedReranker):
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

    @staticmethod
    def _tagged(documents: Sequence[Document]) -> list[Document]:
        return [
            doc.model_copy(update={"metadata": {**doc.metadata, _POSITION_KEY: position}})
            for position, doc in enumerate(documents)
        ]

    def _describe_failure(self, exc: BaseException, n_documents: int) -> RerankError:
        return RerankError(
            f"{type(self.compressor).__name__} failed to rerank {n_documents} documents: "
            f"{type(exc).__name__}: {exc}"
        )

    def _read(self, outputs: Sequence[Document], n_documents: int) -> RerankResult:
        positions: list[int] = []
        seen: set[int] = set()
        raw: list[float | None] = []
        skipped = 0
        for doc in outputs:
            metadata = getattr(doc, "metadata", None)
            position = metadata.get(_POSITION_KEY) if isinstance(metadata, Mapping) else None
            if (
                isinstance(position, bool)
                or not isinstance(position, int)
                or not 0 <= position < n_documents
                or position in seen
            ):
                skipped += 1
                continue
            seen.add(position)
            positions.append(position)
            raw.append(_score_of(doc))
        if skipped and not positions:
            raise RerankError(
                f"{type(self.compressor).__name__} returned {skipped} document(s) without the "
                "metadata of its inputs, so they cannot be mapped back to the candidates"
            )
        if skipped:
            logger.warning(
                "%s returned %d document(s) that cannot be mapped back to the candidates; ignored",
                type(self.compressor).__name__,
                skipped,
            )
        scores = [s for s in raw if s is not None]
        if len(scores) == len(positions):
            order = sorted(range(len(positions)), key=lambda i: -scores[i])
            return self._result([positions[i] for i in order], [scores[i] for i in order])
        rank_scores = [1.0 - rank / n_documents for rank in range(len(positions))]
        return self._result(positions, rank_scores, calibrated=False)

    def rerank(
        self, query: str, documents: Sequence[Document], *, callbacks: Callbacks = None
    ) -> RerankResult:
        """Rerank with ``compressor.compress_documents``."""
        if not documents:
            return RerankResult(indices=[], scores=[], relevance=[])
        try:
            outputs = self.compressor.compress_documents(
                self._tagged(documents), query, callbacks=callbacks
            )
        except Exception as exc:
            raise self._describe_failure(exc, len(documents)) from exc
        return self._read(outputs, len(documents))

    async def arerank(
        self, query: str, documents: Sequence[Document], *, callbacks: Callbacks = None
    ) -> RerankResult:
        """Rerank with ``compressor.acompress_documents``."""
        if not documents:
            return RerankResult(indices=[], scores=[], relevance=[])
        try:
            outputs = await self.compressor.acompress_documents(
                self._tagged(documents), query, callbacks=callbacks
            )
        except Exception as exc:
            raise self._describe_failure(exc, len(documents)) from exc
        return self._read(outputs, len(documents))


# --------------------------------------------------------------------------------------------
# Offline: cosine similarity of embeddings
# --------------------------------------------------------------------------------------------


def _cosines(query: Sequence[float], vectors: Sequence[Sequence[float]]) -> NDArray[np.float64]:
    q = np.asarray(query, dtype=np.float64)
    m = np.asarray(vectors, dtype=np.float64).reshape(len(vectors), q.size)
    norms = np.linalg.norm(m, axis=1) * np.linalg.norm(q)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = (m @ q) / norms
    return np.nan_to_num(out, nan=0.0)


class EmbeddingReranker(CalibratedReranker):
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
                reranker=EmbeddingReranker(embeddings=LocalEmbeddings()), preset="reranked"
            )

    The default calibration is ``"minmax"`` over the candidates times a rank decay of 20
    (``exp(-rank / 20)``): on the CUAD dev split it did as well as the best absolute (sigmoid)
    calibration and, unlike one, it does not depend on where a model's cosines sit (the
    bundled multilingual-e5-small crowds them between 0.75 and 0.92; other models spread them
    elsewhere). For an absolute scale, set ``calibration="sigmoid"`` with ``sigmoid_center``
    near the cosine of a typical relevant chunk (0.84 for e5-small) and
    ``sigmoid_temperature=0.02``. See ``benchmarks/RESULTS.md``; pair it with
    ``preset="reranked"``.
    """

    embeddings: Embeddings
    """The model that embeds the query and the candidates."""
    calibration: Literal["auto", "beta", "identity", "minmax", "sigmoid"] = "minmax"
    rank_decay: float | None = Field(default=20.0, gt=0)

    def _ranked(self, query_vector: list[float], vectors: list[list[float]]) -> RerankResult:
        cos = _cosines(query_vector, vectors)
        order = sorted(range(cos.size), key=lambda i: -cos[i])
        return self._result(order, [float(cos[i]) for i in order])

    def _failure(self, exc: BaseException, n_documents: int) -> RerankError:
        return RerankError(
            f"{type(self.embeddings).__name__} failed to embed the query or {n_documents} "
            f"candidates: {type(exc).__name__}: {exc}"
        )

    def rerank(
        self, query: str, documents: Sequence[Document], *, callbacks: Callbacks = None
    ) -> RerankResult:
        """Rerank ``documents`` by the cosine of their embeddings to the query's."""
        if not documents:
            return RerankResult(indices=[], scores=[], relevance=[])
        try:
            query_vector = self.embeddings.embed_query(query)
            vectors = self.embeddings.embed_documents([d.page_content for d in documents])
        except Exception as exc:
            raise self._failure(exc, len(documents)) from exc
        return self._ranked(query_vector, vectors)

    async def arerank(
        self, query: str, documents: Sequence[Document], *, callbacks: Callbacks = None
    ) -> RerankResult:
        """Async :meth:`rerank` with the model's ``aembed_query`` / ``aembed_documents``."""
        if not documents:
            return RerankResult(indices=[], scores=[], relevance=[])
        try:
            query_vector = await self.embeddings.aembed_query(query)
            vectors = await self.embeddings.aembed_documents([d.page_content for d in documents])
        except Exception as exc:
            raise self._failure(exc, len(documents)) from exc
        return self._ranked(query_vector, vectors)


def as_reranker(
    reranker: BaseReranker | BaseDocumentCompressor | None,
) -> BaseReranker | None:
    """A :class:`BaseReranker` for ``reranker``: wraps a compressor, passes the rest through."""
    if reranker is None or isinstance(reranker, BaseReranker):
        return reranker
    if isinstance(reranker, BaseDocumentCompressor):
        return CompressorReranker(compressor=reranker)
    raise TypeError(
        f"Expected a BaseReranker, a BaseDocumentCompressor or None, got {type(reranker).__name__}"
    )
