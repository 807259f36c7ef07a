"""``RSERetriever.as_tool`` in a real agent loop: numbered sources the model can cite.

The agent is ``langchain.agents.create_agent`` with a scripted tool-calling chat model
from ``langchain_core``; the tests assert what the model was shown and that every ``[n]``
maps back to the exact characters of its source.
"""

from __future__ import annotations

import re
from typing import Any
from uuid import UUID

import pytest
from langchain.agents import create_agent
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.documents import Document
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatResult
from langchain_core.vectorstores import InMemoryVectorStore
from pydantic import Field

from helpers import HashingEmbeddings, make_contract
from langchain_rse import RSERetriever

SOURCE_BLOCK = re.compile(r'^\[(\d+)\] ([^\n]*)\n<source n="\1">\n(.*?)\n</source>$', re.S | re.M)


class ScriptedChatModel(GenericFakeChatModel):
    """Answers with the scripted messages in turn and records what it was shown."""

    seen: list[list[BaseMessage]] = Field(default_factory=list)

    def bind_tools(self, tools: Any, **kwargs: Any) -> ScriptedChatModel:
        return self

    def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> ChatResult:
        self.seen.append(list(messages))
        return super()._generate(messages, *args, **kwargs)


def script(*tool_args: dict[str, Any], answer: str) -> ScriptedChatModel:
    calls = [
        AIMessage("", tool_calls=[{"name": "search", "args": args, "id": f"call-{n}"}])
        for n, args in enumerate(tool_args)
    ]
    return ScriptedChatModel(messages=iter([*calls, AIMessage(answer)]))


def sources_shown(message: ToolMessage) -> dict[int, tuple[str, str]]:
    """``{n: (header, exact text)}`` of the numbered sources in the tool's content."""
    blocks = SOURCE_BLOCK.findall(message.text)
    assert blocks, message.text
    return {int(n): (header, text) for n, header, text in blocks}


@pytest.fixture
def corpus() -> dict[str, Document]:
    def doc(text: str, title: str, tenant: str, region: str) -> Document:
        meta = {"source": f"{title.lower()}.txt", "title": title, "tenant": tenant}
        return Document(text, metadata={**meta, "region": region})

    docs = [
        doc(
            make_contract("alpha", ["warranty", "termination", "payment terms"]),
            "Alpha",
            "acme",
            "eu",
        ),
        doc(
            make_contract("beta", ["governing law", "warranty", "insurance"]), "Beta", "acme", "us"
        ),
        doc(
            "GLOBEX CONFIDENTIAL\n\n" + make_contract("globex", ["warranty", "warranty"]),
            "Globex",
            "globex",
            "eu",
        ),
    ]
    return {d.metadata["source"]: d for d in docs}


def retriever_over(corpus: dict[str, Document], **kwargs: Any) -> RSERetriever:
    """A retriever over every tenant's documents, then bound to ``kwargs`` (a bound filter
    writes only what it allows)."""
    retriever = RSERetriever(vectorstore=InMemoryVectorStore(HashingEmbeddings()))
    retriever.add_documents(list(corpus.values()))
    for name, value in kwargs.items():
        setattr(retriever, name, value)
    return retriever


def check_citable(message: ToolMessage, corpus: dict[str, Document]) -> None:
    """What the model read: ``[n]`` headers with exact slices; artifact ``[n - 1]`` and
    the citation annotations point at the same characters of the same source."""
    shown = sources_shown(message)
    assert sorted(shown) == list(range(1, len(message.artifact) + 1))
    (block,) = message.content
    assert isinstance(block, dict) and block["type"] == "text"
    for (n, (header, text)), doc, citation in zip(
        sorted(shown.items()), message.artifact, block["annotations"], strict=True
    ):
        meta = doc.metadata
        source = corpus[meta["source"]]
        start, end = meta["start_index"], meta["end_index"]
        assert text == doc.page_content == source.page_content[start:end]
        assert header == f"{source.metadata['title']} ({meta['source']}), characters {start}–{end}"
        assert citation["type"] == "citation" and citation["extras"]["n"] == n
        assert block["text"][citation["start_index"] : citation["end_index"]] == text
        assert citation["cited_text"] == text and citation["url"] == meta["source"]
        assert (citation["extras"]["source_start"], citation["extras"]["source_end"]) == (
            start,
            end,
        )


def cited(answer: str, message: ToolMessage) -> list[tuple[str, int, int]]:
    """The (source, start, end) behind every ``[n]`` in an answer."""
    out = []
    for n in re.findall(r"\[(\d+)\]", answer):
        meta = message.artifact[int(n) - 1].metadata
        out.append((meta["source"], meta["start_index"], meta["end_index"]))
    return out


def test_agent_loop_shows_numbered_exact_sources_and_the_answer_cites_them(corpus) -> None:
    tool = retriever_over(corpus, k=2, filter={"tenant": "acme"}).as_tool()
    model = script(
        {"query": "warranty provisions", "queries": ["warranty obligations survive"]},
        answer="The warranty provisions survive for the stated period [1].",
    )
    agent = create_agent(model, tools=[tool])
    result = agent.invoke({"messages": [HumanMessage("What do the warranty terms say?")]})

    # the model's second turn was shown the tool's numbered sources
    assert len(model.seen) == 2
    shown = model.seen[1][-1]
    assert isinstance(shown, ToolMessage) and shown.tool_call_id == "call-0"
    assert shown.status == "success" and len(shown.artifact) == 2
    check_citable(shown, corpus)
    assert shown.text.startswith("[1] ") and "\n\n[2] " in shown.text

    final = result["messages"][-1]
    assert isinstance(final, AIMessage) and "[1]" in final.text
    tool_message = next(m for m in result["messages"] if isinstance(m, ToolMessage))
    ((source, start, end),) = cited(final.text, tool_message)
    assert source in {"alpha.txt", "beta.txt"}  # the tenant's documents only
    assert "warranty" in corpus[source].page_content[start:end]


class RunTree(BaseCallbackHandler):
    """Records (kind, run id, parent run id) of tool and retriever runs."""

    def __init__(self) -> None:
        self.runs: list[tuple[str, UUID, UUID | None]] = []

    def on_tool_start(
        self,
        serialized: Any,
        input_str: str,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        **kwargs: Any,
    ) -> None:
        self.runs.append(("tool", run_id, parent_run_id))

    def on_retriever_start(
        self,
        serialized: Any,
        query: str,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        **kwargs: Any,
    ) -> None:
        self.runs.append(("retriever", run_id, parent_run_id))


async def test_async_agent_loop_and_the_retriever_run_is_the_tools_child(corpus) -> None:
    tool = retriever_over(corpus, k=3).as_tool(name="search")
    model = script({"query": "governing law", "k": 1}, answer="Beta's governing law [1].")
    tree = RunTree()
    agent = create_agent(model, tools=[tool])
    result = await agent.ainvoke(
        {"messages": [HumanMessage("Which law governs?")]}, config={"callbacks": [tree]}
    )
    tool_message = next(m for m in result["messages"] if isinstance(m, ToolMessage))
    assert len(tool_message.artifact) == 1  # the model's k
    check_citable(tool_message, corpus)
    assert cited(result["messages"][-1].text, tool_message)[0][0] == "beta.txt"

    tool_runs = [run for kind, run, _ in tree.runs if kind == "tool"]
    retriever_parents = [parent for kind, _, parent in tree.runs if kind == "retriever"]
    assert len(tool_runs) == 1 and retriever_parents[0] == tool_runs[0]

    # the async tool on its own, without an agent
    direct = await tool.ainvoke(
        {"type": "tool_call", "id": "x", "name": "search", "args": {"query": "insurance"}}
    )
    check_citable(direct, corpus)


def test_tenant_bound_tool_offers_no_filter_and_never_shows_another_tenant(corpus) -> None:
    retriever = retriever_over(corpus, k=4, filter={"tenant": "acme"})
    tool = retriever.as_tool()
    assert set(tool.args) == {"query", "queries", "k", "max_chars"}
    assert "filter" not in tool.tool_call_schema.model_json_schema()["properties"]
    assert tool.args_schema.model_json_schema()["additionalProperties"] is False

    # the model asks for the other tenant's words, then tries to pass a filter of its own
    model = script(
        {"query": "GLOBEX CONFIDENTIAL globex warranty"},
        {"query": "globex warranty", "filter": {"tenant": "globex"}},
        answer="Nothing from Globex.",
    )
    result = create_agent(model, tools=[tool]).invoke({"messages": [HumanMessage("globex?")]})
    first, second = (m for m in result["messages"] if isinstance(m, ToolMessage))
    assert first.status == "success" and first.artifact
    assert all(d.metadata["tenant"] == "acme" for d in first.artifact)
    assert second.status == "error" and "filter" in second.text  # rejected, not searched
    for message in (first, second):  # none of the other tenant's text
        assert "GLOBEX CONFIDENTIAL" not in message.text
        assert "globex agreement" not in message.text.lower()
    assert "<source" not in second.text

    # allowed, the model's filter narrows the bound one and never widens it
    filtered = retriever.as_tool(allow_filter=True)
    assert "filter" in filtered.args

    def call(args: dict[str, Any]) -> ToolMessage:
        return filtered.invoke({"type": "tool_call", "id": "c", "name": "search", "args": args})

    widened = call({"query": "globex warranty", "filter": {"tenant": "globex"}})
    assert widened.artifact == [] and widened.text == "No relevant sources found."
    narrowed = call({"query": "warranty", "filter": {"region": "us"}})
    assert narrowed.artifact and {d.metadata["source"] for d in narrowed.artifact} == {"beta.txt"}
    check_citable(narrowed, corpus)
    bad = call({"query": "warranty", "filter": {"region": {"$regex": "u"}}})
    assert bad.status == "error" and "$regex" in bad.text


def test_the_tool_passes_the_context_budget() -> None:
    from langchain_core.vectorstores import InMemoryVectorStore

    from helpers import HashingEmbeddings
    from langchain_rse import RSERetriever
    from langchain_rse.sample_data import load_sample_documents

    r = RSERetriever.from_documents(
        load_sample_documents(), vectorstore=InMemoryVectorStore(HashingEmbeddings()), k=10
    )
    tool = r.as_tool(name="search")
    assert "max_chars" in tool.args
    call = {
        "name": "search",
        "args": {"query": "termination notice", "max_chars": 400},
        "id": "c1",
        "type": "tool_call",
    }
    message = tool.invoke(call)
    assert message.artifact and sum(len(d.page_content) for d in message.artifact) <= 400
