"""``langchain-rse mcp INDEX``: the real server process, driven by the MCP SDK's own client.

The index is built in Python with the bundled offline model (the one the command loads
a saved index with), then served over stdio by ``python -m langchain_rse.cli mcp``.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import pytest
from langchain_core.documents import Document
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from servers import _server, free_port

from langchain_rse import RSERetriever
from langchain_rse.agents import MAX_READ_CHARS
from langchain_rse.indexing.chunking import combine_pages

ROOT = Path(__file__).resolve().parents[2]

HANDBOOK = (
    "# Employee Handbook\n\nStaff may work remotely from another country for up to 20 "
    "working days a year, approved by their manager two weeks ahead.\n\n## Travel\n\n"
    "Economy class is standard for flights under six hours; hotels are reimbursed up to "
    "EUR 160 per night.\n"
)
LEASE_PAGES = [
    "OFFICE LEASE\n\nThe tenant pays rent of EUR 2,000 monthly in advance.",
    "TERMINATION\n\nThe tenant may terminate the lease with three months written notice.",
]


def source_documents() -> dict[str, Document]:
    lease = combine_pages(
        [
            Document(text, metadata={"source": "contracts/lease.pdf", "title": "Office Lease"})
            for text in LEASE_PAGES
        ]
    )
    lease.id = "contracts/lease.pdf"  # a doc id with a slash
    handbook = Document(HANDBOOK, id="handbook.md", metadata={"source": "handbook.md"})
    return {"contracts/lease.pdf": lease, "handbook.md": handbook}


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("mcp") / "idx"
    RSERetriever.from_documents(source_documents().values()).save(path)
    return path


def server(index: Path) -> StdioServerParameters:
    env = {"PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return StdioServerParameters(
        command=sys.executable, args=["-m", "langchain_rse.cli", "mcp", str(index)], env=env
    )


@asynccontextmanager
async def connect(index: Path) -> AsyncIterator[ClientSession]:
    """A client session with the real server process (started, then stopped)."""
    with anyio.fail_after(180):
        async with (
            stdio_client(server(index)) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            yield session


async def test_search_then_read_the_cited_range_over_stdio(index: Path) -> None:
    sources = source_documents()
    async with connect(index) as session:
        tools = await session.list_tools()
        found = await session.call_tool(
            "search", {"query": "How long may I work remotely from abroad?", "k": 1}
        )
        paged = await session.call_tool(
            "search", {"query": "terminate the lease notice", "queries": ["end the lease"]}
        )
        hit = found.structured_content["sources"][0]
        paged_sources = paged.structured_content["sources"]
        lease = next(s for s in paged_sources if s["doc_id"] == "contracts/lease.pdf")
        wider = (max(0, lease["start"] - 10), len(sources["contracts/lease.pdf"].page_content))
        reads = [
            await session.call_tool("read", {"doc_id": doc_id, "start": start, "end": end})
            for doc_id, start, end in [
                (hit["doc_id"], hit["start"], hit["end"]),  # a cited range
                ("contracts/lease.pdf", *wider),  # around one
                ("nope.md", 0, 5),
                ("handbook.md", 5, len(HANDBOOK) + 1),
                ("handbook.md", 9, 9),
                ("handbook.md", -1, 9),
            ]
        ]
    by_name = {tool.name: tool for tool in tools.tools}
    assert set(by_name) == {"search", "read"}
    assert set(by_name["search"].input_schema["properties"]) == {
        "query",
        "k",
        "queries",
        "max_chars",
    }
    assert "sources" in by_name["search"].output_schema["properties"]
    assert by_name["read"].annotations.read_only_hint is True

    # what a model reads: numbered sources with the exact text; structured: the ranges
    assert not found.is_error
    assert len(found.structured_content["sources"]) == 1
    text = sources[hit["doc_id"]].page_content
    assert hit["doc_id"] == "handbook.md" and hit["n"] == 1
    assert hit["text"] == text[hit["start"] : hit["end"]] and "20 working days" in hit["text"]
    shown = found.content[0].text
    assert shown.startswith(f"[1] handbook.md, characters {hit['start']}–{hit['end']}\n")
    assert f'<source n="1">\n{hit["text"]}\n</source>' in shown

    assert lease["title"] == "Office Lease" and lease["source"] == "contracts/lease.pdf"
    assert lease["page_end"] == 2 and "three months" in lease["text"]
    assert re.search(
        rf"\[{lease['n']}\] Office Lease \(contracts/lease.pdf\), pages? ", paged.content[0].text
    )

    # read a cited range (and a wider one) back: the exact slice of the source
    lease_text = sources["contracts/lease.pdf"].page_content
    exact, around, unknown, past_end, empty, negative = reads
    assert not exact.is_error and exact.content[0].text == text[hit["start"] : hit["end"]]
    assert around.content[0].text == lease_text[wider[0] : wider[1]]
    assert unknown.is_error
    assert "no indexed document with doc_id 'nope.md'" in unknown.content[0].text
    assert past_end.is_error and f"has {len(HANDBOOK)} characters" in past_end.content[0].text
    assert empty.is_error and negative.is_error


async def test_read_is_bounded(tmp_path: Path) -> None:
    long = Document("word " * (MAX_READ_CHARS // 4), id="long.txt", metadata={"source": "long.txt"})
    path = tmp_path / "idx"
    RSERetriever.from_documents([long]).save(path)
    async with connect(path) as session:
        too_long, most = [
            await session.call_tool("read", {"doc_id": "long.txt", "start": s, "end": e})
            for s, e in [(0, MAX_READ_CHARS + 1), (1, MAX_READ_CHARS + 1)]
        ]
    assert too_long.is_error and "read at most 20,000 at a time" in too_long.content[0].text
    assert most.content[0].text == long.page_content[1 : MAX_READ_CHARS + 1]


async def test_streamable_http_on_localhost(index: Path, tmp_path: Path) -> None:
    port = free_port()
    command = [sys.executable, "-m", "langchain_rse.cli", "mcp", str(index), "--http", str(port)]
    with _server(command, port, "langchain-rse mcp --http", tmp_path / "mcp.log"):
        with anyio.fail_after(120):
            async with (
                streamable_http_client(f"http://127.0.0.1:{port}/mcp") as (read, write),
                ClientSession(read, write) as session,
            ):
                await session.initialize()
                found = await session.call_tool("search", {"query": "hotel per night", "k": 1})
                (hit,) = found.structured_content["sources"]
                again = await session.call_tool(
                    "read", {"doc_id": hit["doc_id"], "start": hit["start"], "end": hit["end"]}
                )
    assert hit["doc_id"] == "handbook.md" and "EUR 160 per night" in hit["text"]
    assert again.content[0].text == HANDBOOK[hit["start"] : hit["end"]] == hit["text"]
