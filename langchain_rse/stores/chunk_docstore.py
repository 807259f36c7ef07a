"""A FAISS docstore for the retriever's chunks that keeps no chunk text.

LangChain's ``FAISS`` keeps a ``Document`` per vector in its docstore: the enriched chunk
text, its metadata and the pydantic object around them, about 3 KB a chunk. The
retriever's record store already holds every source text with each chunk's offsets and
context, so the default local store keeps only each chunk's metadata, as compact JSON
bytes (about 250 bytes), and builds a ``Document`` with an empty ``page_content`` when
FAISS asks for one. Searching the store directly returns that metadata (``doc_id``,
``start_index``, ``end_index``…); the text is ``RSERetriever.get([doc_id])`` sliced there.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterator
from typing import Any

from langchain_core.documents import Document

with warnings.catch_warnings():  # langchain-community warns on import
    warnings.simplefilter("ignore", DeprecationWarning)
    from langchain_community.docstore.base import AddableMixin, Docstore

__all__ = ["ChunkDocstore"]


def _encode(metadata: dict[str, Any]) -> bytes:
    return json.dumps(metadata, ensure_ascii=False, separators=(",", ":")).encode()


class ChunkDocstore(Docstore, AddableMixin):
    """Each chunk's metadata by id, without its text (see the module docstring)."""

    def __init__(self, metadata: dict[str, dict[str, Any]] | None = None) -> None:
        self._meta: dict[str, bytes] = {k: _encode(v) for k, v in (metadata or {}).items()}

    def add(self, texts: dict[str, Document]) -> None:
        """Keep the metadata of these documents (their text is dropped); like
        ``InMemoryDocstore``, an id that is already present raises ``ValueError``."""
        overlapping = set(texts).intersection(self._meta)
        if overlapping:
            raise ValueError(f"Tried to add ids that already exist: {overlapping}")
        self._meta.update((i, _encode(doc.metadata)) for i, doc in texts.items())

    def delete(self, ids: list[str]) -> None:
        """Remove these ids (all of them must be present, as in ``InMemoryDocstore``)."""
        missing = set(ids).difference(self._meta)
        if missing:
            raise ValueError(f"Tried to delete ids that does not exist: {missing}")
        for i in ids:
            del self._meta[i]

    def search(self, search: str) -> str | Document:
        """The chunk with this id, text empty; a message string when it is unknown."""
        raw = self._meta.get(search)
        if raw is None:
            return f"ID {search} not found."
        return Document.model_construct(page_content="", metadata=json.loads(raw), id=search)

    def items(self) -> Iterator[tuple[str, dict[str, Any]]]:
        """``(id, metadata)`` of every chunk (for saving)."""
        return ((i, json.loads(raw)) for i, raw in self._meta.items())

    def __len__(self) -> int:
        return len(self._meta)

    def __repr__(self) -> str:
        return f"ChunkDocstore({len(self)} chunks)"
