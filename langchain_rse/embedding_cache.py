"""Embeddings cached by model and text, so an interrupted indexing run resumes cheaply.

:func:`cached_embeddings` wraps any LangChain ``Embeddings`` in LangChain's own
``CacheBackedEmbeddings`` over a byte store — by default files next to the index, written
atomically (a process killed mid-write leaves no half-written vector). Every batch of
``batch_size`` texts is stored as soon as it is embedded: a run killed half-way, started
again, embeds only the chunks it had not finished. Keys are the model's name and a SHA-256
of the text, so two models never share vectors and a changed chunk is embedded again.
"""

from __future__ import annotations

import os
import re
from typing import Any

from langchain_core.embeddings import Embeddings
from langchain_core.stores import BaseStore

from langchain_rse.byte_store import FileByteStore

__all__ = [
    "EMBEDDING_CACHE_DIR",
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


def cached_embeddings(
    embeddings: Embeddings,
    store: BaseStore[str, bytes] | str | os.PathLike[str],
    *,
    batch_size: int = 32,
) -> Any:
    """``embeddings`` with document vectors cached in ``store`` (a byte store, or a folder).

    Returns a ``langchain_classic.embeddings.CacheBackedEmbeddings`` (install
    ``langchain-rse[local]``), whose ``underlying_embeddings`` is ``embeddings``; queries
    are not cached. Use it as the vector store's embedding, e.g.::

        emb = cached_embeddings(LocalEmbeddings(), "./idx/embedding_cache")
        retriever = RSERetriever(vectorstore=default_vectorstore(emb))
    """
    try:
        from langchain_classic.embeddings import CacheBackedEmbeddings
    except ImportError as exc:  # pragma: no cover - depends on extras
        raise ImportError(
            'cached_embeddings needs langchain-classic: pip install "langchain-rse[local]"'
        ) from exc
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if not isinstance(store, BaseStore):
        store = FileByteStore(store)
    return CacheBackedEmbeddings.from_bytes_store(
        embeddings,
        store,
        namespace=model_namespace(embeddings),
        batch_size=batch_size,
        key_encoder="sha256",
    )


def cache_size(store: BaseStore[str, bytes], embeddings: Embeddings) -> int:
    """How many vectors of ``embeddings``' model ``store`` holds."""
    return sum(1 for _ in store.yield_keys(prefix=model_namespace(embeddings)))


def underlying(embeddings: Any) -> Any:
    """The model behind a cache wrapper (``embeddings`` itself when not wrapped)."""
    return getattr(embeddings, "underlying_embeddings", embeddings)
