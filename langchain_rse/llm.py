"""Every call the package makes to a model service: cached, retried, concurrent chat-model
calls (the enricher's and the query expander's), and the one retry classifier
(:func:`is_transient`, :func:`retry_after`) the Cohere reranker uses too.

:class:`ModelCalls` makes one request per cache *key* of a :class:`CallJob`: all keys are
read from the store in one ``mget``; every other key is asked for (``max_concurrency`` in
flight, transient errors retried with jittered backoff by tenacity) and written to the store
as it arrives, so an interrupted run resumes; the keys that still failed come back with
their last error. The model's own retries are turned off (:func:`without_model_retries`), so
``RetryPolicy.max_retries + 1`` requests per key is the bound.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import re
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import as_completed
from dataclasses import KW_ONLY, dataclass, field
from email.utils import parsedate_to_datetime
from typing import TYPE_CHECKING, Any, ClassVar

from langchain_core.runnables import Runnable, RunnableWithFallbacks
from langchain_core.runnables.base import RunnableBindingBase
from langchain_core.runnables.config import get_executor_for_config
from pydantic import BaseModel, SecretStr
from pydantic.fields import FieldInfo
from tenacity import AsyncRetrying, RetryCallState, Retrying, retry_if_exception, stop_after_attempt

if TYPE_CHECKING:
    from langchain_core.language_models import LanguageModelInput
    from langchain_core.runnables import RunnableConfig
    from langchain_core.stores import BaseStore

__all__ = [
    "CallJob",
    "CallsModel",
    "ModelCalls",
    "RetryPolicy",
    "UnusableReply",
    "is_transient",
    "message_text",
    "model_identity",
    "redact_secrets",
    "retry_after",
    "status_code",
    "underlying_model",
    "without_model_retries",
]


logger = logging.getLogger(__name__)

_RETRY_STATUSES = frozenset({408, 409, 425, 429})
_PERMANENT_NAME = re.compile(
    "Authentication|PermissionDenied|BadRequest|NotFound|InvalidRequest|UnprocessableEntity"
)


class UnusableReply(RuntimeError):
    """The model answered, but with nothing usable; :attr:`retry` says whether to ask again."""

    retry: ClassVar[bool] = True


def status_code(error: BaseException) -> int | None:
    """The HTTP status of an SDK error (``.status_code`` or ``.response.status_code``)."""
    status = getattr(error, "status_code", None)
    if status is None:
        status = getattr(getattr(error, "response", None), "status_code", None)
    return status if isinstance(status, int) and not isinstance(status, bool) else None


def is_transient(error: BaseException) -> bool:
    """Whether asking again may help.

    Yes: HTTP 408, 409, 425, 429 and 5xx (but 501); timeouts and connection errors; an
    :class:`UnusableReply` whose ``retry`` is true; any other ``Exception`` not ruled out.
    No: what is not an ``Exception`` (a kill, a cancelled task); other HTTP statuses; errors
    named like them (``AuthenticationError``, ``BadRequestError``, ...); ``TypeError``,
    ``AttributeError``, ``KeyError``, ``NotImplementedError`` and ``ValueError``.
    """
    if not isinstance(error, Exception):
        return False
    if isinstance(error, UnusableReply):
        return error.retry
    status = status_code(error)
    if status is not None:
        return status in _RETRY_STATUSES or (status >= 500 and status != 501)
    if isinstance(error, (TimeoutError, ConnectionError)):
        return True
    if isinstance(error, (TypeError, AttributeError, KeyError, NotImplementedError, ValueError)):
        return False
    return _PERMANENT_NAME.search(type(error).__name__) is None


def retry_after(error: BaseException | None) -> float | None:
    """Seconds the server asked to wait: ``Retry-After-Ms``, else ``Retry-After`` in seconds
    or as an HTTP date (a time past: 0), from the error's or its response's headers."""
    headers = getattr(error, "headers", None)
    if not isinstance(headers, Mapping):
        headers = getattr(getattr(error, "response", None), "headers", None)
    if not isinstance(headers, Mapping):
        return None
    lowered = {str(k).lower(): str(v).strip() for k, v in headers.items()}
    for name, scale in (("retry-after-ms", 0.001), ("retry-after", 1.0)):
        value = lowered.get(name, "")
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


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how patiently a failed request is retried."""

    max_retries: int = 3
    """Retries after the first request (0: none)."""
    base_delay: float = 1.0
    """The first backoff delay in seconds, doubled per retry."""
    max_delay: float = 30.0
    """The longest delay in seconds, also for a server's ``Retry-After``."""

    def __post_init__(self) -> None:
        if self.max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {self.max_retries}")
        if self.base_delay < 0 or self.max_delay < 0:
            raise ValueError("retry delays must be >= 0")

    def delay(self, retry: int, error: BaseException | None = None) -> float:
        """Seconds before retry number ``retry`` (1-based): the server's ``Retry-After``, else
        ``base_delay * 2 ** (retry - 1)`` jittered to 50-100%; at most ``max_delay``."""
        asked = retry_after(error)
        if asked is not None:
            return min(self.max_delay, asked)
        delay = min(self.max_delay, self.base_delay * 2.0 ** min(retry - 1, 64))
        return delay * random.uniform(0.5, 1.0)


class CallJob(ABC):
    """One batch of keyed requests, as its owner sees it (methods run in worker threads)."""

    @abstractmethod
    def cached(self, key: str, raw: bytes) -> bool:
        """Take a cached value; ``False`` when it is unusable (the key is asked for)."""

    @abstractmethod
    def prompt(self, key: str) -> LanguageModelInput:
        """The model input for ``key``."""

    @abstractmethod
    def answered(self, key: str, reply: object) -> bytes:
        """Take a reply: the bytes to cache, or raise (:class:`UnusableReply`) to fail it."""

    def attempted(self, reply: object) -> None:  # noqa: B027 - an optional hook
        """Called once per request with its reply or its exception (for accounting)."""


@dataclass
class ModelCalls:
    """Runs :class:`CallJob` s: cache lookup, bounded concurrency, retries, write-through.

    Requests per key: at most ``max(1, (retry.max_retries + 1) // (model_retries + 1))``
    (``model_retries``: the retries the model still makes by itself).
    """

    model: Runnable[LanguageModelInput, object]
    """Called (``invoke``/``ainvoke``) at most ``max_concurrency`` at a time."""
    cache: BaseStore[str, bytes]
    retry: RetryPolicy
    _: KW_ONLY
    max_concurrency: int
    batch_size: int | None = None
    """Keys started at a time (default: all)."""
    model_retries: int = 0
    log: logging.Logger = logger
    owner: str = "ModelCalls"
    """The name warnings give."""
    strict_cache_reads: bool = True
    """``False``: a failed cache read is a warning (every key is then asked for)."""
    attempts: int = field(init=False)

    def __post_init__(self) -> None:
        if self.max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {self.max_concurrency}")
        self.attempts = max(1, (self.retry.max_retries + 1) // (self.model_retries + 1))

    def run(
        self, job: CallJob, keys: Sequence[str], config: RunnableConfig | None = None
    ) -> dict[str, BaseException]:
        """Fill ``job`` for ``keys``; return the keys that failed, with their last error."""
        try:
            raws: Sequence[bytes | None] = self.cache.mget(list(keys))
        except Exception as error:
            raws = self._read_failed(error, keys)
        errors: dict[str, BaseException] = {}
        with get_executor_for_config({"max_concurrency": self.max_concurrency}) as executor:
            for batch in self._batches(self._uncached(job, keys, raws)):
                futures = {executor.submit(self._fetch, job, k, config): k for k in batch}
                try:
                    for future in as_completed(futures):
                        if (failure := future.result()) is not None:
                            errors[futures[future]] = failure
                finally:
                    for future in futures:
                        future.cancel()
        return errors

    async def arun(
        self, job: CallJob, keys: Sequence[str], config: RunnableConfig | None = None
    ) -> dict[str, BaseException]:
        """Async :meth:`run`."""
        try:
            raws: Sequence[bytes | None] = await self.cache.amget(list(keys))
        except Exception as error:
            raws = self._read_failed(error, keys)
        errors: dict[str, BaseException] = {}
        slots = asyncio.Semaphore(self.max_concurrency)

        async def fetch(key: str) -> tuple[str, BaseException | None]:
            async with slots:
                return key, await self._afetch(job, key, config)

        for batch in self._batches(self._uncached(job, keys, raws)):
            tasks = [asyncio.ensure_future(fetch(key)) for key in batch]
            try:
                for next_done in asyncio.as_completed(tasks):
                    key, failure = await next_done
                    if failure is not None:
                        errors[key] = failure
            finally:
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
        return errors

    def _fetch(self, job: CallJob, key: str, config: RunnableConfig | None) -> BaseException | None:
        """One key, retried; its result cached. The final error, or ``None``."""

        def attempt() -> bytes:
            prompt = job.prompt(key)
            try:
                reply = self.model.invoke(prompt, config)
            except Exception as error:
                reply = error
            return self._outcome(job, key, reply)

        try:
            encoded = Retrying(**self._retrying())(attempt)
        except Exception as error:
            return error
        self._store([(key, encoded)])
        return None

    async def _afetch(
        self, job: CallJob, key: str, config: RunnableConfig | None
    ) -> BaseException | None:
        async def attempt() -> bytes:
            prompt = job.prompt(key)
            try:
                reply = await self.model.ainvoke(prompt, config)
            except Exception as error:
                reply = error
            return self._outcome(job, key, reply)

        try:
            encoded: bytes = await AsyncRetrying(**self._retrying())(attempt)
        except Exception as error:
            return error
        try:
            await self.cache.amset([(key, encoded)])
        except Exception as error:
            self._write_failed(error)
        return None

    def _store(self, pairs: list[tuple[str, bytes]]) -> None:
        try:
            self.cache.mset(pairs)
        except Exception as error:  # never lose paid-for work over a cache problem
            self._write_failed(error)

    def _uncached(
        self, job: CallJob, keys: Sequence[str], raws: Sequence[bytes | None]
    ) -> list[str]:
        return [key for key, raw in zip(keys, raws) if raw is None or not job.cached(key, raw)]

    def _batches(self, keys: list[str]) -> Iterator[list[str]]:
        size = self.batch_size or len(keys) or 1
        for offset in range(0, len(keys), size):
            yield keys[offset : offset + size]

    def _outcome(self, job: CallJob, key: str, reply: object) -> bytes:
        job.attempted(reply)
        if isinstance(reply, BaseException):
            raise reply
        return job.answered(key, reply)

    def _retrying(self) -> dict[str, Any]:
        """tenacity options: transient errors only, ``attempts`` at most, backoff."""
        return {
            "retry": retry_if_exception(is_transient),
            "stop": stop_after_attempt(self.attempts),
            "wait": self._wait,
            "before_sleep": self._log_retry,
            "reraise": True,
        }

    def _wait(self, state: RetryCallState) -> float:
        return self.retry.delay(state.attempt_number, _error_of(state))

    def _log_retry(self, state: RetryCallState) -> None:
        error = _error_of(state)
        self.log.debug(
            "%s: attempt %d failed (%s); retrying in %.2fs",
            self.owner,
            state.attempt_number,
            type(error).__name__,
            state.upcoming_sleep,
        )

    def _read_failed(self, error: Exception, keys: Sequence[str]) -> list[bytes | None]:
        if self.strict_cache_reads:
            raise error
        self.log.warning("%s: could not read the cache: %s", self.owner, error)
        return [None] * len(keys)

    def _write_failed(self, error: Exception) -> None:
        self.log.warning("%s: could not write to the cache: %s", self.owner, error)


def _error_of(state: RetryCallState) -> BaseException | None:
    return state.outcome.exception() if state.outcome is not None else None


class CallsModel:
    """Mixin of a class that calls ``llm`` through :class:`ModelCalls` (the attributes below
    are read at each call, so changing them takes effect)."""

    llm: Runnable[LanguageModelInput, object]
    cache: BaseStore[str, bytes]
    max_concurrency: int
    max_retries: int
    retry_base_delay: float
    retry_max_delay: float
    _detached: tuple[Any, Any, int] | None = None
    """``(llm, its copy without retries, retries left)`` for the current ``llm``."""

    model_identity: str
    failures: int
    _lock: threading.Lock

    def _init_calls(
        self,
        llm: Runnable[LanguageModelInput, object],
        cache: BaseStore[str, bytes],
        max_concurrency: int,
        retry: RetryPolicy,
    ) -> None:
        """Check and set the attributes above; warn if the model's retries stay on."""
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {max_concurrency}")
        self.llm, self.cache, self.max_concurrency = llm, cache, max_concurrency
        self.max_retries = retry.max_retries
        self.retry_base_delay, self.retry_max_delay = retry.base_delay, retry.max_delay
        self.model_identity = model_identity(llm)  # part of the cache key
        self._lock = threading.Lock()
        self.retry_free_model()

    def _count_failures(self, count: int, errors: Mapping[str, BaseException]) -> str:
        """Add ``count`` to ``failures``; return the last error for a warning (redacted)."""
        with self._lock:
            self.failures += count
        last = next(iter(errors.values()), None)
        if last is None:
            return "unknown"
        return f"{type(last).__name__}: {redact_secrets(str(last), self.llm)[:200]}"

    def retry_free_model(self) -> tuple[Any, int]:
        """:func:`without_model_retries` of ``llm``, made once per ``llm`` object."""
        detached = self._detached
        if detached is None or detached[0] is not self.llm:
            detached = (self.llm, *without_model_retries(self.llm))
            self._detached = detached
        return detached[1], detached[2]

    def model_calls(self, **options: Any) -> ModelCalls:
        """A :class:`ModelCalls` with the current settings (``options``: its keywords)."""
        model, left = self.retry_free_model()
        retry = RetryPolicy(self.max_retries, self.retry_base_delay, self.retry_max_delay)
        options.setdefault("owner", type(self).__name__)
        return ModelCalls(
            model,
            self.cache,
            retry,
            max_concurrency=self.max_concurrency,
            model_retries=left,
            **options,
        )


def message_text(message: object) -> str:
    """The text of a chat model reply (string content or text content blocks)."""
    content = getattr(message, "content", message)
    if isinstance(content, str):
        return content
    parts: list[str] = []
    if isinstance(content, list):
        for block in content:
            if isinstance(block, str):
                parts.append(block)
            elif isinstance(block, dict) and block.get("type") == "text":
                parts.append(str(block.get("text", "")))
    return "".join(parts)


def underlying_model(llm: object) -> object:
    """The chat model inside LangChain wrappers (``bind``, ``with_fallbacks``: the primary)."""
    while isinstance(llm, (RunnableBindingBase, RunnableWithFallbacks)):
        llm = llm.bound if isinstance(llm, RunnableBindingBase) else llm.runnable
    return llm


def model_identity(llm: object) -> str:
    """``"<ChatModelClass>:<model name>"``: enough to key a cache, no secrets. Wrappers are
    looked through, so ``llm.with_config(...)`` shares the cache of ``llm``."""
    llm = underlying_model(llm)
    name = ""
    for attribute in ("model_name", "model", "model_id", "deployment_name"):
        value = getattr(llm, attribute, None)
        if isinstance(value, str) and value:
            name = value
            break
    return f"{type(llm).__name__}:{name}"


def redact_secrets(text: str, llm: object) -> str:
    """``text`` with every ``SecretStr`` value of the model in ``llm`` (an API key, say) as
    ``***`` (a proxy may echo the request's headers into an error message)."""
    model = underlying_model(llm)
    for value in vars(model).values() if hasattr(model, "__dict__") else ():
        if isinstance(value, SecretStr):
            secret = value.get_secret_value()
            if secret:
                text = text.replace(secret, "***")
    return text


_CLIENT_FIELDS = ("client", "async_client", "root_client", "root_async_client")
"""Fields in which LangChain chat models keep SDK clients built from their other fields."""
_SDK_DEFAULT_RETRIES = 2
"""What ``max_retries=None`` means for the openai and anthropic SDKs."""


def without_model_retries(llm: object) -> tuple[object, int]:
    """``llm`` with the chat models in it rebuilt with ``max_retries=0``, and the retries left.

    A chat model with a ``max_retries`` field (``None``: the SDK's 2) is rebuilt from its
    other fields (SDK clients anew) with ``max_retries=0``, wrappers around the copies. A
    model that cannot be rebuilt is kept, its retries returned for the caller.
    """
    if isinstance(llm, RunnableBindingBase):
        bound, left = without_model_retries(llm.bound)
        return (llm if bound is llm.bound else llm.model_copy(update={"bound": bound})), left
    if isinstance(llm, RunnableWithFallbacks):
        primary, left = without_model_retries(llm.runnable)
        fallbacks = []
        for fallback in llm.fallbacks:
            copy, fallback_left = without_model_retries(fallback)
            fallbacks.append(copy)
            left = max(left, fallback_left)
        update = {"runnable": primary, "fallbacks": fallbacks}
        return llm.model_copy(update=update), left
    return _model_without_retries(llm)


def _model_without_retries(model: object) -> tuple[object, int]:
    if not isinstance(model, BaseModel):
        return model, 0
    fields = type(model).model_fields
    current = getattr(model, "max_retries", 0) if "max_retries" in fields else 0
    if current == 0 or isinstance(current, bool) or not isinstance(current, (int, type(None))):
        return model, 0
    own = current if isinstance(current, int) else _SDK_DEFAULT_RETRIES
    data = {
        _input_name(name, info): None if name in _CLIENT_FIELDS else getattr(model, name)
        for name, info in fields.items()
    }
    data[_input_name("max_retries", fields["max_retries"])] = 0
    try:
        copy = type(model).model_validate(data)
        if getattr(copy, "max_retries", None) != 0 or model_identity(copy) != model_identity(model):
            raise ValueError("the copy differs from the model")
    except Exception as error:
        logger.warning(
            "could not turn off the own retries of %s (%s: %s); its %d retries are "
            "counted against the caller's",
            type(model).__name__,
            type(error).__name__,
            str(error)[:200],
            own,
        )
        return model, own
    return copy, 0


def _input_name(name: str, info: FieldInfo) -> str:
    """The key that sets field ``name`` in ``model_validate`` (its alias when it has one)."""
    for alias in (info.validation_alias, info.alias):
        if isinstance(alias, str):
            return alias
    return name
