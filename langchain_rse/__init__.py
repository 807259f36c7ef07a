"""langchain-rse: contextual hybrid retrieval with Relevant Segment Extraction for LangChain."""

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
