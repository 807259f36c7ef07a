"""Focus: a routed query without the words that name its document ranks that document's
chunks (issue 16; by words, not clauses, since issue 55)."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from langchain_core.documents import BaseDocumentCompressor, Document
from langchain_core.vectorstores import InMemoryVectorStore
from test_routing import ONE_WORD
from test_routing import contract as routing_contract

from helpers import HashingEmbeddings, search_branches
from langchain_rse import DocumentRouter, RSERetriever
from langchain_rse.filters import doc_ids, parse
from langchain_rse.integrations.faiss import FaissStore
from langchain_rse.lexical.tokenizer import tokenize
from langchain_rse.routing import LeadIndex

QUERY = (
    "Consider the Orion Supply Agreement between Orion Holdings and the Buyer; "
    "which state's laws govern"
)
LAW = "governed by the laws of the State of Texas"


def contract(name: str, state: str) -> Document:
    """One template for every contract: the name only in the opening, 30 look-alike
    clauses, and a governing-law clause at the end."""
    law = f"\n\n31. Governing Law\n\nThis contract is governed by the laws of the State of {state}."
    return routing_contract(name, 30, law)


DOCS = [contract(n, s) for n, s in (("Orion", "Texas"), ("Lyra", "Ohio"), ("Vega", "Utah"))]


def build(focus: bool = True, **kwargs: Any) -> RSERetriever:
    retriever = RSERetriever(
        vectorstore=InMemoryVectorStore(HashingEmbeddings()),
        chunk_size=200,
        router=DocumentRouter.leads(focus=focus, min_naming=ONE_WORD),
        **kwargs,
    )
    retriever.add_documents(DOCS)
    return retriever


ASKED = "which state's laws govern"
PHRASINGS = [
    QUERY,
    "Which state's laws govern the Orion Supply Agreement?",
    "In the Orion Supply Agreement, which state's laws govern?",
    "which state's laws govern, according to the Orion Supply Agreement between Orion "
    "Holdings and the Buyer?",
    "Orion Holdings's supply agreement: which state's laws govern?",
    "in the supply agreement with orion, which state's laws govern?",
    "Which state's laws govern? Consider the Orion Supply Agreement",
]
"""One question, the contract named in each place a user names it."""
CONNECTORS = "consider the in under supply agreement between holdings and buyer according to with s"
"""Words around a name that a phrasing may add (they are in every contract's lead)."""


def _asked_terms(text: str) -> set[str]:
    return set(tokenize(text)) - set(tokenize(CONNECTORS))


def test_the_words_that_name_the_routed_document_are_dropped_wherever_they_stand() -> None:
    router = build().router
    assert router is not None and router.focus and isinstance(router.retriever, LeadIndex)
    assert router.focuses(QUERY)
    for query in PHRASINGS:
        focused = router.focus_query(query, {"orion.txt"})
        assert focused is not None and ASKED in focused.lower(), (query, focused)
        assert "orion" not in focused.lower()
        assert _asked_terms(focused) == _asked_terms(ASKED), (query, focused)
        # no comma, semicolon or colon is left where the name was cut out
        assert not re.search(r"[,;:]\s*(?:[?.!]|$)", focused), (query, focused)
    # the name's own words go with it (capitalized words its lead holds, across a comma)
    assert router.focus_query(QUERY, {"orion.txt"}) == ASKED
    named = "In the Orion Supply Agreement, between Orion Holdings and the Buyer, which state's"
    assert router.focus_query(f"{named} laws govern?", {"orion.txt"}) == f"{ASKED}?"
    # nothing names the routed document: nothing to focus on
    assert router.focus_query("red apples; green pears", {"orion.txt"}) is None
    assert router.focus_query(ASKED, {"orion.txt"}) is None
    # what is left asks nothing: no focus
    assert router.focus_query("What about Orion?", {"orion.txt"}) is None
    # the name of another document is not this one's
    assert router.focus_query("Which laws govern the Lyra agreement?", {"orion.txt"}) is None
    off = DocumentRouter.leads(focus=False)
    assert not off.focuses(QUERY) and off.focus_query(QUERY, {"orion.txt"}) is None


@settings(max_examples=60)
@given(
    where=st.sampled_from(["first", "inside", "end", "possessive"]),
    name=st.sampled_from(["Orion", "ORION", "orion", "Orion Holdings"]),
    ask=st.sampled_from(
        [ASKED, "when does the term end", "what notice period applies to termination"]
    ),
    spaces=st.sampled_from([" ", "  ", "\n"]),
)
def test_focus_asks_the_same_however_the_name_is_placed(
    where: str, name: str, ask: str, spaces: str
) -> None:
    """Metamorphic: the focus text holds the words of what is asked and no word of the
    name, wherever and however the name stands."""
    query = {
        "first": f"Consider the {name} Supply Agreement;{spaces}{ask}",
        "inside": f"{ask.capitalize()} under the{spaces}{name} supply agreement?",
        "end": f"{ask},{spaces}according to the {name} agreement?",
        "possessive": f"{name}'s supply agreement:{spaces}{ask}?",
    }[where]
    focused = ROUTER.focus_query(query, {"orion.txt"})
    assert focused is not None and _asked_terms(focused) == _asked_terms(ask), (query, focused)
    # and no comma, semicolon or colon is left where the name was cut out
    assert not re.search(r"[,;:]\s*(?:[?.!]|$)", focused), (query, focused)


ROUTER = build().router
assert ROUTER is not None


def test_focus_ranks_the_asked_clause_first() -> None:
    for mode in ("chunks", "segments"):
        focused = build().invoke(QUERY, k=3, mode=mode)
        plain = build(focus=False).invoke(QUERY, k=3, mode=mode)
        assert focused[0].metadata["doc_id"] == plain[0].metadata["doc_id"] == "orion.txt"
        # the words that name the contract (in every chunk's header) decide without focus
        assert LAW not in plain[0].page_content and "ORION SUPPLY" in plain[0].page_content
        assert LAW in focused[0].page_content


async def test_focus_async_matches_sync() -> None:
    retriever = build()
    sync = retriever.invoke(QUERY, k=4)
    assert [d.page_content for d in await retriever.ainvoke(QUERY, k=4)] == [
        d.page_content for d in sync
    ]


def test_focus_searches_only_inside_the_routed_document() -> None:
    retriever = build()
    seen: list[Any] = []
    search = search_branches(retriever)
    original = search.search
    search.search = lambda q, f, router=None, callbacks=None: (  # type: ignore[method-assign]
        seen.append((q, f, router)) or original(q, f, router, callbacks)
    )
    retriever._search = lambda: search  # type: ignore[method-assign]
    retriever.invoke(QUERY, filter={"tier": {"$ne": "x"}})
    (main, _, router), (focus, f, none) = seen
    assert main == [QUERY] and router is not None
    assert focus == [router.focus_query(QUERY, {"orion.txt"})] and none is None
    assert ASKED in focus[0] and "Orion" not in focus[0]
    assert f == parse({"$and": [{"tier": {"$ne": "x"}}, {"doc_id": "orion.txt"}]})


class _Recording(BaseDocumentCompressor):
    """Keeps the documents in order and records each query it reranks for."""

    queries: list[str] = []

    def compress_documents(self, documents, query, callbacks=None):  # type: ignore[override]
        self.queries.append(query)
        return list(documents)


async def test_the_reranker_also_scores_against_the_focus_text() -> None:
    focused = build().router.focus_query(QUERY, {"orion.txt"})  # type: ignore[union-attr]
    for focus, expected in ((True, [QUERY, focused]), (False, [QUERY])):
        reranker = _Recording(queries=[])
        retriever = build(focus=focus, reranker=reranker)
        retriever.invoke(QUERY)
        assert reranker.queries == expected
        reranker.queries.clear()
        await retriever.ainvoke(QUERY)
        assert reranker.queries == expected
    # a query that names no document has no focus text
    reranker = _Recording(queries=[])
    build(reranker=reranker).invoke("which state's laws govern")
    assert reranker.queries == ["which state's laws govern"]


def test_a_route_that_does_not_hold_has_no_focus() -> None:
    retriever = build()
    calls: list[Any] = []
    router = retriever.router
    assert router is not None
    original = router.focus_query
    object.__setattr__(router, "focus_query", lambda *a: calls.append(a) or original(*a))
    # names no contract: the leads tie, so the route does not hold and no focus search runs
    retriever.invoke("Supply agreement between Holdings and the Buyer; which state's laws govern")
    assert calls == []
    retriever.invoke(QUERY)
    assert calls == [(QUERY, {"orion.txt"}, None)]


def test_focus_is_saved_and_loaded(tmp_path) -> None:
    retriever = build(focus=False)
    retriever.save(tmp_path / "idx")
    loaded = RSERetriever.load(tmp_path / "idx", embedding=HashingEmbeddings())
    assert loaded.router is not None and loaded.router.focus is False
    assert [d.page_content for d in loaded.invoke(QUERY)] == [
        d.page_content for d in retriever.invoke(QUERY)
    ]


@pytest.mark.parametrize("store", ["memory", "faiss"])
def test_a_filter_on_doc_id_keeps_that_document(store: str) -> None:
    # the filter sees each document's doc_id, in the dense branch, the lexical branch and
    # the check every candidate passes (it used to drop every result)
    kwargs: dict[str, Any] = {"router": None, "chunk_size": 200}
    if store == "memory":
        retriever = RSERetriever(vectorstore=InMemoryVectorStore(HashingEmbeddings()), **kwargs)
        retriever.add_documents(DOCS)
    else:
        retriever = RSERetriever.from_documents(DOCS, embedding=HashingEmbeddings(), **kwargs)
    for f in ({"doc_id": "lyra.txt"}, {"doc_id": {"$in": ["lyra.txt", "vega.txt"]}}):
        wanted = set(doc_ids(parse(f)) or ())
        for mode in ("segments", "chunks"):
            found = retriever.invoke("termination notice period", k=10, mode=mode, filter=f)
            assert found and {d.metadata["doc_id"] for d in found} <= wanted
    assert doc_ids(parse({"doc_id": "a", "tier": "b"})) == {"a"}  # (then "tier" checked)
    assert doc_ids(parse({"$or": [{"doc_id": "a"}, {"tier": "b"}]})) is None
    assert doc_ids(parse({"doc_id": {"$ne": "a"}})) is None


def inside(*names: str) -> Any:
    return parse({"doc_id": names[0] if len(names) == 1 else {"$in": list(names)}})


def test_default_store_searches_inside_documents() -> None:
    retriever = RSERetriever.from_documents(
        DOCS[:2], embedding=HashingEmbeddings(), router=None, chunk_size=200
    )
    vs = retriever.vectorstore
    assert isinstance(vs, FaissStore)
    query = "termination notice period"
    everything = vs.ranked(query, 10_000)
    found = vs.ranked(query, 5, inside("lyra.txt"))
    assert len(found) == 5 and all(k.startswith("lyra.txt") for k, _ in found)
    # the best scores of the unrestricted search, each hit with its score there (the
    # template contracts tie: tied chunks may come in another order)
    expected = [(k, s) for k, s in everything if k.startswith("lyra.txt")][:5]
    assert np.allclose([s for _, s in found], [s for _, s in expected])
    best = {k: s for k, s in everything}
    assert all(np.isclose(best[k], s) for k, s in found)
    assert vs.ranked(query, 5, inside("unknown.txt")) == []
    # writes invalidate the positions: a new document is found, a deleted one is not
    retriever.add_documents([DOCS[2]])
    assert vs.ranked(query, 3, inside("vega.txt"))
    retriever.delete(["lyra.txt"])
    assert vs.ranked(query, 3, inside("lyra.txt")) == []
    assert all(k.startswith("vega.txt") for k, _ in vs.ranked(query, 3, inside("vega.txt")))


def test_default_store_searches_inside_documents_of_an_ivf_index() -> None:
    import faiss

    emb = HashingEmbeddings()
    flat_store = RSERetriever.from_documents(DOCS, embedding=emb, router=None, chunk_size=200)
    flat = flat_store.vectorstore.ranked("termination notice period", 100, inside("lyra.txt"))
    dim = len(emb.embed_query("probe"))
    ivf = faiss.IndexIVFFlat(faiss.IndexFlatIP(dim), dim, 2, faiss.METRIC_INNER_PRODUCT)
    ivf.cp.min_points_per_centroid = 1  # a tiny training set
    vectors = np.asarray(emb.embed_documents([d.page_content for d in DOCS] * 2), dtype="float32")
    faiss.normalize_L2(vectors)
    ivf.train(vectors)
    ivf.nprobe = 2  # every list: the IVF search is exact, and must restrict as the flat one
    retriever = RSERetriever(
        vectorstore=FaissStore(emb, ivf, keep_text=False), router=None, chunk_size=200
    )
    retriever.add_documents(DOCS)
    ivf_hits = retriever.vectorstore.ranked("termination notice period", 100, inside("lyra.txt"))
    assert len(flat) > 5 and all(k.startswith("lyra.txt") for k, _ in flat)
    # ties may come in another order; chunks by (doc id, index): each write has its own version
    chunks = lambda hits: {(k.split("\x1f")[0], k.split("\x1f")[-1]) for k, _ in hits}  # noqa: E731
    assert chunks(ivf_hits) == chunks(flat)
    assert np.allclose(sorted(s for _, s in ivf_hits), sorted(s for _, s in flat))


def test_focus_with_a_hard_route_and_with_several_queries() -> None:
    hard = RSERetriever(
        vectorstore=InMemoryVectorStore(HashingEmbeddings()),
        chunk_size=200,
        router=DocumentRouter.leads(boost=float("inf"), min_naming=ONE_WORD),
    )
    hard.add_documents(DOCS)
    found = hard.invoke(QUERY, k=3, mode="chunks")
    assert {d.metadata["doc_id"] for d in found} == {"orion.txt"} and LAW in found[0].page_content
    # extra queries keep their own ranks; the focus branches are not one of them
    several = build().invoke(QUERY, k=3, mode="chunks", queries=["governing law of Texas"])
    assert LAW in several[0].page_content
    assert set(several[0].metadata["query_ranks"]) <= {QUERY, "governing law of Texas"}


def test_a_store_without_filters_answers_without_focus() -> None:
    from test_filters import _opaque_store

    opaque = RSERetriever(vectorstore=_opaque_store(), chunk_size=200)
    opaque.add_documents(DOCS)
    assert opaque.router is not None and opaque.router.focus
    found = opaque.invoke(QUERY, k=3)  # the focus search would need a filter: skipped
    assert found and found[0].metadata["doc_id"] == "orion.txt"
