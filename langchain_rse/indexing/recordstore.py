"""Typed access to the records of one index (:mod:`langchain_rse.indexing.records`) in a
``BaseStore[str, bytes]``, sync and async, with the decoded pointers and bodies cached;
the writer-preferring readers-writer lock of in-process stores (FAISS, in-memory), which
are not safe to search while they are being modified; and :class:`FileByteStore`, the
file-backed byte store of the LLM and embedding caches."""

from __future__ import annotations

import os
import re
import tempfile
import threading
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path

from cachetools import LRUCache
from langchain_core.stores import BaseStore

from langchain_rse.indexing.records import (
    Body,
    DocBody,
    JsonRecord,
    Pointer,
    StaleRead,
    VersionRecord,
    body_key,
    pointer_key,
    read_body,
    version_key,
)

__all__ = [
    "BODY_CACHE_CHARS",
    "FileByteStore",
    "ReadWriteLock",
    "RecordStore",
    "file_store",
]

_POINTER_CACHE_SIZE = 4096
BODY_CACHE_CHARS = 32_000_000
"""Characters of decoded source text :class:`RecordStore` keeps (least recently used go)."""


class RecordStore:
    """Typed access to the records in a ``BaseStore[str, bytes]``, sync and async.

    Decoded pointers are cached by their bytes, so a hot document is parsed once. Decoded
    bodies are cached by document version (a version's body is written once, before its
    pointer, and never changes), up to ``BODY_CACHE_CHARS`` characters of text: a query
    whose segments come from recently read documents reads no body.

    With ``compress`` (for a store in this process's memory) bodies are written as
    LZ4-compressed JSON; stores other processes share get plain JSON, which every version
    of the library reads.
    """

    def __init__(self, store: BaseStore[str, bytes], compress: bool = False) -> None:
        self.store = store
        self.compress = compress
        self._pointers: dict[bytes, Pointer] = {}
        self._bodies: LRUCache[tuple[str, str], Body] = LRUCache(
            BODY_CACHE_CHARS, getsizeof=lambda body: body.chars + 1
        )
        self._bodies_lock = threading.Lock()

    def _pointer(self, raw: bytes | None) -> Pointer | None:
        if raw is None:
            return None
        pointer = self._pointers.get(raw)
        if pointer is None:
            pointer = Pointer.from_bytes(raw)
            if len(self._pointers) >= _POINTER_CACHE_SIZE:
                self._pointers.pop(next(iter(self._pointers)), None)
            self._pointers[raw] = pointer
        return pointer

    def _cached(self, pointers: Sequence[Pointer]) -> tuple[list[Body | None], list[str]]:
        """The cached bodies of ``pointers`` (None where not cached), and the keys to read."""
        with self._bodies_lock:
            found = [self._bodies.get((p.doc_id, p.version)) for p in pointers]
        return found, [body_key(p.doc_id, p.version) for p, b in zip(pointers, found) if b is None]

    def _decoded(
        self, pointers: Sequence[Pointer], found: list[Body | None], raw: list[bytes | None]
    ) -> list[Body]:
        """``found`` with the missing bodies decoded from ``raw`` (in order) and cached."""
        todo = iter(raw)
        out = []
        for pointer, body in zip(pointers, found):
            if body is None:
                data = next(todo)
                if data is None:  # replaced or deleted since its pointer was read
                    raise StaleRead(pointer.doc_id)
                body = read_body(data)
                with self._bodies_lock:
                    self._bodies[(pointer.doc_id, pointer.version)] = body
            out.append(body)
        return out

    def pointers(self, doc_ids: Sequence[str]) -> list[Pointer | None]:
        return [self._pointer(r) for r in self.store.mget([pointer_key(d) for d in doc_ids])]

    async def apointers(self, doc_ids: Sequence[str]) -> list[Pointer | None]:
        raw = await self.store.amget([pointer_key(d) for d in doc_ids])
        return [self._pointer(r) for r in raw]

    def bodies(self, pointers: Sequence[Pointer]) -> list[Body]:
        found, keys = self._cached(pointers)
        return self._decoded(pointers, found, self.store.mget(keys) if keys else [])

    async def abodies(self, pointers: Sequence[Pointer]) -> list[Body]:
        found, keys = self._cached(pointers)
        return self._decoded(pointers, found, await self.store.amget(keys) if keys else [])

    def put(self, pairs: Sequence[tuple[str, JsonRecord]]) -> None:
        if pairs:
            local = self.compress
            self.store.mset(
                [
                    (
                        key,
                        record.local_bytes()
                        if local and isinstance(record, DocBody)
                        else record.to_bytes(),
                    )
                    for key, record in pairs
                ]
            )

    def delete(self, keys: Sequence[str]) -> None:
        if keys:
            self.store.mdelete(list(keys))

    def versions(self, doc_id: str | None = None) -> list[VersionRecord]:
        """The version records of one document, or of all documents."""
        # All keys, filtered here: stores disagree on what `prefix` means (RedisStore
        # takes it as a whole-key pattern), and this is only for vacuum's full scan.
        prefix = version_key(doc_id) if doc_id else "ver/"
        keys = [key for key in self.store.yield_keys() if key.startswith(prefix)]
        raw = self.store.mget(keys) if keys else []
        return [VersionRecord.from_bytes(r) for r in raw if r is not None]


# ---------------------------------------------------------------- the lock of in-process stores


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

    def acquire_read(self) -> None:
        """Take a shared hold, waiting while a writer holds the lock or waits for it (see
        :meth:`read`; :meth:`release_read` gives it back)."""
        with self._cond:
            while self._writer or self._writers_waiting:
                self._cond.wait()
            self._readers += 1

    def release_read(self) -> None:
        """Give back a shared hold taken by :meth:`acquire_read`."""
        with self._cond:
            self._readers -= 1
            if not self._readers and self._writers_waiting:  # only writers wait for readers
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
        self._lock.acquire_read()

    def __exit__(self, *exc: object) -> None:
        self._lock.release_read()


class FileByteStore(BaseStore[str, bytes]):
    """A small file-backed byte store: one file per key, written atomically.

    Used for ``ContextualEnricher(cache_dir=...)`` and the embedding cache. Keys may
    contain ``[A-Za-z0-9_.-/]``; the files are laid out as ``langchain_classic``'s
    ``LocalFileStore`` lays them out (one file per key, at the key's path), so a cache
    written by either is read by the other.
    """

    _KEY = re.compile(r"^[A-Za-z0-9_.\-/]+$")

    def __init__(self, root_path: str | os.PathLike[str]) -> None:
        """Store files under ``root_path`` (created when missing)."""
        self.root_path = Path(root_path)
        self.root_path.mkdir(parents=True, exist_ok=True)

    def _path(self, key: str) -> Path:
        if not self._KEY.match(key) or ".." in key.split("/") or key.startswith("/"):
            raise ValueError(f"invalid key for FileByteStore: {key!r}")
        return self.root_path / key

    def mget(self, keys: Sequence[str]) -> list[bytes | None]:
        """Values of ``keys`` (``None`` where missing)."""
        values: list[bytes | None] = []
        for key in keys:
            path = self._path(key)
            try:
                values.append(path.read_bytes())
            except FileNotFoundError:
                values.append(None)
        return values

    def mset(self, key_value_pairs: Sequence[tuple[str, bytes]]) -> None:
        """Write each value to a temporary file, then rename it into place."""
        for key, value in key_value_pairs:
            path = self._path(key)
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
            try:
                with os.fdopen(fd, "wb") as handle:
                    handle.write(value)
                os.replace(tmp, path)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise

    def mdelete(self, keys: Sequence[str]) -> None:
        """Delete ``keys`` (missing ones are ignored)."""
        for key in keys:
            self._path(key).unlink(missing_ok=True)

    def yield_keys(self, *, prefix: str | None = None) -> Iterator[str]:
        """All keys, or those starting with ``prefix``."""
        for path in sorted(self.root_path.rglob("*")):
            if path.is_file() and not path.name.startswith(".tmp-"):
                key = path.relative_to(self.root_path).as_posix()
                if prefix is None or key.startswith(prefix):
                    yield key


def file_store(cache_dir: str | os.PathLike[str]) -> BaseStore[str, bytes]:
    """A :class:`FileByteStore` at ``cache_dir``."""
    return FileByteStore(cache_dir)
