"""An MCP server over an ``RSERetriever``: ``langchain-rse mcp INDEX``.

Built with the official MCP Python SDK (``pip install "langchain-rse[mcp]"``). Two tools:

- ``search(query, k, queries)``: the numbered sources an agent reads (as
  :func:`~langchain_rse.tool.format_sources` writes them), plus structured output: per
  source its ``doc_id``, ``source``, ``title``, ``start``, ``end``, pages, score and text.
- ``read(doc_id, start, end)``: the exact characters ``start:end`` of an indexed document
  (at most :data:`MAX_READ_CHARS`), to quote a cited range or read around it.

Serves over stdio by default, or streamable HTTP on 127.0.0.1 only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

from langchain_core.documents import Document
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import CallToolResult, TextContent, ToolAnnotations
from pydantic import BaseModel, Field

from langchain_rse.pipeline import MIN_MAX_CHARS
from langchain_rse.tool import MAX_K, format_sources

if TYPE_CHECKING:
    from langchain_rse.retriever import RSERetriever

__all__ = ["MAX_READ_CHARS", "SearchResult", "Source", "build_server", "serve"]

MAX_READ_CHARS = 20_000
"""The most characters one ``read`` call returns."""

INSTRUCTIONS = (
    "Search a document index. `search` returns numbered sources with their exact text and "
    "character ranges; cite them by number. `read` returns the exact characters of a "
    "document (by the doc_id and range a search gave) to quote it or read around it."
)


class Source(BaseModel):
    """One numbered source of a ``search`` result."""

    n: int = Field(description="The source's number, as cited: [n].")
    doc_id: str = Field(description="The document's id, for `read`.")
    source: str | None = Field(description="The document's source (file or URL).")
    title: str | None = Field(description="The document's title.")
    start: int = Field(description="Start character offset in the document.")
    end: int = Field(description="End character offset (exclusive).")
    page_start: int | None = Field(default=None, description="First page, if paged.")
    page_end: int | None = Field(default=None, description="Last page, if paged.")
    score: float = Field(description="Relevance score (compares results of one query).")
    text: str = Field(description="The exact text: the document's characters start:end.")


class SearchResult(BaseModel):
    """The sources of a ``search`` call, best first."""

    sources: list[Source]


def _source(n: int, doc: Document) -> Source:
    meta = doc.metadata
    return Source(
        n=n,
        doc_id=str(meta["doc_id"]),
        source=None if meta.get("source") is None else str(meta["source"]),
        title=None if meta.get("title") is None else str(meta["title"]),
        start=meta["start_index"],
        end=meta["end_index"],
        page_start=meta.get("page_start"),
        page_end=meta.get("page_end"),
        score=meta["score"],
        text=doc.page_content,
    )


def build_server(retriever: RSERetriever, *, name: str = "langchain-rse") -> MCPServer:
    """An MCP server with ``search`` and ``read`` tools over ``retriever``.

    Args:
        retriever: The retriever to serve (its bound ``filter``, if any, always applies).
        name: The server's name, as clients show it.

    Returns:
        The server; run it with ``server.run()`` (stdio) or :func:`serve`.
    """
    server: MCPServer = MCPServer(name, instructions=INSTRUCTIONS)
    read_only = ToolAnnotations(read_only_hint=True, open_world_hint=False)

    @server.tool(annotations=read_only)
    async def search(
        query: Annotated[str, Field(description="What to look for: a question or keywords.")],
        k: Annotated[
            int | None, Field(ge=1, le=MAX_K, description="The most sources to return.")
        ] = None,
        queries: Annotated[
            list[str] | None, Field(description="Other phrasings, searched too.")
        ] = None,
        max_chars: Annotated[
            int | None,
            Field(ge=MIN_MAX_CHARS, description="The most characters of text to return."),
        ] = None,
    ) -> Annotated[CallToolResult, SearchResult]:
        """Search the indexed documents. Returns numbered sources [1], [2], ...: each names
        its title or file, pages and character range, followed by its exact text."""
        try:
            docs = await retriever.ainvoke(query, k=k, queries=queries, max_chars=max_chars)
        except ValueError as exc:
            raise ToolError(str(exc)) from exc
        text, _ = format_sources(docs)
        sources = [_source(n, doc) for n, doc in enumerate(docs, start=1)]
        return CallToolResult(
            content=[TextContent(type="text", text=text)],
            structured_content=SearchResult(sources=sources).model_dump(mode="json"),
        )

    @server.tool(annotations=read_only)
    async def read(
        doc_id: Annotated[str, Field(description="The document's id, as `search` gave it.")],
        start: Annotated[int, Field(ge=0, description="Start character offset.")],
        end: Annotated[int, Field(ge=0, description="End character offset (exclusive).")],
    ) -> str:
        """The exact characters start:end of an indexed document (at most 20,000), e.g. a
        cited range, or a wider one around it."""
        documents = await retriever.aget([doc_id])
        if not documents:
            raise ToolError(f"no indexed document with doc_id {doc_id!r}")
        text = documents[0].page_content
        if not start < end <= len(text):
            raise ToolError(
                f"range {start}-{end} is not within document {doc_id!r}, which has "
                f"{len(text)} characters (need start < end <= {len(text)})"
            )
        if end - start > MAX_READ_CHARS:
            raise ToolError(
                f"range {start}-{end} is {end - start:,} characters; read at most "
                f"{MAX_READ_CHARS:,} at a time"
            )
        return text[start:end]

    return server


def serve(retriever: RSERetriever, http_port: int | None = None) -> None:
    """Serve ``retriever`` over stdio, or streamable HTTP on ``127.0.0.1:http_port``
    (path ``/mcp``) when a port is given. Returns when the client disconnects (stdio)."""
    server = build_server(retriever)
    if http_port is None:
        server.run()
    else:
        server.run("streamable-http", host="127.0.0.1", port=http_port)
