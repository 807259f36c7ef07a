"""Progress of indexing (tqdm bar, log lines off a terminal, silence) and indexing in groups,
so one call never holds every chunk's vectors and index texts at once."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import pytest
from langchain_core.documents import Document
from langchain_core.vectorstores import InMemoryVectorStore

from helpers import HashingEmbeddings, make_contract
from langchain_rse import RSERetriever
from langchain_rse.enrichment import ChunkContext, HeaderEnricher
from langchain_rse.indexing import steps
from langchain_rse.indexing.chunking import Chunk

TOPICS = ["termination", "payment", "warranty", "liability", "confidentiality"]


def corpus(n: int = 6) -> list[Document]:
    return [
        Document(
            make_contract(f"c{i}", TOPICS[i % 5 :] + TOPICS[: i % 5]),
            metadata={"source": f"c{i}.md"},
        )
        for i in range(n)
    ]


class RecordingStore(InMemoryVectorStore):
    """The real in-memory store, noting each write in a shared event list."""

    def __init__(self, events: list[tuple[str, Any]]) -> None:
        super().__init__(HashingEmbeddings())
        self.events = events

    def add_documents(self, documents: list[Document], **kwargs: Any) -> list[str]:
        self.events.append(("write", len(documents)))
        return super().add_documents(documents, **kwargs)


class RecordingEnricher(HeaderEnricher):
    events: list[tuple[str, Any]] = []

    def enrich(
        self, doc_id: str, text: str, metadata: dict[str, Any], chunks: Sequence[Chunk]
    ) -> list[ChunkContext]:
        self.events.append(("enrich", doc_id))
        return super().enrich(doc_id, text, metadata, chunks)


def test_log_lines_when_not_on_a_terminal(caplog, monkeypatch) -> None:
    monkeypatch.setattr(steps, "LOG_INTERVAL_S", 0.0)  # a line for every batch
    monkeypatch.setattr(steps, "INDEX_BATCH_SIZE", 8)
    r = RSERetriever(vectorstore=InMemoryVectorStore(HashingEmbeddings()), chunk_size=200)
    with caplog.at_level(logging.INFO, logger="langchain_rse.progress"):
        r.add_documents(corpus(3))  # pytest's stderr is not a terminal: log lines
    total = len(r._lexical)
    lines = [rec.getMessage() for rec in caplog.records if rec.name == "langchain_rse.progress"]
    writing = [line for line in lines if line.startswith("embedding + writing:")]
    assert len(writing) >= total // 8  # one per store batch, plus the final line
    assert writing[-1].startswith(f"embedding + writing: {total}/{total} chunks (100%)")
    assert "chunks/s" in writing[0] and "ETA" in writing[0]
    assert any(line.startswith(f"enriching: {total}/{total} chunks") for line in lines)


def test_bar_and_silence(capsys, caplog) -> None:
    r = RSERetriever(vectorstore=InMemoryVectorStore(HashingEmbeddings()), show_progress=True)
    r.add_documents(corpus(2))
    err = capsys.readouterr().err
    assert "enriching" in err and "embedding + writing" in err and "100%" in err
    quiet = RSERetriever(vectorstore=InMemoryVectorStore(HashingEmbeddings()), show_progress=False)
    with caplog.at_level(logging.INFO, logger="langchain_rse.progress"):
        quiet.add_documents(corpus(2))
    assert capsys.readouterr().err == ""
    assert not [rec for rec in caplog.records if rec.name == "langchain_rse.progress"]


def test_progress_line_figures() -> None:
    p = steps.Progress("embedding", 200, show=False)
    p.done = 50
    assert p.line().startswith("embedding: 50/200 chunks (25%), ")
    assert steps.Progress("x", 0, show=True).mode == "off"  # nothing to show


@pytest.mark.parametrize("use_async", [False, True])
async def test_documents_are_enriched_and_written_in_groups(monkeypatch, use_async) -> None:
    monkeypatch.setattr(steps, "WRITE_GROUP_CHUNKS", 10)
    monkeypatch.setattr(steps, "INDEX_BATCH_SIZE", 4)
    events: list[tuple[str, Any]] = []
    RecordingEnricher.events = events
    grouped = RSERetriever(
        vectorstore=RecordingStore(events),
        enricher=RecordingEnricher(),
        chunk_size=200,
        show_progress=False,
    )
    docs = corpus(6)
    if use_async:
        await grouped.aadd_documents(docs)
    else:
        grouped.add_documents(docs)
    kinds = [kind for kind, _ in events]
    first_write, last_enrich = kinds.index("write"), len(kinds) - 1 - kinds[::-1].index("enrich")
    assert first_write < last_enrich  # later documents are enriched after earlier ones are written
    assert all(n <= 4 for kind, n in events if kind == "write")
    assert sum(n for kind, n in events if kind == "write") == len(grouped._lexical)
    # the same index as one group: same chunks, same results
    RecordingEnricher.events = []
    whole = RSERetriever(
        vectorstore=InMemoryVectorStore(HashingEmbeddings()),
        chunk_size=200,
        enricher=RecordingEnricher(),
        show_progress=False,
    )
    whole.add_documents(docs)

    def by_chunk(r: RSERetriever) -> dict[tuple[str, str], list[str]]:  # version ids differ
        return {
            (k.split("\x1f")[0], k.split("\x1f")[-1]): t for k, t in r._lexical.tokens().items()
        }

    assert by_chunk(grouped) == by_chunk(whole)
    query = "termination notice period"
    assert [d.metadata for d in grouped.invoke(query)] == [d.metadata for d in whole.invoke(query)]
