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

from langchain_rse.enrichment.base import BaseEnricher, NoEnricher, index_text
from langchain_rse.enrichment.contextual import (
    CHARS_PER_TOKEN,
    PROMPT_VERSION,
    ContextualEnricher,
    EmptyContextError,
    EnrichmentUsage,
    sanitize_context,
)
from langchain_rse.enrichment.headers import (
    HEADER_VERSION,
    HeaderEnricher,
    HeaderOutline,
)
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
