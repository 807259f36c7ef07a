"""The enricher interface (:class:`BaseEnricher`, :class:`NoEnricher`, :func:`index_text`)
and the text helpers the enrichers share; :mod:`langchain_rse.enrichment` exports them."""

from __future__ import annotations

import asyncio
import json
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

from langchain_rse.indexing.chunking import Chunk
from langchain_rse.indexing.records import ChunkContext

__all__ = ["BaseEnricher", "NoEnricher", "clip", "collapse", "index_text"]

_PACKAGE = "langchain_rse.enrichment"


def index_text(context: ChunkContext, chunk_text: str) -> str:
    """The text that is embedded and BM25-indexed for a chunk."""
    return f"{context.text}\n\n{chunk_text}" if context.text else chunk_text


class BaseEnricher(ABC):
    """Writes one :class:`ChunkContext` per chunk of a document."""

    @abstractmethod
    def enrich(
        self, doc_id: str, text: str, metadata: dict[str, Any], chunks: Sequence[Chunk]
    ) -> list[ChunkContext]:
        """Contexts for ``chunks`` of the document ``text``, in the same order."""

    async def aenrich(
        self, doc_id: str, text: str, metadata: dict[str, Any], chunks: Sequence[Chunk]
    ) -> list[ChunkContext]:
        """Async :meth:`enrich`; the default runs it in a thread."""
        return await asyncio.to_thread(self.enrich, doc_id, text, metadata, chunks)

    def fingerprint(self) -> str:
        """A stable string naming what this enricher writes (the retriever versions
        documents by it: a new fingerprint re-indexes them).

        It depends only on what changes the contexts produced: the class (module and
        qualified name; classes of this package go by ``langchain_rse.enrichment``, so moving
        them between its modules changes nothing) and the settings that shape the text,
        never on ``repr()``, memory addresses, concurrency, retries, timeouts, the cache or
        progress bars. The default is the class name alone; a subclass whose options change
        its output should override :meth:`fingerprint_settings`.
        """
        settings = self.fingerprint_settings()
        if not settings:
            return self._fingerprint_name()
        body = json.dumps(settings, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
        return f"{self._fingerprint_name()}{body}"

    def fingerprint_settings(self) -> dict[str, Any]:
        """The JSON-serialisable settings that :meth:`fingerprint` includes (default: none)."""
        return {}

    def _fingerprint_name(self) -> str:
        cls = type(self)
        module = cls.__module__
        if module.startswith(_PACKAGE + "."):
            module = _PACKAGE  # the public import path, whichever submodule defines it
        return f"{module}.{cls.__qualname__}"

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class NoEnricher(BaseEnricher):
    """Index the chunk text as it is."""

    def enrich(
        self, doc_id: str, text: str, metadata: dict[str, Any], chunks: Sequence[Chunk]
    ) -> list[ChunkContext]:
        return [ChunkContext("", "none") for _ in chunks]


# --------------------------------------------------------------------------------------
# Small text helpers (shared by the header and the LLM enricher)
# --------------------------------------------------------------------------------------


def collapse(text: str) -> str:
    """Collapse every run of whitespace to one space and strip the ends."""
    return " ".join(text.split())


def clip(text: str, max_chars: int) -> str:
    """``text`` cut to at most ``max_chars`` characters, at a word boundary when possible."""
    if len(text) <= max_chars:
        return text
    if max_chars <= 1:
        return text[:max_chars]
    cut = text[: max_chars - 1]
    space = cut.rfind(" ")
    if space >= max_chars // 2:
        cut = cut[:space]
    return cut.rstrip(" ,;:-") + "…"
