"""LangChain's standard test suites: retriever, retriever tool, and ``DocumentIndex``."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Generator
from typing import Any

import pytest
from langchain_core.embeddings import DeterministicFakeEmbedding
from langchain_core.tools import BaseTool, create_retriever_tool
from langchain_core.vectorstores import InMemoryVectorStore
from langchain_tests.integration_tests import RetrieversIntegrationTests, ToolsIntegrationTests
from langchain_tests.integration_tests.indexer import (
    AsyncDocumentIndexTestSuite,
    DocumentIndexerTestSuite,
)
from langchain_tests.unit_tests import ToolsUnitTests

from conftest import corpus_documents
from helpers import HashingEmbeddings
from langchain_rse import RSERetriever


def build_retriever(**kwargs: Any) -> RSERetriever:
    return RSERetriever.from_documents(corpus_documents(), embedding=HashingEmbeddings(), **kwargs)


class TestRSERetrieverStandard(RetrieversIntegrationTests):
    @property
    def retriever_constructor(self) -> type[RSERetriever]:
        return build_retriever  # type: ignore[return-value]

    @property
    def retriever_constructor_params(self) -> dict[str, Any]:
        return {"k": 2}

    @property
    def retriever_query_example(self) -> str:
        return "termination provisions of the agreement"


class TestRSERetrieverChunksStandard(TestRSERetrieverStandard):
    @property
    def retriever_constructor_params(self) -> dict[str, Any]:
        return {"k": 2, "mode": "chunks"}


def _tool() -> BaseTool:
    return create_retriever_tool(
        build_retriever(k=3),
        "search_contracts",
        "Search the contracts; returns the relevant passages.",
        response_format="content_and_artifact",
    )


class TestRetrieverToolUnit(ToolsUnitTests):
    @property
    def tool_constructor(self) -> BaseTool:
        return _tool()

    @property
    def tool_invoke_params_example(self) -> dict[str, Any]:
        return {"query": "termination provisions"}


class TestRetrieverToolIntegration(ToolsIntegrationTests):
    @property
    def tool_constructor(self) -> BaseTool:
        return _tool()

    @property
    def tool_invoke_params_example(self) -> dict[str, Any]:
        return {"query": "termination provisions"}


def _empty_index() -> RSERetriever:
    """A fresh, empty retriever over an in-memory vector store with a deterministic embedding."""
    return RSERetriever(vectorstore=InMemoryVectorStore(DeterministicFakeEmbedding(size=16)))


class TestRSERetrieverDocumentIndex(DocumentIndexerTestSuite):
    @pytest.fixture
    def index(self) -> Generator[RSERetriever, None, None]:
        yield _empty_index()


class TestRSERetrieverAsyncDocumentIndex(AsyncDocumentIndexTestSuite):
    @pytest.fixture
    async def index(self) -> AsyncGenerator[RSERetriever, None]:
        yield _empty_index()
