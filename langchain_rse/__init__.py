"""langchain-rse: contextual hybrid retrieval with Relevant Segment Extraction for LangChain.

The names below are imported on first use (``from langchain_rse import RSERetriever`` loads
what the retriever needs), so ``import langchain_rse`` and the command start quickly. The
building blocks (``BM25Index``, ``fuse``, ``best_segments``, ``split_text``, ...) are
importable from their modules (see ``docs/architecture.md``).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.2.0"
"""The package's version: the one place it is written (hatchling reads it for the wheel)."""

if TYPE_CHECKING:
    from langchain_rse.embeddings import cached_embeddings
    from langchain_rse.enrichment import (
        BaseEnricher,
        ContextualEnricher,
        HeaderEnricher,
        NoEnricher,
    )
    from langchain_rse.expansion import QueryExpander
    from langchain_rse.indexing.chunking import combine_pages
    from langchain_rse.rerank import (
        BaseReranker,
        CohereReranker,
        CompressorReranker,
        EmbeddingReranker,
    )
    from langchain_rse.retriever import RSERetriever
    from langchain_rse.routing import DocumentRouter, LeadIndex
    from langchain_rse.segments import RSEParams

_MODULES = {
    "langchain_rse.embeddings": ["cached_embeddings"],
    "langchain_rse.enrichment": [
        "BaseEnricher",
        "ContextualEnricher",
        "HeaderEnricher",
        "NoEnricher",
    ],
    "langchain_rse.expansion": ["QueryExpander"],
    "langchain_rse.indexing.chunking": ["combine_pages"],
    "langchain_rse.rerank": [
        "BaseReranker",
        "CohereReranker",
        "CompressorReranker",
        "EmbeddingReranker",
    ],
    "langchain_rse.retriever": ["RSERetriever"],
    "langchain_rse.routing": ["DocumentRouter", "LeadIndex"],
    "langchain_rse.segments": ["RSEParams"],
}
_MODULE_OF = {name: module for module, names in _MODULES.items() for name in names}

__all__ = [
    "BaseEnricher",
    "BaseReranker",
    "CohereReranker",
    "CompressorReranker",
    "ContextualEnricher",
    "DocumentRouter",
    "EmbeddingReranker",
    "HeaderEnricher",
    "LeadIndex",
    "NoEnricher",
    "QueryExpander",
    "RSEParams",
    "RSERetriever",
    "cached_embeddings",
    "combine_pages",
]


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'langchain_rse' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # the next lookup finds it directly
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
