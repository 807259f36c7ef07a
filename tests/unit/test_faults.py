"""Fault injection through the real SDK clients against the fake servers on 127.0.0.1.

* Enrichment: the real ``langchain_openai.ChatOpenAI`` talks to ``FakeOpenAIServer``, which
  fails a fixed ~20% of the chunks (chosen by a hash of the chunk text, so the pattern is
  the same on every run) while an "outage" lasts, and rate-limits another ~20% once. Indexing
  must complete with every chunk in the vector store, the BM25 index and the chunk store;
  the failed chunks carry the ``"fallback"`` context and a later run asks the model again for
  exactly those chunks.
* Reranking: the real ``CohereReranker`` (``cohere.ClientV2`` / ``AsyncClientV2``) talks to
  ``FakeCohereServer`` scripted to answer 429 then OK, 500 forever, garbage, a malformed
  result list, or too late. Queries finish within the reranker's deadline (plus generous
  slack for a busy machine), fall back to the fused ranking with ``rerank_fallback`` marked
  and a warning logged, and raise ``RerankError`` under ``CohereReranker(strict=True)``.

Process kills during ``save`` are covered in ``test_persistence.py``.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import zlib
from collections import Counter
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import pytest
from langchain_core.documents import Document
from pydantic import SecretStr

from conftest import corpus_documents
from fake_cohere_server import FakeCohereServer, Reply, running_server
from fake_openai_server import FakeOpenAIServer, chunk_of
from helpers import HashingEmbeddings, stored_metadata
from langchain_rse import RSERetriever
from langchain_rse.enrichment import ContextualEnricher
from langchain_rse.indexing.chunking import make_splitter, split_text
from langchain_rse.indexing.records import chunk_key
from langchain_rse.rerank import CohereReranker, RerankError

SLACK_S = 10.0
"""Allowance over a deadline for a slow, shared machine (the fake server hangs for 60 s)."""
QUERIES = ["termination provisions", "royalties and audit rights", "insurance"]


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    """The SDKs' HTTP clients must reach 127.0.0.1 directly."""
    for name in (
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "ALL_PROXY",
        "http_proxy",
        "https_proxy",
        "all_proxy",
    ):
        monkeypatch.delenv(name, raising=False)
    for name in ("COHERE_API_KEY", "CO_API_KEY", "CO_API_URL"):
        monkeypatch.delenv(name, raising=False)


def source_ok(segment: Document, docs: Sequence[Document]) -> bool:
    """The segment's text is exactly its source document's ``[start_index:end_index]``."""
    m = segment.metadata
    text = {d.metadata["source"]: d.page_content for d in docs}[m["doc_id"]]
    return segment.page_content == text[m["start_index"] : m["end_index"]]


# --------------------------------------------------------------------------------------
# Enrichment: ChatOpenAI against a flaky OpenAI-compatible server
# --------------------------------------------------------------------------------------


def bucket(chunk_text: str) -> int:
    """A fixed 1-in-5 class of a chunk text (the same on every run and machine)."""
    return zlib.crc32(chunk_text.encode("utf-8")) % 5


OUTAGE = 0
"""Chunks in this bucket get HTTP 500 on every attempt while the outage lasts."""
RATE_LIMITED = 1
"""Chunks in this bucket get HTTP 429 on their first request only (the retry succeeds)."""


class FlakyModel:
    """The fake server's ``fail`` hook: deterministic failures by chunk text."""

    def __init__(self) -> None:
        self.outage = True
        self.attempts: Counter[str] = Counter()
        self._lock = threading.Lock()

    def __call__(self, request: dict[str, Any]) -> int | None:
        text = chunk_of(request)
        with self._lock:
            self.attempts[text] += 1
            attempt = self.attempts[text]
        if self.outage and bucket(text) == OUTAGE:
            return 500
        if bucket(text) == RATE_LIMITED and attempt == 1:
            return 429
        return None


@pytest.fixture
def flaky() -> Iterator[tuple[FakeOpenAIServer, FlakyModel]]:
    model = FlakyModel()
    with FakeOpenAIServer(fail=model) as server:
        yield server, model


def make_enricher(server: FakeOpenAIServer, **kwargs: Any) -> ContextualEnricher:
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(
        model="gpt-test",
        base_url=server.base_url,
        api_key=SecretStr("sk-test"),
        max_retries=0,  # the enricher retries, not the SDK: request counts stay exact
        timeout=30,
    )
    options: dict[str, Any] = {
        "max_retries": 1,
        "retry_base_delay": 0.01,
        "retry_max_delay": 0.02,
        "max_concurrency": 4,
    }
    options.update(kwargs)
    return ContextualEnricher(llm, **options)


def expected_chunks(docs: Sequence[Document]) -> dict[tuple[str, int], str]:
    """``(doc_id, chunk_index) → chunk text`` as the retriever splits them (defaults)."""
    splitter = make_splitter()
    return {
        (c.doc_id, c.chunk_index): c.text
        for d in docs
        for c in split_text(d.page_content, d.metadata["source"], splitter)
    }


def check_index(retriever: RSERetriever, docs: Sequence[Document]) -> dict[tuple[str, int], str]:
    """Every chunk is in all three stores exactly once; returns each chunk's enrichment method
    (the vector store's ``enrichment`` field, checked against the chunk store's record)."""
    chunks = expected_chunks(docs)
    stored = stored_metadata(retriever.vectorstore)
    methods = {(m["doc_id"], m["chunk_index"]): m["enrichment"] for m in stored}
    assert len(stored) == len(chunks) and set(methods) == set(chunks)  # vector store

    versions = {m["doc_id"]: m["doc_version"] for m in stored}
    keys = {chunk_key(d, versions[d], i) for d, i in chunks}
    assert set(retriever.index.lexical.tokens()) == keys  # BM25

    pointers = retriever.index.records.pointers(
        [d.metadata["source"] for d in docs]
    )  # record store
    assert all(m is not None for m in pointers)
    bodies = retriever.index.records.bodies([m for m in pointers if m is not None])
    for pointer, body, doc in zip(pointers, bodies, docs):
        assert pointer is not None and body.text == doc.page_content
        assert pointer.version == versions[pointer.doc_id]
        assert len(pointer.spans) == len(body.contexts)
        for i, context in enumerate(body.contexts):
            assert context.method == methods[(pointer.doc_id, i)]
            assert context.method != "fallback" or context.text.startswith("Document: ")
    return methods


def outage_chunks(docs: Sequence[Document]) -> set[tuple[str, int]]:
    return {key for key, text in expected_chunks(docs).items() if bucket(text) == OUTAGE}


def test_llm_outage_during_indexing_then_retry_after_a_change(
    flaky: tuple[FakeOpenAIServer, FlakyModel], caplog: pytest.LogCaptureFixture
) -> None:
    server, model = flaky
    docs = corpus_documents()
    chunks = expected_chunks(docs)
    failing = outage_chunks(docs)
    limited = {k for k, text in chunks.items() if bucket(text) == RATE_LIMITED}
    assert 0.1 * len(chunks) <= len(failing) <= 0.35 * len(chunks)  # "about 20%"
    assert limited

    enricher = make_enricher(server)
    retriever = RSERetriever.from_documents(
        docs, embedding=HashingEmbeddings(), enricher=enricher, k=3
    )
    methods = check_index(retriever, docs)
    assert {k for k, m in methods.items() if m == "fallback"} == failing
    assert {k for k, m in methods.items() if m != "fallback"} == set(chunks) - failing
    assert set(methods.values()) == {"llm", "fallback"}  # rate-limited chunks recovered
    assert enricher.failures == len(failing)
    # one request per chunk, plus one retry for each failing and each rate-limited chunk
    assert len(server.requests) == len(chunks) + len(failing) + len(limited)
    assert enricher.usage.llm_calls == len(server.requests)
    assert "fell back to the header context" in caplog.text
    assert retriever.invoke("termination provisions")  # the index works

    # The outage ends; a metadata change makes the documents re-index. Successful contexts
    # come from the cache: exactly the failed chunks are asked for again, and succeed.
    model.outage = False
    before = len(server.requests)
    enricher.reset_usage()
    revised = [Document(d.page_content, metadata={**d.metadata, "revision": 2}) for d in docs]
    retriever.add_documents(revised)
    retried = [chunk_of(r) for r in server.requests[before:]]
    assert sorted(retried) == sorted(chunks[k] for k in failing)
    assert enricher.failures == 0 and enricher.usage.cache_hits == len(chunks) - len(failing)
    methods = check_index(retriever, revised)
    assert set(methods.values()) == {"llm"}


async def test_llm_outage_async_then_same_cache_retries_only_failures(
    flaky: tuple[FakeOpenAIServer, FlakyModel],
) -> None:
    server, model = flaky
    docs = corpus_documents()
    chunks = expected_chunks(docs)
    failing = outage_chunks(docs)

    enricher = make_enricher(server)
    retriever = RSERetriever(vectorstore=_faiss(), enricher=enricher, k=3)
    await retriever.aadd_documents(docs)
    methods = check_index(retriever, docs)
    assert {k for k, m in methods.items() if m == "fallback"} == failing
    assert enricher.failures == len(failing)
    assert await retriever.ainvoke("royalties and audit rights")

    # A new retriever and enricher sharing the first one's cache: a fresh run over the same
    # documents requests exactly the chunks that failed before.
    model.outage = False
    before = len(server.requests)
    again = make_enricher(server, cache=enricher.cache)
    rebuilt = RSERetriever(vectorstore=_faiss(), enricher=again, k=3)
    await rebuilt.aadd_documents(docs)
    assert sorted(chunk_of(r) for r in server.requests[before:]) == sorted(
        chunks[k] for k in failing
    )
    assert again.failures == 0 and again.usage.llm_calls == len(failing)
    assert set(check_index(rebuilt, docs).values()) == {"llm"}


def _faiss() -> Any:
    from langchain_rse.persistence import default_vectorstore

    return default_vectorstore(HashingEmbeddings())


def test_unchanged_readd_retries_fallback_chunks(
    flaky: tuple[FakeOpenAIServer, FlakyModel],
) -> None:
    server, model = flaky
    docs = corpus_documents()[:1]
    failing = outage_chunks(docs)
    assert failing
    enricher = make_enricher(server, max_retries=0)
    retriever = RSERetriever.from_documents(docs, embedding=HashingEmbeddings(), enricher=enricher)
    fell_back = enricher.failures  # the outage chunks, and (no retries) the rate-limited ones
    assert fell_back >= len(failing)
    model.outage = False
    before = len(server.requests)
    retriever.add_documents(docs)  # the same documents, unchanged
    assert len(server.requests) - before == fell_back  # only the fallback chunks are retried
    assert set(check_index(retriever, docs).values()) == {"llm"}
    retriever.add_documents(docs)  # now nothing is left to retry: a no-op
    assert len(server.requests) - before == fell_back


# --------------------------------------------------------------------------------------
# Reranking: CohereReranker against a scripted Cohere server
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Fault:
    name: str
    replies: tuple[Reply, ...]
    """Queued for each query (exactly what one query consumes, when that is fixed)."""
    falls_back: bool
    requests: int | None
    """Requests one query makes (``None``: depends on timing)."""
    timeout: float = 10.0
    log: str = "reranker failed"


MAX_RETRIES = 2
FAULTS = [
    Fault(
        "429-then-ok",
        (Reply(429, {"message": "slow down"}, headers={"Retry-After": "0"}),),
        falls_back=False,
        requests=2,
        log="Cohere rerank attempt 1 failed",
    ),
    Fault(
        "500-always",
        (Reply(500, {"message": "internal error"}),) * (MAX_RETRIES + 1),
        falls_back=True,
        requests=MAX_RETRIES + 1,
    ),
    Fault("garbage-json", (Reply(200, b"<<garbage>> {"),), falls_back=True, requests=1),
    Fault(
        "malformed-results",
        (Reply(200, {"results": [{"index": 9999, "relevance_score": 0.5}]}),),
        falls_back=True,
        requests=1,
    ),
    Fault(
        "slower-than-deadline",
        (Reply(delay=60.0), Reply(delay=60.0)),
        falls_back=True,
        requests=None,
        timeout=1.0,
    ),
]


@pytest.fixture
def cohere() -> Iterator[FakeCohereServer]:
    with running_server() as server:
        yield server


def drain(server: FakeCohereServer) -> None:
    """Drop scripted replies a query did not use (retries after a timeout vary with timing)."""
    with server._lock:
        server._replies.clear()


def make_reranker(server: FakeCohereServer, timeout: float = 10.0) -> CohereReranker:
    return CohereReranker(
        api_key="co-test",
        base_url=server.url,
        timeout=timeout,
        max_retries=MAX_RETRIES,
        backoff_base=0.01,
        backoff_max=0.05,
    )


def query(retriever: RSERetriever, text: str, path: str, **kwargs: Any) -> list[Document]:
    if path == "ainvoke":
        return asyncio.run(retriever.ainvoke(text, **kwargs))
    return retriever.invoke(text, **kwargs)


def spans(segments: Sequence[Document]) -> list[tuple[str, int, int]]:
    return [
        (s.metadata["doc_id"], s.metadata["start_index"], s.metadata["end_index"]) for s in segments
    ]


@pytest.mark.parametrize("path", ["invoke", "ainvoke"])
@pytest.mark.parametrize("fault", FAULTS, ids=[f.name for f in FAULTS])
def test_rerank_faults(
    fault: Fault, path: str, cohere: FakeCohereServer, caplog: pytest.LogCaptureFixture
) -> None:
    docs = corpus_documents()
    retriever = RSERetriever.from_documents(docs, embedding=HashingEmbeddings(), k=3)
    fused = spans(query(retriever, QUERIES[0], path))  # the ranking without a reranker
    retriever.reranker = make_reranker(cohere, timeout=fault.timeout)

    cohere.enqueue(*fault.replies)
    with caplog.at_level(logging.WARNING):
        started = time.monotonic()
        segments = query(retriever, QUERIES[0], path)
        elapsed = time.monotonic() - started
    assert elapsed < fault.timeout + SLACK_S
    assert segments and all(source_ok(s, docs) for s in segments)
    if fault.requests is not None:
        assert len(cohere.requests) == fault.requests
    else:
        assert len(cohere.requests) >= 1
    assert fault.log in caplog.text
    if fault.falls_back:
        assert all(s.metadata["rerank_fallback"] is True for s in segments)
        assert spans(segments) == fused
    else:
        assert not any("rerank_fallback" in s.metadata for s in segments)

    # a strict reranker: the same fault raises (within the deadline) instead of falling back
    retriever.reranker.strict = True
    cohere.enqueue(*fault.replies)
    started = time.monotonic()
    if fault.falls_back:
        with pytest.raises(RerankError, match="Cohere rerank"):
            query(retriever, QUERIES[0], path)
    else:
        strict = query(retriever, QUERIES[0], path)
        assert spans(strict) == spans(segments)
    assert time.monotonic() - started < fault.timeout + SLACK_S

    # The server recovers: the next query is reranked again
    drain(cohere)
    retriever.reranker.strict = False
    healthy = query(retriever, QUERIES[1], path, mode="chunks")
    assert healthy and all("rerank_score" in d.metadata for d in healthy)
    assert not any("rerank_fallback" in d.metadata for d in healthy)


def test_rerank_failures_under_concurrent_queries(cohere: FakeCohereServer) -> None:
    """Eight concurrent queries, four of them hit by a 500: exactly four fall back."""
    docs = corpus_documents()
    retriever = RSERetriever.from_documents(docs, embedding=HashingEmbeddings(), k=3)
    reranker = make_reranker(cohere)
    reranker.max_retries = 0
    retriever.reranker = reranker
    cohere.enqueue(*[Reply(500, {"message": "internal error"})] * 4)
    questions = [QUERIES[i % len(QUERIES)] for i in range(8)]
    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(retriever.invoke, questions))
    assert len(cohere.requests) == 8
    fell_back = [r for r in results if r and r[0].metadata.get("rerank_fallback")]
    assert len(fell_back) == 4
    for segments in results:
        assert segments and all(source_ok(s, docs) for s in segments)
        assert len({bool(s.metadata.get("rerank_fallback")) for s in segments}) == 1


async def test_rerank_failures_under_concurrent_async_queries(cohere: FakeCohereServer) -> None:
    docs = corpus_documents()
    retriever = RSERetriever.from_documents(docs, embedding=HashingEmbeddings(), k=3)
    reranker = make_reranker(cohere, timeout=3.0)
    reranker.max_retries = 0
    retriever.reranker = reranker
    # two hang past the deadline, two fail, four succeed
    cohere.enqueue(
        Reply(delay=60.0), Reply(delay=60.0), *[Reply(500, {"message": "internal error"})] * 2
    )
    started = time.monotonic()
    results = await asyncio.gather(
        *(retriever.ainvoke(QUERIES[i % len(QUERIES)]) for i in range(8))
    )
    assert time.monotonic() - started < 3.0 + SLACK_S
    fell_back = [r for r in results if r and r[0].metadata.get("rerank_fallback")]
    assert len(fell_back) == 4
    assert all(r and all(source_ok(s, docs) for s in r) for r in results)
