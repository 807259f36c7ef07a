"""``langchain-rse mcp INDEX``: the real server process, driven by the MCP SDK's own client
in both protocol eras it speaks: the ``initialize`` handshake (2025-11-25, ``mode="legacy"``)
and the stateless per-request envelope found by ``server/discover`` (2026-07-28,
``mode="auto"``).

The index is built in Python with the bundled offline model (the one the command loads
a saved index with), then served over stdio by ``python -m langchain_rse.cli mcp``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from langchain_core.documents import Document
from langchain_core.vectorstores import InMemoryVectorStore
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.exceptions import MCPError
from mcp.types import ResourceLink
from servers import _server, free_port
from test_agent_tool import bad_argument

from helpers import HashingEmbeddings
from langchain_rse import RSERetriever
from langchain_rse.agents import (
    DOCUMENT_URI,
    MAX_READ_CHARS,
    SearchArgs,
    build_server,
    document_uri,
)
from langchain_rse.indexing.chunking import combine_pages

ROOT = Path(__file__).resolve().parents[2]
ERAS = {"legacy": "2025-11-25", "auto": "2026-07-28"}

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
LONG = "word " * (MAX_READ_CHARS // 4)


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


def env() -> dict[str, str]:
    return {"PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}


def stdio(index: Path) -> StdioServerParameters:
    return StdioServerParameters(
        command=sys.executable, args=["-m", "langchain_rse.cli", "mcp", str(index)], env=env()
    )


def text(result: Any) -> str:
    return result.content[0].text


def tool_error(args: dict[str, Any]) -> str:
    """What the LangChain tool answers to ``args`` (an error message)."""
    tool = RSERetriever.from_documents([Document("x y z")], show_progress=False).as_tool()
    message = tool.invoke({"type": "tool_call", "id": "c", "name": "search", "args": args})
    assert message.status == "error"
    return message.text


BAD_SEARCHES = [
    {"query": "lease", "filter": {"source": "handbook.md"}},  # the tool takes no filter
    {"query": "lease", "k": 50},
    {"query": "lease", "queries": ["a", "b", "c", "d", "e", "f"]},  # more than 5: refused
    {"query": "lease", "max_chars": 10**400},
    {"query": "lease", "max_chars": 99},
    {"query": ""},
    {"query": "\x01\x02"},
    {"k": 1},
]


@pytest.mark.parametrize("mode", list(ERAS))
async def test_search_fetch_and_resources_over_stdio(index: Path, mode: str) -> None:
    sources = source_documents()
    with anyio.fail_after(180):
        async with Client(stdio(index), mode=mode) as client:
            version = client.protocol_version
            handshake = (client.session.initialize_result, client.session.discover_result)
            tools = {tool.name: tool for tool in (await client.list_tools()).tools}
            found = await client.call_tool(
                "search", {"query": "How long may I work remotely from abroad?", "k": 1}
            )
            paged = await client.call_tool(
                "search", {"query": "terminate the lease notice", "queries": ["end the lease"]}
            )
            bad = [await client.call_tool("search", args) for args in BAD_SEARCHES]
            fetches = [
                await client.call_tool("fetch", args)
                for args in [
                    {"id": "handbook.md", "start": 5, "end": len(HANDBOOK) + 100},  # past the end
                    {"id": "contracts/lease.pdf"},  # from 0, the default window
                    {"id": "nope.md"},
                    {"id": "handbook.md", "start": len(HANDBOOK)},
                    {"id": "handbook.md", "start": 9, "end": 9},
                    {"id": "handbook.md", "start": -1},
                    {"id": "handbook.md", "doc_id": "handbook.md"},
                ]
            ]
            templates = (await client.list_resource_templates()).resource_templates
            hit = found.structured_content["sources"][0]
            whole = await client.read_resource(hit["uri"])
            cited = await client.read_resource(
                document_uri("contracts/lease.pdf", 14, 40)  # the id's slash encoded
            )
    assert version == ERAS[mode]
    initialized, discovered = handshake  # legacy: `initialize`; auto: `server/discover`
    assert (initialized is not None, discovered is not None) == (mode == "legacy", mode == "auto")

    # the same schema as the LangChain tool; the model sees every cap there
    assert set(tools) == {"search", "fetch"}
    schema = tools["search"].input_schema
    assert schema == SearchArgs.model_json_schema()
    lc_tool = RSERetriever.from_documents([Document("x")], show_progress=False).as_tool()
    assert schema["properties"] == lc_tool.tool_call_schema.model_json_schema()["properties"]
    assert schema["additionalProperties"] is False
    assert schema["properties"]["queries"]["anyOf"][0]["maxItems"] == 5
    assert schema["properties"]["k"]["anyOf"][0]["maximum"] == 20
    assert "sources" in tools["search"].output_schema["properties"]
    assert tools["fetch"].annotations.read_only_hint is True

    # what a model reads: numbered sources with the exact text and the document's length
    assert not found.is_error
    text_of = sources[hit["id"]].page_content
    assert hit["id"] == "handbook.md" and hit["n"] == 1 and hit["length"] == len(HANDBOOK)
    assert hit["text"] == text_of[hit["start"] : hit["end"]] and "20 working days" in hit["text"]
    shown = text(found)
    assert shown.startswith(
        f"[1] handbook.md, characters {hit['start']}–{hit['end']} of {len(HANDBOOK):,}\n"
    )
    key = re.match(r'<source-([0-9a-f]{12}) n="1">', shown.split("\n")[1]).group(1)
    assert f'<source-{key} n="1">\n{hit["text"]}\n</source-{key}>' in shown
    links = [block for block in found.content if isinstance(block, ResourceLink)]
    assert [link.uri for link in links] == [hit["uri"]] == ["rse://document/handbook.md"]
    lease = next(s for s in paged.structured_content["sources"] if s["id"] == "contracts/lease.pdf")
    assert lease["title"] == "Office Lease" and lease["page_end"] == 2
    assert lease["uri"] == "rse://document/contracts%2Flease.pdf"
    assert re.search(
        rf"\[{lease['n']}\] Office Lease \(contracts/lease.pdf\), pages? ", text(paged)
    )

    # a bad argument: the LangChain tool's error, word for word (no pydantic links)
    for args, result in zip(BAD_SEARCHES, bad, strict=True):
        assert result.is_error and text(result) == tool_error(args), args
        assert "errors.pydantic.dev" not in text(result)
    assert "unknown argument 'filter'" in text(bad[0])

    # fetch: the exact characters, a range past the end cut at the end, the length said
    past_end, lease_start, unknown, at_end, empty, negative, extra = fetches
    assert text(past_end) == HANDBOOK[5:]
    assert (
        past_end.structured_content["end"] == past_end.structured_content["length"] == len(HANDBOOK)
    )
    lease_text = sources["contracts/lease.pdf"].page_content
    assert text(lease_start) == lease_text and lease_start.structured_content["start"] == 0
    assert unknown.is_error and "no indexed document with id 'nope.md'" in text(unknown)
    assert at_end.is_error and f"which has {len(HANDBOOK)} characters" in text(at_end)
    assert empty.is_error and negative.is_error and "start" in text(negative)
    assert extra.is_error and "unknown argument 'doc_id'" in text(extra)
    for result in fetches:
        assert "errors.pydantic.dev" not in text(result)

    # documents as resources: a template with the id encoded; a range of characters
    assert [t.uri_template for t in templates] == [DOCUMENT_URI]
    assert whole.contents[0].text == HANDBOOK
    assert cited.contents[0].text == lease_text[14:40]


@pytest.mark.parametrize("mode", list(ERAS))
async def test_fetch_is_bounded(mode: str) -> None:
    """At most 20,000 characters a call: the default window, and a longer range refused.
    (The server in process, over a retriever with hashing embeddings: the bundled model
    would take minutes to embed a 25,000-character document on a busy machine.)"""
    long = Document(LONG, id="long.txt", metadata={"source": "long.txt"})
    retriever = RSERetriever(vectorstore=InMemoryVectorStore(HashingEmbeddings()))
    retriever.add_documents([long])
    async with Client(build_server(retriever), mode=mode) as client:
        window, too_long = [
            await client.call_tool("fetch", args)
            for args in [
                {"id": "long.txt", "start": 1},
                {"id": "long.txt", "start": 0, "end": MAX_READ_CHARS + 1},
            ]
        ]
        part = await client.read_resource(document_uri("long.txt", 6_000, 30_000))  # cut at the end
        with pytest.raises(MCPError, match="read at most 20,000 at a time"):
            await client.read_resource(document_uri("long.txt", 0, MAX_READ_CHARS + 1))
    assert text(window) == LONG[1 : 1 + MAX_READ_CHARS]
    assert window.structured_content["length"] == len(LONG)
    assert too_long.is_error and "read at most 20,000 at a time" in text(too_long)
    assert part.contents[0].text == LONG[6_000:]


async def test_streamable_http_with_a_bearer_token_in_both_eras(
    index: Path, tmp_path: Path
) -> None:
    token = "s3cret-token-0123456789"
    token_file = tmp_path / "token"
    token_file.write_text(token + "\n")
    port = free_port()
    command = [sys.executable, "-m", "langchain_rse.cli", "mcp", str(index), "--http", str(port)]
    command += ["--token-file", str(token_file)]
    url = f"http://127.0.0.1:{port}/mcp"
    found = {}
    with _server(command, port, "langchain-rse mcp --http", tmp_path / "mcp.log"):
        with anyio.fail_after(120):
            async with httpx2.AsyncClient() as plain:
                refused = await plain.post(url, json={"jsonrpc": "2.0", "id": 1, "method": "ping"})
                wrong = await plain.post(
                    url, json={}, headers={"Authorization": "Bearer " + "x" * len(token)}
                )
            for mode, version in ERAS.items():
                transport = streamable_http_client(
                    url, http_client=create_mcp_http_client({"Authorization": f"Bearer {token}"})
                )
                async with Client(transport, mode=mode) as client:
                    assert client.protocol_version == version
                    result = await client.call_tool("search", {"query": "hotel per night", "k": 1})
                    (hit,) = result.structured_content["sources"]
                    again = await client.call_tool(
                        "fetch", {"id": hit["id"], "start": hit["start"], "end": hit["end"]}
                    )
                    found[mode] = (hit, text(again))
    assert refused.status_code == wrong.status_code == 401
    for hit, again in found.values():
        assert hit["id"] == "handbook.md" and "EUR 160 per night" in hit["text"]
        assert again == HANDBOOK[hit["start"] : hit["end"]] == hit["text"]


def test_without_the_mcp_sdk_the_command_says_what_to_install(index: Path) -> None:
    """The ``mcp`` package missing (as after ``pip install "langchain-rse[local]"``): one
    line naming the extra, exit 2, no traceback, before the index is loaded."""
    blocked = (
        "import sys; sys.modules['mcp'] = None; "  # `import mcp` now fails as if not installed
        "from langchain_rse.cli import main; sys.exit(main(sys.argv[1:]))"
    )
    done = subprocess.run(
        [sys.executable, "-c", blocked, "mcp", str(index)],
        capture_output=True,
        text=True,
        env={**os.environ, **env()},
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert 'pip install "langchain-rse[mcp]"' in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


@pytest.fixture(scope="module")
def hashing_retriever() -> RSERetriever:
    retriever = RSERetriever(vectorstore=InMemoryVectorStore(HashingEmbeddings()), k=3)
    retriever.show_progress = False
    retriever.add_documents(list(source_documents().values()))
    return retriever


@settings(max_examples=40)
@example(bad=[("filter", {"source": "handbook.md"})])
@example(bad=[("max_chars", 10**400)])
@given(bad=st.lists(bad_argument, min_size=1, max_size=3))
def test_mcp_search_answers_every_bad_argument_as_the_tool_does(
    hashing_retriever: RSERetriever, bad: list[tuple[str, Any]]
) -> None:
    args: dict[str, Any] = {"query": "remote work abroad"} | dict(bad)
    tool = hashing_retriever.as_tool()
    message = tool.invoke({"type": "tool_call", "id": "c", "name": "search", "args": args})

    async def over_mcp() -> Any:
        async with Client(build_server(hashing_retriever), mode="legacy") as client:
            return await client.call_tool("search", args)

    result = anyio.run(over_mcp)
    assert message.status == "error" and result.is_error
    assert text(result) == message.text


@pytest.mark.parametrize(
    ("extra", "token", "says"),
    [
        ([], "s3cret-token-0123456789", "--token-file protects --http"),
        (["--http", "8765"], "short", "at least 16 printable characters"),
        (["--http", "8765"], "two words and more than sixteen", "without spaces"),
        (["--http", "8765"], None, "cannot read the token file"),
    ],
)
def test_a_bad_token_file_is_a_one_line_error(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    extra: list[str],
    token: str | None,
    says: str,
) -> None:
    from langchain_rse.cli import main

    token_file = tmp_path / "token"
    if token is not None:
        token_file.write_text(token)
    assert main(["mcp", str(tmp_path / "no-index"), *extra, "--token-file", str(token_file)]) == 2
    err = capsys.readouterr().err
    assert says in err and len(err.strip().splitlines()) == 1
