"""Embeddings cached by model and text, so an interrupted indexing run resumes cheaply.

:func:`cached_embeddings` wraps any LangChain ``Embeddings`` in a
:class:`CachedEmbeddings` over a byte store — by default files next to the index, written
atomically (a process killed mid-write leaves no half-written vector). Every batch of
``batch_size`` texts is stored as soon as it is embedded: a run killed half-way, started
again, embeds only the chunks it had not finished. Keys are the model's name and a SHA-256
of the text, so two models never share vectors and a changed chunk is embedded again;
keys and values (JSON lists of floats) are those of ``langchain_classic``'s
``CacheBackedEmbeddings`` with ``key_encoder="sha256"``, so caches written by either are
read by the other.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from typing import Any

from langchain_core.embeddings import Embeddings
from langchain_core.stores import BaseStore

from langchain_rse.byte_store import FileByteStore

__all__ = [
    "EMBEDDING_CACHE_DIR",
    "CachedEmbeddings",
    "cache_size",
    "cached_embeddings",
    "model_namespace",
    "underlying",
]

EMBEDDING_CACHE_DIR = "embedding_cache"
"""The cache folder's name inside an index directory (``langchain-rse index``)."""

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
        store: Where vectors are kept (key: ``namespace`` + SHA-256 of the text).
        namespace: The key prefix naming the model (see :func:`model_namespace`).
        batch_size: Texts embedded and stored per call of the model.
    """

    def __init__(self, underlying_embeddings: Embeddings, store: BaseStore[str, bytes],
                 namespace: str, batch_size: int = 32) -> None:  # fmt: skip
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
        vectors: list[list[float] | None] = [
            None if v is None else json.loads(v) for v in self.store.mget(keys)
        ]
        missing = [i for i, v in enumerate(vectors) if v is None]
        for start in range(0, len(missing), self.batch_size):
            batch = missing[start : start + self.batch_size]
            new = self.underlying_embeddings.embed_documents([texts[i] for i in batch])
            self.store.mset([(keys[i], json.dumps(v).encode()) for i, v in zip(batch, new)])
            for i, v in zip(batch, new):
                vectors[i] = list(v)
        return vectors  # type: ignore[return-value]

    def embed_query(self, text: str) -> list[float]:
        """The query's vector from the model (not cached)."""
        return self.underlying_embeddings.embed_query(text)

    async def aembed_query(self, text: str) -> list[float]:
        return await self.underlying_embeddings.aembed_query(text)


def cached_embeddings(
    embeddings: Embeddings,
    store: BaseStore[str, bytes] | str | os.PathLike[str],
    *,
    batch_size: int = 32,
) -> CachedEmbeddings:
    """``embeddings`` with document vectors cached in ``store`` (a byte store, or a folder).

    Returns a :class:`CachedEmbeddings`, whose ``underlying_embeddings`` is ``embeddings``;
    queries are not cached. Use it as the vector store's embedding, e.g.::

        emb = cached_embeddings(LocalEmbeddings(), "./idx/embedding_cache")
        retriever = RSERetriever(vectorstore=default_vectorstore(emb))
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if not isinstance(store, BaseStore):
        store = FileByteStore(store)
    return CachedEmbeddings(embeddings, store, model_namespace(embeddings), batch_size)


def cache_size(store: BaseStore[str, bytes], embeddings: Embeddings) -> int:
    """How many vectors of ``embeddings``' model ``store`` holds."""
    return sum(1 for _ in store.yield_keys(prefix=model_namespace(embeddings)))


def underlying(embeddings: Any) -> Any:
    """The model behind a cache wrapper (``embeddings`` itself when not wrapped)."""
    return getattr(embeddings, "underlying_embeddings", embeddings)
