"""Index-time enrichment: a short context that situates each chunk in its document.

The context is prepended to the chunk's text for embedding and BM25 only; returned
segments always carry the original source text, and the context goes in metadata.

This module holds the interface (:class:`BaseEnricher`, :class:`NoEnricher`,
:func:`index_text`); two enrichers do real work:

* :class:`HeaderEnricher` (:mod:`~langchain_rse.enrichment.headers`, offline, deterministic):
  the document title plus the path of section headings (Markdown headings, numbered
  clauses, ``ARTICLE``/``Section`` headings, ALL-CAPS heading lines) above each chunk.
* :class:`ContextualEnricher` (:mod:`~langchain_rse.enrichment.contextual`): any LangChain
  chat model writes 1-3 sentences of context per chunk (Anthropic's "contextual
  retrieval"), with a persistent cache, bounded concurrency, retries, a header fallback,
  bounded prompts for long documents and usage accounting.

Every enricher has a :meth:`~BaseEnricher.fingerprint` naming what it writes.
"""

from __future__ import annotations

import asyncio
import json
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

from langchain_rse.indexing.chunking import Chunk
from langchain_rse.indexing.records import ChunkContext
from langchain_rse.indexing.recordstore import FileByteStore

__all__ = [
    "CHARS_PER_TOKEN",
    "HEADER_VERSION",
    "PROMPT_VERSION",
    "BaseEnricher",
    "ChunkContext",
    "ContextualEnricher",
    "EmptyContextError",
    "EnrichmentUsage",
    "FileByteStore",
    "HeaderEnricher",
    "HeaderOutline",
    "NoEnricher",
    "index_text",
    "sanitize_context",
]

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


# The enrichers import the interface above from this package.
from langchain_rse.enrichment.contextual import (  # noqa: E402
    CHARS_PER_TOKEN,
    PROMPT_VERSION,
    ContextualEnricher,
    EmptyContextError,
    EnrichmentUsage,
    sanitize_context,
)
from langchain_rse.enrichment.headers import (  # noqa: E402
    HEADER_VERSION,
    HeaderEnricher,
    HeaderOutline,
)
