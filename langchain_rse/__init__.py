"""langchain-rse: contextual hybrid retrieval with Relevant Segment Extraction for LangChain.

The names below are imported on first use (``from langchain_rse import RSERetriever`` loads
what the retriever needs), so ``import langchain_rse`` and the command start quickly.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.2.0"
"""The package's version: the one place it is written (hatchling reads it for the wheel)."""

if TYPE_CHECKING:
    from langchain_rse.chunking import Chunk, document_leads, split_text
    from langchain_rse.documents import LeadIndex
    from langchain_rse.embedding_cache import cached_embeddings
    from langchain_rse.enrichment import (
        BaseEnricher,
        ChunkContext,
        ContextualEnricher,
        HeaderEnricher,
        NoEnricher,
    )
    from langchain_rse.expansion import QueryExpander
    from langchain_rse.explain import DocumentExplanation, Explanation
    from langchain_rse.fusion import fuse
    from langchain_rse.lexical import BM25Index, tokenize
    from langchain_rse.pages import combine_pages
    from langchain_rse.rerank import (
        BaseReranker,
        CohereReranker,
        CompressorReranker,
        EmbeddingReranker,
        RerankError,
        RerankResult,
    )
    from langchain_rse.retriever import RSERetriever
    from langchain_rse.routing import DocumentRouter
    from langchain_rse.segments import PRESETS, RSEParams, best_segments

_MODULES = {
    "langchain_rse.chunking": ["Chunk", "document_leads", "split_text"],
    "langchain_rse.documents": ["LeadIndex"],
    "langchain_rse.embedding_cache": ["cached_embeddings"],
    "langchain_rse.enrichment": [
        "BaseEnricher",
        "ChunkContext",
        "ContextualEnricher",
        "HeaderEnricher",
        "NoEnricher",
    ],
    "langchain_rse.expansion": ["QueryExpander"],
    "langchain_rse.explain": ["DocumentExplanation", "Explanation"],
    "langchain_rse.fusion": ["fuse"],
    "langchain_rse.lexical": ["BM25Index", "tokenize"],
    "langchain_rse.pages": ["combine_pages"],
    "langchain_rse.rerank": [
        "BaseReranker",
        "CohereReranker",
        "CompressorReranker",
        "EmbeddingReranker",
        "RerankError",
        "RerankResult",
    ],
    "langchain_rse.retriever": ["RSERetriever"],
    "langchain_rse.routing": ["DocumentRouter"],
    "langchain_rse.segments": ["PRESETS", "RSEParams", "best_segments"],
}
_MODULE_OF = {name: module for module, names in _MODULES.items() for name in names}

__all__ = [
    "PRESETS",
    "BM25Index",
    "BaseEnricher",
    "BaseReranker",
    "Chunk",
    "ChunkContext",
    "CohereReranker",
    "CompressorReranker",
    "ContextualEnricher",
    "DocumentExplanation",
    "DocumentRouter",
    "EmbeddingReranker",
    "Explanation",
    "HeaderEnricher",
    "LeadIndex",
    "NoEnricher",
    "QueryExpander",
    "RSEParams",
    "RSERetriever",
    "RerankError",
    "RerankResult",
    "best_segments",
    "cached_embeddings",
    "combine_pages",
    "document_leads",
    "fuse",
    "split_text",
    "tokenize",
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
