"""A writer-preferring readers-writer lock for in-process stores (FAISS, in-memory), which
are not safe to search while they are being modified."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext

__all__ = ["ReadWriteLock"]


class ReadWriteLock:
    """Many readers or one writer. A waiting writer blocks new readers, so readers that
    query flat out cannot starve it; waiting writers go one at a time."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self._cond = threading.Condition()
        self._readers = 0
        self._writer = False
        self._writers_waiting = 0

    @contextmanager
    def _write(self) -> Iterator[None]:
        with self._cond:
            self._writers_waiting += 1
            try:
                while self._writer or self._readers:
                    self._cond.wait()
            finally:
                self._writers_waiting -= 1
            self._writer = True
        try:
            yield
        finally:
            with self._cond:
                self._writer = False
                self._cond.notify_all()

    def read(self) -> AbstractContextManager[None]:
        """Shared access (a no-op when the lock is disabled: a server store)."""
        return _Reading(self) if self.enabled else nullcontext()

    def write(self) -> AbstractContextManager[None]:
        """Exclusive access (a no-op when the lock is disabled: a server store)."""
        return self._write() if self.enabled else nullcontext()


class _Reading:
    """A shared hold of a :class:`ReadWriteLock` (a plain class, not a generator: every
    query takes one for each in-process search)."""

    __slots__ = ("_lock",)

    def __init__(self, lock: ReadWriteLock) -> None:
        self._lock = lock

    def __enter__(self) -> None:
        lock = self._lock
        with lock._cond:
            while lock._writer or lock._writers_waiting:
                lock._cond.wait()
            lock._readers += 1

    def __exit__(self, *exc: object) -> None:
        lock = self._lock
        with lock._cond:
            lock._readers -= 1
            if not lock._readers and lock._writers_waiting:  # only writers wait for readers
                lock._cond.notify_all()
