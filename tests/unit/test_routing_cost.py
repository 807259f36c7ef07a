"""A query's routing cost does not grow with its clauses (issue 54, finding 7).

An 8,192-character query of thousands of clauses (``...; 17; 17; ...``) ran one lead-index
search per clause, each with a generation read of a shared record store: ~2,700 store reads
per query. Counted here through the record store the user passes in.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from langchain_core.stores import BaseStore, InMemoryByteStore
from langchain_core.vectorstores import InMemoryVectorStore
from test_routing import NAMES, ONE_WORD, contract

from helpers import HashingEmbeddings
from langchain_rse import DocumentRouter, NoEnricher, RSERetriever
from langchain_rse.indexing.writer import GENERATION_KEY

NAMING = "Consider the Orion Supply Agreement between Orion Holdings and the Buyer"


class CountingStore(BaseStore[str, bytes]):
    """A shared record store (not an ``InMemoryByteStore``) that counts the keys read."""

    def __init__(self) -> None:
        self.inner = InMemoryByteStore()
        self.reads = 0
        self.generation_reads = 0

    def mget(self, keys: Sequence[str]) -> list[bytes | None]:
        self.reads += len(keys)
        self.generation_reads += sum(k == GENERATION_KEY for k in keys)
        return self.inner.mget(keys)

    def mset(self, key_value_pairs: Sequence[tuple[str, bytes]]) -> None:
        self.inner.mset(key_value_pairs)

    def mdelete(self, keys: Sequence[str]) -> None:
        self.inner.mdelete(keys)

    def yield_keys(self, *, prefix: str | None = None) -> Iterator[str]:
        return self.inner.yield_keys(prefix=prefix)


@pytest.fixture(scope="module")
def shared() -> tuple[RSERetriever, CountingStore]:
    store = CountingStore()
    retriever = RSERetriever(
        vectorstore=InMemoryVectorStore(HashingEmbeddings()),
        record_store=store,
        chunk_size=200,
        enricher=NoEnricher(),
        router=DocumentRouter.leads(min_naming=ONE_WORD),
        show_progress=False,
    )
    retriever.add_documents([contract(n) for n in NAMES])
    assert retriever.router is not None
    assert getattr(retriever.router.route(NAMING), "docs", None) == {"orion.txt"}
    return retriever, store


def reads(pair: tuple[RSERetriever, CountingStore], query: str, routed: bool = True) -> int:
    """The record-store keys one query reads (``routed``: check the query was routed)."""
    retriever, store = pair
    store.reads = store.generation_reads = 0
    found = retriever.invoke(query)
    if routed:
        assert found and found[0].metadata["doc_id"] == "orion.txt", "the query is routed"
    assert store.generation_reads <= 3, "one check per search: BM25, the leads, the focus"
    return store.reads


def test_thousands_of_clauses_cost_the_reads_of_a_few(shared) -> None:
    plain = reads(shared, f"{NAMING}; termination notice")
    amplified = f"{NAMING}; " + "; ".join(["17"] * 3000)
    amplified = amplified[:8192]
    assert amplified.count(";") > 2000
    assert reads(shared, amplified) <= plain + 2  # was ~2,040 reads, one per clause


def test_a_naming_question_of_thousands_of_parts_costs_the_reads_of_a_few(shared) -> None:
    plain = reads(shared, "In the Orion Supply Agreement, which law governs? Answer briefly.")
    parts = "In the Orion Supply Agreement, " + "17, " * 2000 + "which law governs? Answer."
    assert reads(shared, parts) <= plain + 2


@settings(max_examples=25)
@given(
    n=st.integers(1, 2500),
    clause=st.sampled_from(["17", "x", "notice period", "é ü", "Orion"]),
    sep=st.sampled_from(["; ", "\n", ", "]),
)
def test_store_reads_per_query_do_not_grow_with_clauses(
    shared, n: int, clause: str, sep: str
) -> None:
    """Three generation checks at most, and no more reads than the pointers and bodies of the few
    documents returned, however many clauses the query has."""
    query = (f"{NAMING}; which law governs" + sep + sep.join([clause] * n) + "?")[-8192:]
    assert reads(shared, query, routed=False) <= 3 + 2 * len(NAMES)
