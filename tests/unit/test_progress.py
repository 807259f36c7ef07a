"""Progress of indexing (tqdm bar, log lines off a terminal, silence) and indexing in groups,
so one call never holds every chunk's vectors and index texts at once."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator, Sequence
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


class SlowBatches(HashingEmbeddings):
    """Each batch waits ``pause`` seconds, or until ``until`` is set when it is given."""

    def __init__(self, pause: float = 0.0, until: threading.Event | None = None) -> None:
        super().__init__()
        self.pause, self.until, self.waited = pause, until, []

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        if self.until is not None:
            self.waited.append(self.until.wait(60))
        elif self.pause:
            time.sleep(self.pause)
        return super().embed_documents(texts)


class Flag(logging.Handler):
    """A logging handler that sets an event at the first progress line."""

    def __init__(self) -> None:
        super().__init__()
        self.event, self.lines = threading.Event(), []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())
        self.event.set()


@pytest.fixture
def progress_log() -> Iterator[Flag]:
    flag = Flag()
    log = logging.getLogger("langchain_rse.progress")
    old = log.level
    log.addHandler(flag)
    log.setLevel(logging.INFO)
    try:
        yield flag
    finally:
        log.removeHandler(flag)
        log.setLevel(old)


def test_log_lines_when_not_on_a_terminal(progress_log, monkeypatch) -> None:
    monkeypatch.setattr(steps, "LOG_INTERVAL_S", 0.05)
    monkeypatch.setattr(steps, "PROGRESS_DELAY_S", 0.0)
    monkeypatch.setattr(steps, "INDEX_BATCH_SIZE", 8)
    r = RSERetriever(vectorstore=InMemoryVectorStore(SlowBatches(pause=0.2)), chunk_size=200)
    r.add_documents(corpus(2))  # pytest's stderr is not a terminal: log lines
    total = len(r.index.lexical)
    lines = progress_log.lines
    assert lines and all(line.startswith("embedding + writing: ") for line in lines)
    assert lines[-1].startswith(f"embedding + writing: {total}/{total} chunks (100%), enriched")
    assert lines[-1].endswith("(done)")
    assert "chunks/s" in lines[0] and "ETA" in lines[0]


def test_log_lines_come_while_a_slow_batch_runs(progress_log, monkeypatch) -> None:
    # Issue 57.5: a line every interval from a timer, not one per finished batch. The one
    # batch waits (up to a minute) for a progress line: only a timer can write it.
    monkeypatch.setattr(steps, "LOG_INTERVAL_S", 0.05)
    monkeypatch.setattr(steps, "PROGRESS_DELAY_S", 0.0)
    embeddings = SlowBatches(until=progress_log.event)
    r = RSERetriever(vectorstore=InMemoryVectorStore(embeddings), chunk_size=200)
    r.add_documents(corpus(1))
    assert embeddings.waited and embeddings.waited[0], "no progress line during the batch"
    assert progress_log.lines[0].startswith("embedding + writing: 0/")


def test_a_tiny_write_prints_no_progress(capsys, progress_log) -> None:
    # Issue 54.17: a service adding one document per request prints nothing per call.
    r = RSERetriever(vectorstore=InMemoryVectorStore(HashingEmbeddings()), chunk_size=200)
    for n in range(3):
        r.add_documents([Document(f"request {n}: the notice period is {n} days.")])
    assert capsys.readouterr().err == ""
    assert progress_log.lines == []


def test_bar_and_silence(capsys, progress_log) -> None:
    r = RSERetriever(vectorstore=InMemoryVectorStore(HashingEmbeddings()), show_progress=True)
    r.add_documents(corpus(2))  # asked for: shown at once, however short
    err = capsys.readouterr().err
    assert "embedding + writing" in err and "100%" in err and "enriched" in err
    quiet = RSERetriever(vectorstore=InMemoryVectorStore(HashingEmbeddings()), show_progress=False)
    quiet.add_documents(corpus(2))
    assert capsys.readouterr().err == ""
    assert progress_log.lines == []


class InterruptedEmbeddings(HashingEmbeddings):
    """Ctrl-C during the second batch."""

    batches = 0

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        self.batches += 1
        if self.batches == 2:
            raise KeyboardInterrupt
        return super().embed_documents(texts)


@pytest.mark.parametrize("use_async", [False, True])
async def test_an_interrupt_ends_the_bar_line_before_it_is_reported(
    capsys, monkeypatch, use_async
) -> None:
    # Issue 57.5: the bar is closed (its line ended) when the interrupt leaves
    # add_documents, so the caller's message starts on a line of its own.
    monkeypatch.setattr(steps, "INDEX_BATCH_SIZE", 4)
    store = InMemoryVectorStore(InterruptedEmbeddings())
    r = RSERetriever(vectorstore=store, chunk_size=200, show_progress=True)
    with pytest.raises(KeyboardInterrupt):
        if use_async:
            await r.aadd_documents(corpus(2))
        else:
            r.add_documents(corpus(2))
        err = capsys.readouterr().err  # the traceback is still held here
    err = capsys.readouterr().err
    assert "embedding + writing" in err and err.endswith("\n"), repr(err[-200:])


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
    assert sum(n for kind, n in events if kind == "write") == len(grouped.index.lexical)
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
            (k.split("\x1f")[0], k.split("\x1f")[-1]): t
            for k, t in r.index.lexical.tokens().items()
        }

    assert by_chunk(grouped) == by_chunk(whole)
    query = "termination notice period"
    assert [d.metadata for d in grouped.invoke(query)] == [d.metadata for d in whole.invoke(query)]
