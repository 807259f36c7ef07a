"""Wire-level helpers for :class:`~langchain_rse.rerank.cohere.CohereReranker`: which failures
to retry, ``Retry-After``, validating rerank responses, and describing failures."""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from email.utils import parsedate_to_datetime
from typing import Any

import httpx

Batch = tuple[int, int]
"""``(start, stop)``: a slice of the candidates sent in one request."""
Pairs = list[tuple[int, float]]
"""``(input position, score)`` pairs."""
_TRANSIENT = (httpx.TimeoutException, httpx.NetworkError, httpx.RemoteProtocolError)


class DeadlineExceeded(Exception):
    """No time is left in the per-query budget for another request."""


class MalformedResponse(Exception):
    """The server answered 2xx with a body that is not a valid rerank response."""


def is_transient(exc: BaseException) -> bool:
    """Worth retrying: timeouts, connection errors, HTTP 429 and 5xx (but 501)."""
    if isinstance(exc, _TRANSIENT):
        return True
    code = getattr(exc, "status_code", None)
    if not isinstance(code, int) or type(exc).__name__ == "ParsingError":
        return False
    return code == 429 or (code >= 500 and code != 501)


def retry_after(exc: BaseException | None) -> float | None:
    """Seconds the server asked us to wait (``Retry-After-Ms``, else ``Retry-After`` in seconds
    or as an HTTP date), if any."""
    headers = getattr(exc, "headers", None)
    if not isinstance(headers, Mapping):
        return None
    lookup = httpx.Headers({str(k): str(v) for k, v in headers.items()})
    for name, scale in (("retry-after-ms", 0.001), ("retry-after", 1.0)):
        value = lookup.get(name, "").strip()
        try:
            seconds = float(value) * scale
        except ValueError:
            try:
                seconds = parsedate_to_datetime(value).timestamp() - time.time()
            except (TypeError, ValueError, IndexError):
                continue
        if math.isfinite(seconds):
            return max(0.0, seconds)
    return None


def _field(item: Any, name: str) -> Any:
    """``item.name`` or ``item[name]``."""
    return item.get(name) if isinstance(item, Mapping) else getattr(item, name, None)


def read_results(response: Any, batch: Batch) -> Pairs:
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
        if type(score) not in (int, float) or not math.isfinite(score):
            raise MalformedResponse(f"invalid relevance_score {score!r} for index {index}")
        pairs[start + index] = float(score)
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
