"""Several queries for one retrieval: extra queries (queries=) and an expander."""

from __future__ import annotations

from typing import Any

import pytest
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage
from langchain_core.vectorstores import InMemoryVectorStore

from conftest import corpus_documents
from helpers import HashingEmbeddings
from langchain_rse import RSERetriever
from langchain_rse.expansion import QueryExpander
from langchain_rse.segments import RSEParams

PARAMS = RSEParams(4, 8, 0.3, 0.2, 10.0, extra_query_chunks=4)


@pytest.fixture(scope="module")
def retriever() -> RSERetriever:
    r = RSERetriever(vectorstore=InMemoryVectorStore(HashingEmbeddings()), k=10, rse_params=PARAMS)
    r.add_documents(corpus_documents())
    return r


def spans(docs) -> list[tuple[str, int, int]]:
    return [
        (d.metadata["doc_id"], d.metadata["start_index"], d.metadata["end_index"]) for d in docs
    ]


def test_extra_queries_widen_the_search_without_repeating_text(retriever) -> None:
    single = retriever.invoke("termination")
    multi = retriever.invoke("termination", queries=["royalties", "insurance cover"])
    assert {d.metadata["doc_id"] for d in multi} > {"gamma.txt"}
    # no text returned twice: segments of one document never overlap
    by_doc: dict[str, list[tuple[int, int]]] = {}
    for doc_id, s, e in spans(multi):
        by_doc.setdefault(doc_id, []).append((s, e))
    for ranges in by_doc.values():
        ranges.sort()
        assert all(a[1] <= b[0] for a, b in zip(ranges, ranges[1:]))
    # the budget grows by extra_query_chunks per extra query
    used = sum(d.metadata["chunk_end"] - d.metadata["chunk_start"] for d in multi)
    assert used <= PARAMS.max_total_chunks + 2 * PARAMS.extra_query_chunks
    assert sum(d.metadata["chunk_end"] - d.metadata["chunk_start"] for d in single) <= 8
    assert "queries" not in single[0].metadata


def test_metadata_shows_which_query_found_what(retriever) -> None:
    out = retriever.invoke("termination", queries=["royalties"], mode="chunks", k=20)
    for d in out:
        assert d.metadata["queries"] == ["termination", "royalties"]
        assert set(d.metadata["query_ranks"]) <= {"termination", "royalties"}
        assert d.metadata["query_ranks"], "every result was found by some query"
    royalty_chunks = [d for d in out if "royalties" in d.page_content.lower()]
    assert royalty_chunks and all("royalties" in d.metadata["query_ranks"] for d in royalty_chunks)


def test_duplicate_and_original_queries_collapse(retriever) -> None:
    plain = retriever.invoke("termination")
    same = retriever.invoke("termination", queries=["Termination ", "termination"])
    assert spans(plain) == spans(same) and "queries" not in same[0].metadata


def test_bad_queries_argument(retriever) -> None:
    with pytest.raises(TypeError, match="list of strings"):
        retriever.invoke("termination", queries="royalties")
    with pytest.raises(ValueError, match="non-empty"):
        retriever.invoke("termination", queries=["  "])


async def test_async_equals_sync(retriever) -> None:
    kwargs: dict[str, Any] = {"queries": ["royalties", "warranty"]}
    sync = retriever.invoke("termination", **kwargs)
    assert [
        (d.page_content, d.metadata) for d in await retriever.ainvoke("termination", **kwargs)
    ] == [(d.page_content, d.metadata) for d in sync]


class ListExpander:
    """A stand-in expander: fixed rewrites, counts calls."""

    def __init__(self, rewrites: list[str]) -> None:
        self.rewrites = rewrites
        self.calls = 0

    def expand(self, query: str, *, callbacks: Any = None) -> list[str]:
        self.calls += 1
        return [query, *self.rewrites]

    async def aexpand(self, query: str, *, callbacks: Any = None) -> list[str]:
        return self.expand(query, callbacks=callbacks)


async def test_expander_queries_are_searched_and_original_kept() -> None:
    expander = ListExpander(["royalties payable", "audit rights"])
    r = RSERetriever(
        vectorstore=InMemoryVectorStore(HashingEmbeddings()),
        k=10,
        rse_params=PARAMS,
        query_expander=expander,
    )
    r.add_documents(corpus_documents())
    out = r.invoke("termination")
    assert expander.calls == 1
    assert out[0].metadata["queries"] == ["termination", "royalties payable", "audit rights"]
    assert any("royalties" in d.page_content.lower() for d in out)
    assert [d.metadata for d in await r.ainvoke("termination")] == [d.metadata for d in out]


class CountingChat(GenericFakeChatModel):
    """A fake chat model that answers with a numbered list and counts its calls."""

    calls: int = 0
    fail: bool = False

    def _generate(self, messages, stop=None, run_manager=None, **kwargs):  # type: ignore[override]
        self.calls += 1
        if self.fail:
            raise RuntimeError("model unavailable")
        return super()._generate(messages, stop=stop, run_manager=run_manager, **kwargs)


def expander_retriever(llm: CountingChat) -> RSERetriever:
    expander = QueryExpander(llm, n=2, max_retries=0)
    r = RSERetriever(
        vectorstore=InMemoryVectorStore(HashingEmbeddings()),
        k=10,
        rse_params=PARAMS,
        query_expander=expander,
    )
    r.add_documents(corpus_documents())
    return r


def test_query_expander_end_to_end_cached() -> None:
    llm = CountingChat(messages=iter([AIMessage("1. royalties payable\n2. audit rights\n")]))
    r = expander_retriever(llm)
    first = r.invoke("termination")
    assert llm.calls == 1
    assert first[0].metadata["queries"] == ["termination", "royalties payable", "audit rights"]
    again = r.invoke("termination")  # cached expansion: no model call
    assert llm.calls == 1 and spans(again) == spans(first)


def test_query_expander_failure_falls_back_to_the_query(caplog) -> None:
    llm = CountingChat(messages=iter([]), fail=True)
    r = expander_retriever(llm)
    plain = RSERetriever(
        vectorstore=InMemoryVectorStore(HashingEmbeddings()), k=10, rse_params=PARAMS
    )
    plain.add_documents(corpus_documents())
    with caplog.at_level("WARNING"):
        out = r.invoke("termination")
    assert llm.calls >= 1 and "queries" not in out[0].metadata
    assert spans(out) == spans(plain.invoke("termination"))


def test_each_candidate_keeps_its_rank_in_every_branch() -> None:
    """A candidate's ranks are 1-based per branch (each query's dense, then lexical), 0 where
    a branch lacks it; a chunk returned in chunks mode names a missing rank None."""
    from langchain_rse.fusion import branches_of, candidates, fused
    from langchain_rse.indexing.records import chunk_key
    from langchain_rse.query import DenseResult

    a, b, c = (chunk_key("d", "v", i) for i in range(3))
    dense = [DenseResult([(a, 0.9), (b, 0.5)]), DenseResult([(c, 0.7)])]
    branches, texts = branches_of(dense, [[(c, 3.0), (a, 1.0)], []])
    found = candidates(fused(branches, [2.0, 1.0, 2.0, 1.0]), 75, texts)
    assert [(x.key, x.chunk_index, x.ranks) for x in found] == [
        (c, 2, [0, 1, 1, 0]),  # 1/61 + 2/61
        (a, 0, [1, 2, 0, 0]),  # 2/61 + 1/62
        (b, 1, [2, 0, 0, 0]),  # 2/62
    ]
    assert [x.fused_score for x in found] == pytest.approx([3 / 61, 2 / 61 + 1 / 62, 2 / 62])


def test_chunks_mode_names_a_branch_that_missed_a_chunk_none() -> None:
    r = RSERetriever(vectorstore=InMemoryVectorStore(HashingEmbeddings()), fetch_k=5, router=None)
    r.add_documents(corpus_documents())
    found = r.invoke("royalty audit", mode="chunks", k=10)  # 5 hits a branch: each misses some
    ranks = [(d.metadata["dense_rank"], d.metadata["lexical_rank"]) for d in found]
    assert {pair.index(None) for pair in ranks if None in pair} == {0, 1}
    assert all(r is None or (type(r) is int and r >= 1) for pair in ranks for r in pair)
