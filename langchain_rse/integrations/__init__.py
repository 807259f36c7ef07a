"""Adapters that make third-party stores fit the retriever's store contracts.

Each adapter lives in its own module and imports its store's package there, so
``import langchain_rse`` never needs them::

    from langchain_rse.integrations.milvus import MilvusLexicalStore  # needs langchain-milvus
"""

from __future__ import annotations

from langchain_core.vectorstores import InMemoryVectorStore, VectorStore

__all__ = ["vectorstore_kind"]


def vectorstore_kind(vs: VectorStore) -> str:
    """``"faiss"``, ``"in_memory"`` or ``"external"`` (saved elsewhere by its owner)."""
    from langchain_rse.integrations.faiss import FaissStore, is_langchain_faiss

    # ours, or LangChain's FAISS itself (not a user's subclass of it)
    if isinstance(vs, FaissStore) or (is_langchain_faiss(vs) and type(vs).__name__ == "FAISS"):
        return "faiss"
    if isinstance(vs, InMemoryVectorStore):
        return "in_memory"
    return "external"
