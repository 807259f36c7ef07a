"""Agents' access to an ``RSERetriever``: a LangChain tool and an MCP server.

**The tool.** :func:`create_search_tool` (or :meth:`RSERetriever.as_tool`) returns a
LangChain tool with ``response_format="content_and_artifact"``. The model reads numbered
sources, each with its title or file, pages and character range, followed by its exact text::

    [1] Office Lease (lease.md), pages 2–3, characters 120–480
    <source n="1">
    The tenant may terminate the lease with three months notice.
    </source>

The ``ToolMessage`` artifact is the list of segment ``Document``s, in the same order:
source ``[n]`` is ``artifact[n - 1]``, whose metadata holds ``source``, ``doc_id``,
``start_index`` and ``end_index``, so an answer that cites ``[n]`` can be traced to the
exact characters of its source.

**The MCP server** (``langchain-rse mcp INDEX``), built with the official MCP Python SDK
(``pip install "langchain-rse[mcp]"``), has two tools:

- ``search(query, k, queries)``: the numbered sources an agent reads (as
  :func:`format_sources` writes them), plus structured output: per source its ``doc_id``,
  ``source``, ``title``, ``start``, ``end``, pages, score and text.
- ``read(doc_id, start, end)``: the exact characters ``start:end`` of an indexed document
  (at most :data:`MAX_READ_CHARS`), to quote a cited range or read around it.

Serves over stdio by default, or streamable HTTP on 127.0.0.1 only.
"""

# No ``from __future__ import annotations``: the MCP SDK reads the annotations of the tools
# defined inside :func:`build_server`, whose types are imported there (``mcp`` is optional).
from collections.abc import Sequence
from typing import TYPE_CHECKING, Annotated, Any

from langchain_core.callbacks import Callbacks
from langchain_core.documents import Document
from langchain_core.messages.content import (
    Citation,
    TextContentBlock,
    create_citation,
    create_text_block,
)
from langchain_core.tools import BaseTool, StructuredTool, ToolException
from pydantic import BaseModel, ConfigDict, Field

from langchain_rse.pipeline import MIN_MAX_CHARS

if TYPE_CHECKING:
    from langchain_core.indexing import DocumentIndex
    from mcp.server.mcpserver import MCPServer

__all__ = [
    "MAX_READ_CHARS",
    "FilteredSearchArgs",
    "SearchArgs",
    "SearchResult",
    "Source",
    "build_server",
    "create_search_tool",
    "format_sources",
    "serve",
]

MAX_K = 20
"""The most sources a model may ask for in one call."""

DEFAULT_DESCRIPTION = (
    "Search the indexed documents. Returns numbered sources [1], [2], ...: each names its "
    "title or file, pages and character range, followed by its exact text between "
    '<source n="..."> and </source>. Quote the text as given and cite sources by number.'
)

NO_SOURCES = "No relevant sources found."


class SearchArgs(BaseModel):
    """What the model passes to the search tool.

    Every field but ``query`` is passed on to ``RSERetriever.invoke`` under its own name
    when the model sets it, so a new ``invoke`` argument is one more field here.
    """

    model_config = ConfigDict(extra="forbid")

    query: str = Field(description="What to look for: a question or keywords.")
    queries: list[str] | None = Field(
        default=None,
        description="Other phrasings of the same request, searched too (results are fused).",
    )
    k: int | None = Field(default=None, ge=1, le=MAX_K, description="The most sources to return.")
    max_chars: int | None = Field(
        default=None,
        ge=MIN_MAX_CHARS,
        description="The most characters of source text to return in all (a context budget).",
    )


class FilteredSearchArgs(SearchArgs):
    """:class:`SearchArgs` and a metadata ``filter`` (only with ``allow_filter=True``)."""

    filter: dict[str, Any] | None = Field(
        default=None,
        description='Metadata filter that narrows the search, e.g. {"year": {"$gte": 2020}} '
        "(operators $eq $ne $in $nin $gt $gte $lt $lte $and $or).",
    )


def _label(n: int, meta: dict[str, Any]) -> str:
    """``[n] title (source), pages a–b, characters s–e`` (and ``id ...`` when the doc id
    is neither the title nor the source, so the model can name it)."""
    title, source, doc_id = meta.get("title"), meta.get("source"), meta.get("doc_id")
    name = str(title or source or doc_id)
    if title and source and str(source) != str(title):
        name = f"{title} ({source})"
    parts = [f"[{n}] {name}"]
    if doc_id is not None and str(doc_id) not in (str(title), str(source)):
        parts.append(f"id {doc_id}")
    if "page_start" in meta:
        first, last = meta["page_start"], meta["page_end"]
        parts.append(f"page {first}" if first == last else f"pages {first}–{last}")
    parts.append(f"characters {meta['start_index']}–{meta['end_index']}")
    return ", ".join(parts)


def format_sources(documents: Sequence[Document]) -> tuple[str, list[Citation]]:
    """The numbered sources as the model reads them, and one citation per source.

    Each citation's ``start_index``/``end_index`` locate the source's exact text in the
    returned string (as LangChain's ``Citation`` defines them); ``cited_text`` is that
    text, ``url`` the document's ``source``, and ``extras`` hold ``n``, ``doc_id`` and the
    range in the source document (``source_start``, ``source_end``, pages).

    Args:
        documents: Segments returned by ``RSERetriever.invoke``.

    Returns:
        The text and the citations (empty when there are no documents).
    """
    if not documents:
        return NO_SOURCES, []
    text, citations = "", []
    for n, doc in enumerate(documents, start=1):
        meta = doc.metadata
        if n > 1:
            text += "\n\n"
        text += f'{_label(n, meta)}\n<source n="{n}">\n'
        start = len(text)
        text += doc.page_content
        pages = {key: meta[key] for key in ("page_start", "page_end") if key in meta}
        citations.append(
            create_citation(
                url=str(meta["source"]) if meta.get("source") is not None else None,
                title=str(meta.get("title") or meta.get("source") or meta.get("doc_id")),
                start_index=start,
                end_index=len(text),
                cited_text=doc.page_content,
                n=n,
                doc_id=meta.get("doc_id"),
                source_start=meta.get("start_index"),
                source_end=meta.get("end_index"),
                **pages,
            )
        )
        text += "\n</source>"
    return text, citations


def _content(documents: Sequence[Document]) -> list[TextContentBlock]:
    text, citations = format_sources(documents)
    return [create_text_block(text, annotations=list(citations) or None)]


def create_search_tool(
    retriever: "DocumentIndex",
    *,
    name: str = "search",
    description: str | None = None,
    allow_filter: bool = False,
) -> BaseTool:
    """A tool that searches ``retriever`` and returns sources an agent can cite.

    The tool's content is one text content block (LangChain's ``TextContentBlock``)
    holding the numbered sources, annotated with one ``Citation`` per source (see
    :func:`format_sources`). Chat model integrations send the block's text and drop the
    annotations (``ToolMessage.text`` is that text), so any model reads the same plain
    numbered sources; code gets the citations from ``content[0]["annotations"]`` and the
    segment ``Document``s from ``ToolMessage.artifact``.

    Setup:
        .. code-block:: python

            from langchain.agents import create_agent

            tool = retriever.as_tool(name="search_contracts")
            agent = create_agent("openai:gpt-5-mini", tools=[tool])

    Args:
        retriever: The retriever to search; its bound ``filter`` always applies.
        name: The tool's name.
        description: What the model is told about the tool (a default explains the
            numbered sources).
        allow_filter: Offer the model a ``filter`` argument. The call's filter narrows
            the retriever's bound ``filter`` and can never widen it; leave it ``False``
            unless the model may choose among all the documents the retriever can see.

    Returns:
        A ``StructuredTool`` (sync and async) with ``response_format="content_and_artifact"``.
        Input the retriever rejects (an empty query, a malformed filter) comes back to the
        model as an error message.
    """
    schema = FilteredSearchArgs if allow_filter else SearchArgs

    def options(args: dict[str, Any], callbacks: Callbacks) -> dict[str, Any]:
        return {
            "config": {"callbacks": callbacks},
            **{key: value for key, value in args.items() if value is not None},
        }

    def search(
        query: str, callbacks: Callbacks = None, **args: Any
    ) -> tuple[list[TextContentBlock], list[Document]]:
        try:
            documents = retriever.invoke(query, **options(args, callbacks))
        except ValueError as exc:
            raise ToolException(str(exc)) from exc
        return _content(documents), documents

    async def asearch(
        query: str, callbacks: Callbacks = None, **args: Any
    ) -> tuple[list[TextContentBlock], list[Document]]:
        try:
            documents = await retriever.ainvoke(query, **options(args, callbacks))
        except ValueError as exc:
            raise ToolException(str(exc)) from exc
        return _content(documents), documents

    return StructuredTool.from_function(
        func=search,
        coroutine=asearch,
        name=name,
        description=description or DEFAULT_DESCRIPTION,
        args_schema=schema,
        response_format="content_and_artifact",
        handle_tool_error=True,
    )


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


def build_server(retriever: "DocumentIndex", *, name: str = "langchain-rse") -> "MCPServer":
    """An MCP server with ``search`` and ``read`` tools over ``retriever``.

    Args:
        retriever: The retriever to serve (its bound ``filter``, if any, always applies).
        name: The server's name, as clients show it.

    Returns:
        The server; run it with ``server.run()`` (stdio) or :func:`serve`.
    """
    from mcp.server.mcpserver import MCPServer
    from mcp.server.mcpserver.exceptions import ToolError
    from mcp.types import CallToolResult, TextContent, ToolAnnotations

    server = MCPServer(name, instructions=INSTRUCTIONS)
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


def serve(retriever: "DocumentIndex", http_port: int | None = None) -> None:
    """Serve ``retriever`` over stdio, or streamable HTTP on ``127.0.0.1:http_port``
    (path ``/mcp``) when a port is given. Returns when the client disconnects (stdio)."""
    server = build_server(retriever)
    if http_port is None:
        server.run()
    else:
        server.run("streamable-http", host="127.0.0.1", port=http_port)
