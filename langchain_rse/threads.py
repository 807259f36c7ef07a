"""Work that runs beside the calling thread: the sync query path runs the lexical
searches and the document route in a worker while the calling thread runs the dense
searches (FAISS, the embedding model and network clients release the GIL while they work,
so the two overlap).

One small pool per process, made on first use and again after a ``fork`` (a forked
child inherits the pool object but none of its threads). A task that no worker has
started by the time its result is needed runs on the calling thread instead, so a busy
pool makes a query no slower than running both in turn, never stuck.

The dense search stays on the calling thread: settings a caller makes per thread keep
applying to it (FAISS's OpenMP thread count is one, which each FAISS search sets for
itself).
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Generic, TypeVar

__all__ = ["Beside"]

T = TypeVar("T")

WORKERS = min(8, (os.cpu_count() or 1) + 2)
"""Threads in the pool: enough for a few concurrent queries; beyond that, queries run
their branches in turn on their own threads."""

_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _executor() -> ThreadPoolExecutor:
    global _pool
    if _pool is None:
        with _pool_lock:
            if _pool is None:
                _pool = ThreadPoolExecutor(WORKERS, thread_name_prefix="langchain-rse")
    return _pool


def _forget_pool() -> None:  # in a forked child: the parent's threads did not come along
    global _pool, _pool_lock
    _pool, _pool_lock = None, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool)


class Beside(Generic[T]):
    """``fn()`` started in the shared pool, in a copy of the caller's context (so
    LangChain's callbacks and tracing see the caller's run)."""

    def __init__(self, fn: Callable[[], T]) -> None:
        self._fn = fn
        self._future: Future[T] | None = None
        with contextlib.suppress(RuntimeError):  # the interpreter is shutting down: in turn
            self._future = _executor().submit(contextvars.copy_context().run, fn)

    def result(self) -> T:
        """Its result (or exception); run here if no worker has started it yet."""
        if self._future is None or self._future.cancel():
            return self._fn()
        return self._future.result()

    def discard(self) -> None:
        """Cancel it, or wait for it to end and drop its outcome (the caller failed)."""
        if self._future is not None and not self._future.cancel():
            with contextlib.suppress(BaseException):
                self._future.result()
