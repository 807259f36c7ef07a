"""Cohere's rerank API (``/v2/rerank``) through the ``cohere`` SDK, within a per-query deadline.

The SDK sends each attempt with the time left as its HTTP timeout, but its own retries are
off: they cannot keep a deadline (they sleep whatever ``Retry-After`` asks, up to 60 s, after
a fixed 1 s backoff, and skip read timeouts). tenacity retries instead, by the package's one
retry classifier (:func:`langchain_rse.llm.is_transient`).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import os
import time
import weakref
from collections.abc import Awaitable, Mapping, Sequence
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar, cast

import httpx
import tenacity
from langchain_core.callbacks import Callbacks
from langchain_core.documents import Document
from langchain_core.utils import from_env, secret_from_env
from pydantic import Field, PrivateAttr, SecretStr, model_validator
from tenacity import AsyncRetrying, RetryCallState, Retrying

from langchain_rse.llm import UnusableReply, is_transient, retry_after
from langchain_rse.rerank.base import CalibratedReranker, RerankError, RerankResult

__all__ = ["CohereReranker"]

logger = logging.getLogger(__name__)

Batch = tuple[int, int]
"""``(start, stop)``: a slice of the candidates sent in one request."""
Pairs = list[tuple[int, float]]
"""``(input position, score)`` pairs."""


class DeadlineExceeded(UnusableReply):
    """No time is left before the per-query deadline for another request (not retried)."""

    retry = False


class MalformedResponse(UnusableReply):
    """The server answered 2xx with a body that is not a valid rerank response (not
    retried)."""

    retry = False


def _field(item: object, name: str) -> object:
    """``item.name`` or ``item[name]``."""
    return item.get(name) if isinstance(item, Mapping) else getattr(item, name, None)


def read_results(response: object, batch: Batch) -> Pairs:
    """The validated ``(input position, score)`` pairs of one batch's response."""
    results = _field(response, "results")
    if not isinstance(results, list):
        raise MalformedResponse("the response has no 'results' list")
    start, stop = batch
    pairs: dict[int, float] = {}
    for item in results:
        index, score = _field(item, "index"), _field(item, "relevance_score")
        if type(index) is not int or not 0 <= index < stop - start or start + index in pairs:
            raise MalformedResponse(
                f"invalid or repeated result index {index!r} for {stop - start} documents"
            )
        if type(score) not in (int, float) or not math.isfinite(cast("int | float", score)):
            raise MalformedResponse(f"invalid relevance_score {score!r} for index {index}")
        pairs[start + index] = float(cast("int | float", score))
    return list(pairs.items())


def describe(exc: BaseException | None, timeout: float) -> str:
    """A one-line description of why a request failed (not yet redacted)."""
    code = getattr(exc, "status_code", None)
    if isinstance(exc, DeadlineExceeded):
        return f"the per-query timeout of {timeout:g}s ran out"
    if isinstance(exc, MalformedResponse):
        return f"malformed rerank response: {exc}"
    if isinstance(exc, httpx.TimeoutException):
        return f"request timed out ({type(exc).__name__})"
    if isinstance(exc, httpx.TransportError):
        return f"connection error ({type(exc).__name__}: {exc})"
    if not isinstance(code, int):
        return f"unexpected error handling the request or its response: {type(exc).__name__}: {exc}"
    body = repr(getattr(exc, "body", None))
    body = body[:200] + "..." if len(body) > 200 else body
    if type(exc).__name__ == "ParsingError" or 200 <= code < 300:
        return f"unreadable response body (HTTP {code}): {body}"
    return f"HTTP {code} ({type(exc).__name__}): {body}"


_MISSING_KEY = (
    "No Cohere API key found: pass api_key=... to CohereReranker, or set the "
    "COHERE_API_KEY (or CO_API_KEY) environment variable."
)
_GRACE_S = 0.25
"""Extra wait for a request to report its own (more precise) error once the deadline passed."""
_R = TypeVar("_R", Retrying, AsyncRetrying)


@functools.cache
def _executor(pid: int) -> ThreadPoolExecutor:
    """The thread pool shared by the sync calls of process ``pid`` (a fork gets its own)."""
    return ThreadPoolExecutor(max_workers=32, thread_name_prefix="langchain-rse-rerank")


class RerankClient(Protocol):
    """What is called of a ``cohere.ClientV2`` (or ``AsyncClientV2``, whose ``rerank``
    returns a coroutine)."""

    def rerank(
        self,
        *,
        model: str,
        query: str,
        documents: list[str],
        request_options: dict[str, float],
        **optional: int,
    ) -> object: ...


@dataclass
class _Plan:
    """One call, for the sync and async paths alike: ``lanes`` of batches of ``texts`` (the
    lanes run concurrently, each in order) and the deadline ``end`` (``time.monotonic``)."""

    query: str
    texts: list[str]
    lanes: list[list[Batch]]
    end: float

    def remaining(self) -> float:
        return max(0.0, self.end - time.monotonic())


class CohereReranker(CalibratedReranker):
    """Rerank candidates with Cohere's rerank API (``/v2/rerank``).

    Example:
        .. code-block:: python

            from langchain_rse import RSERetriever
            from langchain_rse.rerank import CohereReranker

            reranker = CohereReranker(model="rerank-v3.5", timeout=10)  # key from COHERE_API_KEY
            retriever = RSERetriever(vectorstore=vs, reranker=reranker)

    Every call has a deadline of ``timeout`` seconds in total: each HTTP attempt gets only the
    time left, a backoff sleep or a server's ``Retry-After`` that would cross the deadline is
    not taken (the call fails at once instead), and the caller stops waiting at the deadline
    whatever the network does. Failures raise :class:`RerankError`.
    """

    model: str = "rerank-v3.5"
    """Cohere rerank model name."""
    cohere_api_key: SecretStr | None = Field(
        alias="api_key",
        default_factory=secret_from_env(["COHERE_API_KEY", "CO_API_KEY"], default=None),
    )
    """API key; read from ``COHERE_API_KEY`` or ``CO_API_KEY`` if not passed."""
    base_url: str = Field(default_factory=from_env("CO_API_URL", default="https://api.cohere.com"))
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
    max_documents_per_request: int = Field(default=1000, ge=1)
    """More candidates than this are split into several requests and merged by score."""
    max_concurrent_requests: int = Field(default=4, ge=1)
    """How many of those requests run at once."""
    client_name: str | None = "langchain-rse"
    """Sent as ``X-Client-Name``."""
    client: Any = Field(default=None, repr=False, exclude=True)
    """Optional ready ``cohere.ClientV2`` (otherwise built from the fields above)."""
    async_client: Any = Field(default=None, repr=False, exclude=True)
    """Optional ready ``cohere.AsyncClientV2`` (otherwise built per event loop)."""

    _sync_client: RerankClient | None = PrivateAttr(default=None)
    _async_clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, RerankClient] = (
        PrivateAttr(default_factory=weakref.WeakKeyDictionary)
    )

    @model_validator(mode="after")
    def _require_key(self) -> CohereReranker:
        if self.cohere_api_key is None and self.client is None and self.async_client is None:
            raise ValueError(_MISSING_KEY)
        return self

    def _model_name(self) -> str | None:
        return self.model

    # -- clients -----------------------------------------------------------------------------

    def _new_client(self, name: str) -> RerankClient:
        """A new ``cohere.<name>`` with the SDK's retries off (tenacity retries instead)."""
        if self.cohere_api_key is None:
            raise ValueError(_MISSING_KEY)
        try:
            import cohere
        except ImportError as exc:  # pragma: no cover - depends on the environment
            raise ImportError("CohereReranker needs: pip install 'langchain-rse[cohere]'") from exc
        key = self.cohere_api_key.get_secret_value()
        options = {"client_name": self.client_name, "timeout": self.timeout, "max_retries": 0}
        return getattr(cohere, name)(api_key=key, base_url=self.base_url, **options)

    def _get_client(self) -> RerankClient:
        """The sync ``cohere.ClientV2`` (built once)."""
        if self.client is not None:
            return self.client
        if self._sync_client is None:
            self._sync_client = self._new_client("ClientV2")
        return self._sync_client

    def _get_async_client(self) -> RerankClient:
        """The ``cohere.AsyncClientV2`` for the running event loop (httpx pools are per loop)."""
        if self.async_client is not None:
            return self.async_client
        loop = asyncio.get_running_loop()
        if loop not in self._async_clients:
            self._async_clients[loop] = self._new_client("AsyncClientV2")
        return self._async_clients[loop]

    # -- shared by the sync and async paths --------------------------------------------------

    def _plan(self, query: str, documents: Sequence[Document]) -> _Plan:
        texts = [doc.page_content for doc in documents]
        size = self.max_documents_per_request
        batches = [(start, min(start + size, len(texts))) for start in range(0, len(texts), size)]
        n_lanes = min(len(batches), self.max_concurrent_requests)
        lanes = [batches[lane::n_lanes] for lane in range(n_lanes)]
        return _Plan(query, texts, lanes, time.monotonic() + self.timeout)

    def _send(self, client: RerankClient, plan: _Plan, batch: Batch) -> object:
        """One attempt, given only the time left (a coroutine with the async client)."""
        remaining = plan.remaining()
        if remaining <= 0:
            raise DeadlineExceeded()
        start, stop = batch
        top_n = None if self.top_n is None else min(self.top_n, stop - start)
        optional = {"top_n": top_n, "max_tokens_per_doc": self.max_tokens_per_doc}
        # "timeout" for cohere 7, "timeout_in_seconds" for cohere 5; tenacity retries
        options = {"timeout": remaining, "timeout_in_seconds": remaining, "max_retries": 0}
        return client.rerank(
            model=self.model,
            query=plan.query,
            documents=plan.texts[start:stop],
            request_options=options,
            **{name: value for name, value in optional.items() if value is not None},
        )

    def _retrying(self, retrying: type[_R], plan: _Plan) -> _R:
        """A tenacity ``Retrying`` / ``AsyncRetrying`` for one batch of ``plan``."""
        # "Equal jitter": half the capped exponential step plus up to the other half at random.
        half = {"multiplier": self.backoff_base / 2.0, "max": self.backoff_max / 2.0}
        backoff = tenacity.wait_exponential(**half) + tenacity.wait_random_exponential(**half)

        def wait_for(state: RetryCallState) -> float:
            server_wait = retry_after(state.outcome.exception() if state.outcome else None)
            return backoff(state) if server_wait is None else server_wait

        return retrying(
            retry=tenacity.retry_if_exception(is_transient),
            wait=wait_for,
            stop=tenacity.stop_after_attempt(self.max_retries + 1)
            | tenacity.stop_before_delay(plan.remaining()),  # no sleep into the deadline
            before_sleep=self._log_retry,
            reraise=True,
        )

    def _log_retry(self, state: RetryCallState) -> None:
        logger.warning(
            "Cohere rerank attempt %d failed (%s); retrying in %.2fs",
            state.attempt_number,
            self._describe(state.outcome.exception() if state.outcome else None),
            state.upcoming_sleep,
        )

    def _describe(self, exc: BaseException | None) -> str:
        """:func:`describe` with the API key removed (a proxy may echo the request's headers)."""
        text = describe(exc, self.timeout)
        key = self.cohere_api_key.get_secret_value() if self.cohere_api_key else ""
        return text.replace(key, "***") if key else text

    def _failure(
        self, exc: BaseException | None, retrying: Retrying | AsyncRetrying | None = None
    ) -> RerankError:
        """The call's error: ``exc`` after ``retrying``'s attempts, or (no ``exc``) too late."""
        where = f"Cohere rerank (model {self.model!r}, {self.base_url})"
        if exc is None:
            return RerankError(f"{where} did not finish within its {self.timeout:g}s timeout")
        attempts = retrying.statistics.get("attempt_number", 1) if retrying else 1
        return RerankError(
            f"{where} failed after {attempts} attempt(s) within a {self.timeout:g}s timeout: "
            f"{self._describe(exc)}"
        )

    def _merge(self, lanes: Sequence[Pairs]) -> RerankResult:
        """Merge the lanes' pairs by score (ties: input order) and cut to ``top_n``."""
        ranked = sorted((pair for lane in lanes for pair in lane), key=lambda p: (-p[1], p[0]))
        ranked = ranked[: self.top_n] if self.top_n is not None else ranked
        return self._result([i for i, _ in ranked], [s for _, s in ranked])

    # -- sync --------------------------------------------------------------------------------

    def _lane(self, client: RerankClient, plan: _Plan, lane: list[Batch]) -> Pairs:
        pairs: Pairs = []
        for batch in lane:
            retrying = self._retrying(Retrying, plan)
            try:
                pairs += read_results(retrying(self._send, client, plan, batch), batch)
            except Exception as exc:
                raise self._failure(exc, retrying) from exc
        return pairs

    def rerank(
        self, query: str, documents: Sequence[Document], *, callbacks: Callbacks = None
    ) -> RerankResult:
        """Rerank ``documents`` against ``query`` with ``cohere.ClientV2``.

        ``callbacks`` is accepted for interface compatibility and not used.
        """
        if not documents:
            return RerankResult([], [], [])
        client, plan = self._get_client(), self._plan(query, documents)
        pool = _executor(os.getpid())
        futures = [pool.submit(self._lane, client, plan, lane) for lane in plan.lanes]
        try:
            done, pending = wait(futures, plan.remaining() + _GRACE_S, FIRST_EXCEPTION)
            for future in futures:
                if future in done:
                    future.result()  # re-raises a lane's RerankError
            if pending:
                raise self._failure(None)
            return self._merge([future.result() for future in futures])
        finally:
            plan.end = 0.0  # lanes still running stop before their next attempt
            for future in futures:
                future.cancel()

    # -- async -------------------------------------------------------------------------------

    async def _asend(self, client: RerankClient, plan: _Plan, batch: Batch) -> object:
        return await cast("Awaitable[object]", self._send(client, plan, batch))

    async def _alane(self, client: RerankClient, plan: _Plan, lane: list[Batch]) -> Pairs:
        pairs: Pairs = []
        for batch in lane:
            retrying = self._retrying(AsyncRetrying, plan)
            try:
                pairs += read_results(await retrying(self._asend, client, plan, batch), batch)
            except Exception as exc:
                raise self._failure(exc, retrying) from exc
        return pairs

    async def arerank(
        self, query: str, documents: Sequence[Document], *, callbacks: Callbacks = None
    ) -> RerankResult:
        """Rerank ``documents`` against ``query`` with ``cohere.AsyncClientV2`` (native async)."""
        if not documents:
            return RerankResult([], [], [])
        client, plan = self._get_async_client(), self._plan(query, documents)
        tasks = [asyncio.ensure_future(self._alane(client, plan, lane)) for lane in plan.lanes]
        try:
            lanes = await asyncio.wait_for(asyncio.gather(*tasks), plan.remaining() + _GRACE_S)
        except asyncio.TimeoutError:
            raise self._failure(None) from None
        finally:
            for task in tasks:  # after a lane's error, stop the others
                task.cancel()
        return self._merge(lanes)
