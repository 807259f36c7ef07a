"""LangChain's standard test suites for the retriever and for a retriever tool."""

from __future__ import annotations

from typing import Any

from langchain_core.tools import BaseTool, create_retriever_tool
from langchain_tests.integration_tests import RetrieversIntegrationTests, ToolsIntegrationTests
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
