"""Behaviour of RSERetriever on the offline path (hashing embeddings, in-memory stores)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.documents import BaseDocumentCompressor, Document
from langchain_core.stores import InMemoryByteStore
from langchain_core.vectorstores import InMemoryVectorStore

from helpers import HashingEmbeddings, make_contract, stored_metadata
from langchain_rse import RSERetriever
from langchain_rse.rerank import BaseReranker, RerankError, RerankResult
from langchain_rse.segments import RSEParams

QUERY = "termination provisions of the agreement"


@pytest.fixture
def retriever(docs: list[Document], embeddings: HashingEmbeddings) -> RSERetriever:
    return RSERetriever.from_documents(docs, embedding=embeddings, k=3)


def sources(docs: list[Document]) -> dict[str, str]:
    return {d.metadata["source"]: d.page_content for d in docs}


def test_segments_are_exact_slices_with_metadata(retriever, docs) -> None:
    texts = sources(docs)
    results = retriever.invoke(QUERY)
    assert 1 <= len(results) <= 3
    for seg in results:
        m = seg.metadata
        assert seg.page_content == texts[m["doc_id"]][m["start_index"] : m["end_index"]]
        assert m["chunk_end"] > m["chunk_start"] >= 0
        assert m["title"] == m["doc_id"].removesuffix(".txt")  # source metadata kept
        assert isinstance(m["score"], float)
    # segments come in the order of their best chunk: the top-ranked chunk's segment first
    (top,) = retriever.invoke(QUERY, mode="chunks", k=1)
    first = results[0].metadata
    assert first["doc_id"] == top.metadata["doc_id"]
    assert first["chunk_start"] <= top.metadata["chunk_index"] < first["chunk_end"]
    # the query is about termination: every returned segment mentions it
    assert all("termination" in s.page_content for s in results)


def test_segments_never_overlap(docs, embeddings) -> None:
    r = RSERetriever.from_documents(
        docs, embedding=embeddings, k=50, rse_params=RSEParams(3, 60, 0.05, 0.1, 30.0)
    )
    results = r.invoke(QUERY)
    assert len(results) > 3
    spans: dict[str, list[tuple[int, int]]] = {}
    for seg in results:
        spans.setdefault(seg.metadata["doc_id"], []).append(
            (seg.metadata["start_index"], seg.metadata["end_index"])
        )
    for ranges in spans.values():
        ranges.sort()
        assert all(a[1] <= b[0] for a, b in zip(ranges, ranges[1:]))


def test_k_is_honoured(retriever) -> None:
    assert len(retriever.invoke(QUERY, k=1)) == 1
    assert len(retriever.invoke(QUERY, k=2)) == 2
    assert retriever.invoke(QUERY, k=0) == []
    with pytest.raises(ValueError, match="k must be"):
        retriever.invoke(QUERY, k=-1)
    with pytest.raises(ValueError, match="k must be"):
        RSERetriever(vectorstore=InMemoryVectorStore(HashingEmbeddings()), k=-2)


def test_chunks_mode_returns_exact_chunks(docs, embeddings) -> None:
    texts = sources(docs)
    r = RSERetriever.from_documents(docs, embedding=embeddings, k=4, mode="chunks")
    results = r.invoke("royalties audit rights")
    assert len(results) == 4
    for c in results:
        m = c.metadata
        assert c.page_content == texts[m["doc_id"]][m["start_index"] : m["end_index"]]
        assert m["chunk_end"] == m["chunk_start"] + 1 == m["chunk_index"] + 1
        assert m["dense_rank"] is not None or m["lexical_rank"] is not None
    assert results[0].metadata["doc_id"] == "gamma.txt"


def test_empty_corpus_returns_nothing(embeddings) -> None:
    r = RSERetriever(vectorstore=InMemoryVectorStore(embeddings))
    assert r.invoke("anything") == []
    assert asyncio.run(r.ainvoke("anything")) == []


@pytest.mark.parametrize("query", ["", "   ", "\n\t"])
def test_blank_query_is_rejected(retriever, query) -> None:
    with pytest.raises(ValueError, match="non-empty"):
        retriever.invoke(query)


def test_non_string_query_is_rejected(retriever) -> None:
    with pytest.raises(TypeError, match="query must be a string"):
        retriever._get_relevant_documents(None, run_manager=None)  # type: ignore[arg-type]


async def test_async_equals_sync(retriever) -> None:
    for mode in ("segments", "chunks"):
        retriever.mode = mode
        sync = retriever.invoke(QUERY)
        async_ = await retriever.ainvoke(QUERY)
        assert [(d.page_content, d.metadata) for d in sync] == [
            (d.page_content, d.metadata) for d in async_
        ]


def test_batch(retriever) -> None:
    out = retriever.batch([QUERY, "insurance"])
    assert len(out) == 2 and all(out)


def test_delete_removes_everywhere(retriever) -> None:
    vs = retriever.vectorstore
    before = len(stored_metadata(vs))
    n_gamma = sum(1 for m in stored_metadata(vs) if m["doc_id"] == "gamma.txt")
    retriever.delete(["gamma.txt"])
    assert len(stored_metadata(vs)) == before - n_gamma
    assert all(m["doc_id"] != "gamma.txt" for m in stored_metadata(vs))
    assert len(retriever.index.lexical) == before - n_gamma
    assert all(d.metadata["doc_id"] != "gamma.txt" for d in retriever.invoke("royalties", k=5))
    keys = list(retriever.record_store.yield_keys())
    assert len(keys) == 3 * 3  # a pointer, a body and a version record per remaining document


def test_readd_unchanged_is_free_and_changed_replaces(docs, embeddings) -> None:
    r = RSERetriever.from_documents(docs, embedding=embeddings, k=2)
    calls, size = embeddings.calls, len(stored_metadata(r.vectorstore))
    assert r.add_documents(docs) == [d.metadata["source"] for d in docs]
    assert embeddings.calls == calls and len(stored_metadata(r.vectorstore)) == size

    new = Document(
        make_contract("gamma", ["sunset clause", "escrow"]), metadata={"source": "gamma.txt"}
    )
    r.add_documents([new])
    stored = [m for m in stored_metadata(r.vectorstore) if m["doc_id"] == "gamma.txt"]
    versions = {m["doc_version"] for m in stored}
    assert len(versions) == 1  # no orphan chunks of the old version
    assert len(stored_metadata(r.vectorstore)) == len(r.index.lexical)
    hits = r.invoke("escrow", k=1)
    assert hits[0].metadata["doc_id"] == "gamma.txt" and "escrow" in hits[0].page_content
    assert all(
        "royalties" not in d.page_content
        for d in r.invoke("royalties", k=5)
        if d.metadata["doc_id"] == "gamma.txt"
    )


def test_empty_document_is_skipped(embeddings) -> None:
    r = RSERetriever(vectorstore=InMemoryVectorStore(embeddings))
    assert r.add_documents([Document("  \n "), Document("real text here", id="x")]) == [
        "sha256:" + __import__("hashlib").sha256(b"  \n ").hexdigest()[:32],
        "x",
    ]
    assert len(r.index.lexical) == 1


def test_bad_documents(embeddings) -> None:
    r = RSERetriever(vectorstore=InMemoryVectorStore(embeddings))
    with pytest.raises(ValueError, match="duplicate document id"):
        r.add_documents([Document("a", id="x"), Document("b", id="x")])
    with pytest.raises(TypeError, match="not JSON-serialisable"):
        r.add_documents([Document("a", metadata={"when": object()})])
    with pytest.raises(TypeError, match="list of Documents"):
        r.add_documents("text")  # type: ignore[arg-type]
    assert len(r.index.lexical) == 0  # nothing half-written


def test_shared_vectorstore_foreign_documents_are_ignored(docs, embeddings) -> None:
    vs = InMemoryVectorStore(embeddings)
    vs.add_documents([Document("termination provisions of some other thing")])
    r = RSERetriever(vectorstore=vs, k=3)
    r.add_documents(docs)
    assert all("doc_id" in d.metadata for d in r.invoke(QUERY))


class _Recorder(BaseCallbackHandler):
    def __init__(self) -> None:
        self.names: list[str] = []

    def on_chain_start(self, serialized: Any, inputs: Any, **kwargs: Any) -> None:
        self.names.append(kwargs.get("name") or (serialized or {}).get("name", ""))


def test_child_runs_are_traced(retriever) -> None:
    rec = _Recorder()
    retriever.invoke(QUERY, config={"callbacks": [rec]})
    assert {"dense_search", "lexical_search"} <= set(rec.names)


def test_untraced_calls_return_what_traced_ones_do(retriever) -> None:
    """Without a callback handler the searches are called directly (no child runs): the
    results are exactly those of a traced call, which makes the child runs."""
    leads: list[str] = []

    class Leads(_Recorder):
        def on_retriever_start(self, serialized: Any, query: str, **kwargs: Any) -> None:
            leads.append(query)

    for mode in ("segments", "chunks"):
        rec = Leads()
        traced = retriever.invoke(QUERY, mode=mode, config={"callbacks": [rec]})
        assert {"dense_search", "lexical_search", "rse.route"} <= set(rec.names)
        assert leads == [QUERY]  # the retriever's own run; the lead index's is internal
        leads.clear()
        assert retriever.invoke(QUERY, mode=mode) == traced


def test_ls_params_name_the_stores(retriever) -> None:
    params = retriever._get_ls_params()
    # the class name, as LangChain's VectorStoreRetriever reports it
    assert params["ls_vector_store_provider"] == "FaissStore"
    assert params["ls_embedding_provider"] == "HashingEmbeddings"


def test_repr_is_useful(retriever) -> None:
    text = repr(retriever)
    assert "FaissStore" in text and "k=3" in text and "chunks=" in text


class _ReverseReranker(BaseReranker):
    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.seen: list[list[str]] = []

    def rerank(self, query, documents, *, callbacks=None) -> RerankResult:
        if self.fail:
            raise RerankError("service unavailable")
        self.seen.append([d.metadata["chunk_id"] for d in documents])
        order = list(range(len(documents)))[::-1]
        return RerankResult(
            order, [1.0] * len(order), [1.0 - i / len(order) for i in range(len(order))]
        )


def test_reranker_order_is_used(docs, embeddings) -> None:
    plain = RSERetriever.from_documents(docs, embedding=embeddings, k=50, mode="chunks")
    rr = _ReverseReranker()
    reranked = RSERetriever.from_documents(
        docs, embedding=embeddings, k=50, mode="chunks", reranker=rr
    )
    a, b = plain.invoke(QUERY), reranked.invoke(QUERY)
    assert [d.metadata["chunk_index"] for d in a][::-1] == [d.metadata["chunk_index"] for d in b]
    assert len(set(rr.seen[0])) == len(rr.seen[0])  # one document per candidate chunk


def test_reranker_failure_falls_back_or_raises(docs, embeddings, caplog) -> None:
    r = RSERetriever.from_documents(
        docs, embedding=embeddings, k=2, reranker=_ReverseReranker(fail=True)
    )
    with caplog.at_level("WARNING"):
        out = r.invoke(QUERY)
    assert out and all(d.metadata["rerank_fallback"] for d in out)
    assert "reranker failed" in caplog.text
    r.reranker.strict = True
    with pytest.raises(RerankError):
        r.invoke(QUERY)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"chunk_size": 0},
        {"chunk_overlap": 700},
        {"rse_params": "nope"},
        {"weights": (0.0, 0.0)},
        {"fetch_k": 0},
    ],
)
def test_bad_config(kwargs) -> None:
    with pytest.raises(ValueError):
        RSERetriever(vectorstore=InMemoryVectorStore(HashingEmbeddings()), **kwargs)


# Regression (issue 14, bug 7): field assignment was not validated.


class _ReverseCompressor(BaseDocumentCompressor):
    """Returns the documents in reverse order with descending relevance scores."""

    def compress_documents(self, documents, query, callbacks=None):  # type: ignore[override]
        out = list(reversed(documents))
        return [
            Document(d.page_content, metadata={**d.metadata, "relevance_score": 1 - i / 100})
            for i, d in enumerate(out)
        ]


def test_assignment_is_validated(retriever) -> None:
    with pytest.raises(ValueError, match="k must be"):
        retriever.k = -5
    assert retriever.k != -5
    with pytest.raises(ValueError, match="fetch_k"):
        retriever.fetch_k = 0
    with pytest.raises(TypeError, match="BaseReranker"):
        retriever.reranker = "cohere"  # type: ignore[assignment]
    retriever.reranker = _ReverseCompressor()  # a compressor is wrapped, as at construction
    assert type(retriever.reranker).__name__ == "CompressorReranker"
    assert retriever.invoke(QUERY)
    # what was read once at construction cannot be changed afterwards
    for name, value in [
        ("lexical_stemmer", None),
        ("record_store", InMemoryByteStore()),
        ("vectorstore", InMemoryVectorStore(HashingEmbeddings())),
    ]:
        with pytest.raises(ValueError, match="frozen"):
            setattr(retriever, name, value)


# Regression (issue 14, bug 8): unknown invoke keywords were silently ignored.


async def test_unknown_invoke_keywords_are_rejected(retriever) -> None:
    with pytest.raises(TypeError, match=r"top_k.*accepts k, mode, queries"):
        retriever.invoke(QUERY, top_k=1)
    with pytest.raises(TypeError, match="top_k"):
        await retriever.ainvoke(QUERY, top_k=1)
    assert len(retriever.invoke(QUERY, k=1)) == 1


def python_module(name: str, functions: int = 8) -> str:
    """Python source with a few snake_case identifiers in every line."""
    lines = [f'"""The {name} module."""', ""]
    for i in range(functions):
        lines += [
            f"def {name}_step_{i}(input_path, retry_count=3):",
            "    parsed_rows = read_rows(input_path)",
            f"    return apply_{name}_{i}(parsed_rows, retry_count)",
            "",
        ]
    return "\n".join(lines)


def test_queries_that_quote_code_give_bm25_the_dense_weight(retriever) -> None:
    from langchain_rse.pipeline import QuerySettings

    def weights(r: RSERetriever, query: str) -> tuple[float, float]:
        return QuerySettings.of(r, query, 4, None, None, [], None).weights

    assert retriever.weights == (2.0, 1.0)
    assert weights(retriever, "What does `terminate_early()` return?") == (2.0, 2.0)
    assert weights(retriever, "Can the customer terminate early?") == (2.0, 1.0)
    retriever.weights = (1.0, 0.0)  # dense only stays dense only
    assert weights(retriever, "What does `terminate_early()` return?") == (1.0, 0.0)
    retriever.weights = (1.0, 3.0)  # BM25 already weighs more
    assert weights(retriever, "What does `terminate_early()` return?") == (1.0, 3.0)
