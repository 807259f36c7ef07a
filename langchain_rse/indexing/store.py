"""Typed access to the records of one index (:mod:`langchain_rse.indexing.records`) in a
``BaseStore[str, bytes]``, sync and async, with the decoded pointers and bodies cached;
and the writer-preferring readers-writer lock of in-process stores (FAISS, in-memory), which
are not safe to search while they are being modified; and :class:`FileByteStore`, the
file-backed byte store of the LLM and embedding caches; and the default local vector store
(FAISS, else in memory), saved in and loaded from an index directory
(:mod:`~langchain_rse.persistence`)."""

from __future__ import annotations

import os
import re
import tempfile
import threading
import warnings
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from cachetools import LRUCache
from langchain_core.documents import Document
from langchain_core.embeddings import Embeddings
from langchain_core.stores import BaseStore
from langchain_core.vectorstores import InMemoryVectorStore, VectorStore

from langchain_rse.indexing.records import (
    Body,
    DocBody,
    DocRecord,
    JsonRecord,
    StaleRead,
    VersionRecord,
    body_key,
    pointer_key,
    read_body,
    version_key,
)

if TYPE_CHECKING:
    from langchain_rse.persistence import IndexFiles, IndexWriter

__all__ = [
    "BODY_CACHE_CHARS",
    "FileByteStore",
    "ReadWriteLock",
    "RecordStore",
    "default_vectorstore",
    "file_store",
    "load_vectorstore",
    "save_vectorstore",
    "vectorstore_kind",
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
        self._pointers: dict[bytes, DocRecord] = {}
        self._bodies: LRUCache[tuple[str, str], Body] = LRUCache(
            BODY_CACHE_CHARS, getsizeof=lambda body: body.chars + 1
        )
        self._bodies_lock = threading.Lock()

    def _pointer(self, raw: bytes | None) -> DocRecord | None:
        if raw is None:
            return None
        record = self._pointers.get(raw)
        if record is None:
            record = DocRecord.from_bytes(raw)
            if len(self._pointers) >= _POINTER_CACHE_SIZE:
                self._pointers.pop(next(iter(self._pointers)), None)
            self._pointers[raw] = record
        return record

    def _cached(self, records: Sequence[DocRecord]) -> tuple[list[Body | None], list[str]]:
        """The cached bodies of ``records`` (None where not cached), and the keys to read."""
        with self._bodies_lock:
            found = [self._bodies.get((r.doc_id, r.version)) for r in records]
        return found, [body_key(r.doc_id, r.version) for r, b in zip(records, found) if b is None]

    def _decoded(
        self, records: Sequence[DocRecord], found: list[Body | None], raw: list[bytes | None]
    ) -> list[Body]:
        """``found`` with the missing bodies decoded from ``raw`` (in order) and cached."""
        todo = iter(raw)
        out = []
        for record, body in zip(records, found):
            if body is None:
                data = next(todo)
                if data is None:  # replaced or deleted since its pointer was read
                    raise StaleRead(record.doc_id)
                body = read_body(data)
                with self._bodies_lock:
                    self._bodies[(record.doc_id, record.version)] = body
            out.append(body)
        return out

    def pointers(self, doc_ids: Sequence[str]) -> list[DocRecord | None]:
        return [self._pointer(r) for r in self.store.mget([pointer_key(d) for d in doc_ids])]

    async def apointers(self, doc_ids: Sequence[str]) -> list[DocRecord | None]:
        raw = await self.store.amget([pointer_key(d) for d in doc_ids])
        return [self._pointer(r) for r in raw]

    def bodies(self, records: Sequence[DocRecord]) -> list[Body]:
        found, keys = self._cached(records)
        return self._decoded(records, found, self.store.mget(keys) if keys else [])

    async def abodies(self, records: Sequence[DocRecord]) -> list[Body]:
        found, keys = self._cached(records)
        return self._decoded(records, found, await self.store.amget(keys) if keys else [])

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


# ---------------------------------------------------------------- the local vector store


def _langchain_faiss() -> tuple[Any, Any, Any]:
    """LangChain's ``FAISS``, its ``InMemoryDocstore`` and ``DistanceStrategy``, quietly
    (``langchain-community``, which warns on import: ``pip install "langchain-rse[compat]"``)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            from langchain_community.docstore.in_memory import InMemoryDocstore
            from langchain_community.vectorstores import FAISS
            from langchain_community.vectorstores.utils import DistanceStrategy
    except ImportError as exc:
        raise ImportError(
            "this index was saved from LangChain's FAISS store, which needs "
            'langchain-community: pip install "langchain-rse[compat]"'
        ) from exc
    return FAISS, InMemoryDocstore, DistanceStrategy


def default_vectorstore(embedding: Embeddings | None = None) -> VectorStore:
    """The default local store: exact cosine search in FAISS
    (:class:`~langchain_rse.integrations.faiss.FaissStore`), else ``InMemoryVectorStore``, over
    ``embedding`` (the bundled ``LocalEmbeddings`` when None).

    It keeps the chunks' metadata without their text, which the record store holds."""
    if embedding is None:
        from langchain_rse.embeddings import LocalEmbeddings

        embedding = LocalEmbeddings()
    try:
        import faiss  # noqa: F401
    except ImportError:
        return InMemoryVectorStore(embedding)
    from langchain_rse.integrations.faiss import FaissStore

    return FaissStore(embedding, keep_text=False)  # the chunk texts are in the record store


def vectorstore_kind(vs: VectorStore) -> str:
    """``"faiss"``, ``"in_memory"`` or ``"external"`` (saved elsewhere by its owner)."""
    from langchain_rse.integrations.faiss import FaissStore, is_langchain_faiss

    # ours, or LangChain's FAISS itself (not a user's subclass of it)
    if isinstance(vs, FaissStore) or (is_langchain_faiss(vs) and type(vs).__name__ == "FAISS"):
        return "faiss"
    if isinstance(vs, InMemoryVectorStore):
        return "in_memory"
    return "external"


def save_vectorstore(vs: VectorStore, writer: IndexWriter) -> dict[str, Any]:
    """Write a local vector store's files with ``writer``; its manifest entry."""
    from langchain_rse.integrations.faiss import FaissStore

    kind = vectorstore_kind(vs)
    info: dict[str, Any] = {"kind": kind, "class": f"{type(vs).__module__}.{type(vs).__name__}"}
    if kind == "in_memory":
        store = vs.store  # type: ignore[attr-defined]
        writer.add_json(
            "vectors",
            [
                {
                    "id": k,
                    "text": v["text"],
                    "metadata": v["metadata"],
                    "vector": [float(x) for x in v["vector"]],
                }
                for k, v in store.items()
            ],
        )
    elif isinstance(vs, FaissStore):
        if vs.index is None:  # nothing added yet
            import faiss

            vs.index = faiss.IndexFlatIP(len(vs.embedding.embed_query("dimension probe")))
        writer.add_json("vectors", vs.to_json())
        writer.add_bytes("vectors_index", "faiss", vs.index_bytes())
    elif kind == "faiss":  # LangChain's FAISS
        import faiss

        ids = [vs.index_to_docstore_id[i] for i in range(len(vs.index_to_docstore_id))]  # type: ignore[attr-defined]
        docs = vs.docstore._dict  # type: ignore[attr-defined]
        documents = [{"text": docs[i].page_content, "metadata": docs[i].metadata} for i in ids]
        writer.add_json(
            "vectors",
            {
                "ids": ids,
                "docstore": "in_memory",
                "documents": documents,
                "normalize_L2": bool(vs._normalize_L2),  # type: ignore[attr-defined]
                "distance_strategy": str(vs.distance_strategy.value),  # type: ignore[attr-defined]
            },
        )
        raw: Any = faiss.serialize_index(vs.index)  # type: ignore[attr-defined]
        writer.add_bytes("vectors_index", "faiss", memoryview(raw))  # no copy of the vectors
    return info


def load_vectorstore(files: IndexFiles, embedding: Embeddings) -> VectorStore:
    """The local vector store saved in ``files`` (``ValueError`` for an external one)."""
    from langchain_rse import index_schema
    from langchain_rse.persistence import IndexFormatError

    info = files.manifest["vectorstore"]
    kind = info["kind"]
    if kind == "in_memory":
        vs = InMemoryVectorStore(embedding)
        for rec in files.json("vectors", index_schema.InMemoryVectors).root:
            vs.store[rec.id] = rec.model_dump()
        return vs
    if kind == "faiss":
        import faiss

        data = files.json("vectors", index_schema.FaissVectors)
        raw = files.read("vectors_index")
        name = files.name("vectors_index")
        try:
            index = faiss.deserialize_index(np.frombuffer(raw, dtype=np.uint8))
        except RuntimeError as exc:
            raise IndexFormatError(f"the FAISS index file {name!r} cannot be read: {exc}") from None
        if index.ntotal != len(data.ids):
            raise IndexFormatError(
                f"the FAISS index file {name!r} and {files.name('vectors')!r} disagree in size"
            )
        if str(info["class"]).rsplit(".", 1)[-1] == "FaissStore":
            from langchain_rse.integrations.faiss import FaissStore

            try:
                return FaissStore.from_saved(embedding, data.model_dump(), index)
            except ValueError as exc:
                raise IndexFormatError(f"{files.name('vectors')!r}: {exc}") from None
        FAISS, InMemoryDocstore, DistanceStrategy = _langchain_faiss()
        store = InMemoryDocstore(
            {
                i: Document(page_content=d.text, metadata=d.metadata, id=i)
                for i, d in zip(data.ids, data.documents)
            }
        )
        return FAISS(  # type: ignore[no-any-return]
            embedding,
            index,
            store,
            dict(enumerate(data.ids)),
            normalize_L2=data.normalize_L2,
            distance_strategy=DistanceStrategy(data.distance_strategy),
        )
    raise ValueError(
        f"this index uses an external vector store ({info.get('class')}); "
        "pass it with RSERetriever.load(path, vectorstore=...)"
    )
