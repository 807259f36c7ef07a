"""Index-time enrichment: a short context that situates each chunk in its document.

The context is prepended to the chunk's text for embedding and BM25 only; returned
segments always carry the original source text, and the context goes in metadata.

Two enrichers do real work:

* :class:`HeaderEnricher` (offline, deterministic): the document title plus the path of
  section headings (Markdown headings, numbered clauses, ``ARTICLE``/``Section`` headings,
  ALL-CAPS heading lines) above each chunk.
* :class:`ContextualEnricher`: any LangChain chat model writes 1-3 sentences of context per
  chunk (Anthropic's "contextual retrieval"), with a persistent cache, bounded concurrency,
  retries, a header fallback, bounded prompts for long documents and usage accounting.

Modules: :mod:`~langchain_rse.enrichment.base` (the interface),
:mod:`~langchain_rse.enrichment.headers` and :mod:`~langchain_rse.enrichment.contextual`.
Every enricher has a :meth:`~BaseEnricher.fingerprint` naming what it writes.
"""

from langchain_rse.byte_store import FileByteStore
from langchain_rse.enrichment.base import BaseEnricher, ChunkContext, NoEnricher, index_text
from langchain_rse.enrichment.contextual import (
    CHARS_PER_TOKEN,
    PROMPT_VERSION,
    ContextualEnricher,
    EmptyContextError,
    EnrichmentUsage,
    sanitize_context,
)
from langchain_rse.enrichment.headers import HEADER_VERSION, HeaderEnricher, HeaderOutline

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
