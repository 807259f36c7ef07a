"""Document routing: a document-level retriever picks the documents the chunk search keeps."""

from __future__ import annotations

import math
import random
from typing import Any

import pytest
from langchain_core.callbacks import CallbackManagerForRetrieverRun
from langchain_core.documents import Document
from langchain_core.retrievers import BaseRetriever
from langchain_core.vectorstores import InMemoryVectorStore

from helpers import HashingEmbeddings, search_branches
from langchain_rse import DocumentRouter, NoEnricher, RSERetriever
from langchain_rse.indexing.chunking import document_leads
from langchain_rse.routing import DEFAULT_BOOST, LeadIndex

NAMES = ["Orion", "Lyra", "Vega"]
QUERY = "termination notice period of the Orion supply agreement"
REQUEST = {"query": QUERY, "filter": None}
ONE_WORD = 1.0
"""``min_naming`` that routes a query naming its contract by one word no other lead holds
(``Orion``: among three look-alike contracts the only word that names one; the default asks
for more, see ``LeadIndex.naming_weight``)."""


def contract(name: str, clauses: int = 8, tail: str = "") -> Document:
    """A contract whose name is only in its opening: the body (``clauses`` look-alike
    clauses, then ``tail``) could belong to any of them."""
    body = "\n\n".join(
        f"{n}. Clause {n}\n\nEither party may end this contract by termination with a notice "
        f"period of {n * 10} days, and the supplier shall deliver goods within {n} weeks "
        f"under the payment terms of clause {n}."
        for n in range(1, clauses + 1)
    )
    opening = f"{name.upper()} SUPPLY AGREEMENT\n\nbetween {name} Holdings and the Buyer.\n\n"
    return Document(page_content=opening + body + tail, id=f"{name.lower()}.txt")


def build(**kwargs: Any) -> tuple[RSERetriever, list[Document]]:
    """The contracts indexed; without routing unless ``router`` is given."""
    kwargs.setdefault("router", None)
    docs = [contract(n) for n in NAMES]
    retriever = RSERetriever(
        vectorstore=InMemoryVectorStore(HashingEmbeddings()),
        chunk_size=200,
        enricher=NoEnricher(),
        **kwargs,
    )
    retriever.add_documents(docs)
    return retriever, docs


def lead_router(docs: list[Document]) -> RSERetriever:
    return RSERetriever.from_documents(
        document_leads(docs),
        embedding=HashingEmbeddings(),
        mode="chunks",
        enricher=NoEnricher(),
        k=3,
    )


class RecordingRouter(BaseRetriever):
    """Returns fixed documents and records the queries it was asked."""

    results: list[Document]
    calls: list[str] = []

    def _get_relevant_documents(
        self, query: str, *, run_manager: CallbackManagerForRetrieverRun
    ) -> list[Document]:
        self.calls.append(query)
        return self.results


def test_document_leads() -> None:
    docs = [
        Document("  ACME   LEASE\n\n  between  A and B " + "x " * 500, metadata={"source": "a.md"}),
        Document("Body text.", id="doc-2", metadata={"title": "Quarterly Report"}),
    ]
    leads = document_leads(docs, max_chars=20)
    assert [lead.id for lead in leads] == ["a.md", "doc-2"]
    assert [lead.metadata["doc_id"] for lead in leads] == ["a.md", "doc-2"]
    assert leads[0].page_content == "ACME LEASE between A"
    assert leads[0].metadata["source"] == "a.md"
    assert leads[1].page_content == "Quarterly Report\nBody text."
    with pytest.raises(ValueError, match="max_chars"):
        document_leads(docs, max_chars=0)


LEGEND = (
    "Exhibit 10.1 CERTAIN CONFIDENTIAL INFORMATION CONTAINED IN THIS DOCUMENT, MARKED BY [***], "
    "HAS BEEN OMITTED BECAUSE THE REGISTRANT HAS DETERMINED THAT THE INFORMATION (I) IS NOT "
    "MATERIAL AND (II) WOULD LIKELY CAUSE COMPETITIVE HARM TO THE REGISTRANT IF PUBLICLY "
    "DISCLOSED. Information that has been omitted has been noted in this document with a "
    "placeholder identified by the mark [***]. Execution Version. "
)


def test_the_lead_reaches_past_a_cover_legend() -> None:
    """Filed contracts often open with the same several-hundred-character legend: the lead
    still holds the title and parties behind it, so a question naming them routes."""
    docs = [Document(LEGEND * 2 + d.page_content, id=d.id) for d in map(contract, NAMES)]
    assert len(LEGEND * 2) > 600
    leads = LeadIndex()
    leads.add_sources(docs)
    assert "ORION SUPPLY AGREEMENT" in leads.get(["orion.txt"])[0].page_content
    assert leads.hits(QUERY)[0][0] == "orion.txt"
    retriever = RSERetriever(
        vectorstore=InMemoryVectorStore(HashingEmbeddings()),
        chunk_size=200,
        enricher=NoEnricher(),
        router=DocumentRouter.leads(min_naming=ONE_WORD),
    )
    retriever.add_documents(docs)
    assert retriever.router is not None
    route = retriever.router.route(QUERY, {})
    assert route is not None and route.docs == {"orion.txt"} and route.check_k == 50
    results = retriever.invoke(QUERY, k=4, mode="chunks")
    assert results[0].metadata["doc_id"] == "orion.txt"


def test_routing_keeps_the_chosen_document() -> None:
    plain, docs = build()
    assert len({d.metadata["doc_id"] for d in plain.invoke(QUERY, k=6, mode="chunks")}) > 1

    router = lead_router(docs)
    assert router.invoke(QUERY)[0].metadata["doc_id"] == "orion.txt"
    routed, _ = build(router=router)  # a bare retriever: DocumentRouter defaults
    texts = {d.id: d.page_content for d in docs}
    for mode in ("chunks", "segments"):
        results = routed.invoke(QUERY, k=6, mode=mode)
        assert results and {d.metadata["doc_id"] for d in results} == {"orion.txt"}
        for d in results:
            m = d.metadata
            assert d.page_content == texts[m["doc_id"]][m["start_index"] : m["end_index"]]


async def test_routing_async_matches_sync() -> None:
    _, docs = build()
    routed, _ = build(router=DocumentRouter(retriever=lead_router(docs)))
    for mode in ("chunks", "segments"):
        sync = routed.invoke(QUERY, k=5, mode=mode)
        assert [
            (d.page_content, d.metadata) for d in await routed.ainvoke(QUERY, k=5, mode=mode)
        ] == [(d.page_content, d.metadata) for d in sync]


def test_route_documents_and_ids_from_document_id() -> None:
    # ids from Document.id when the router's results have no doc_id metadata
    router = RecordingRouter(
        results=[Document("x", id="vega.txt"), Document("y", id="lyra.txt")], calls=[]
    )
    routed, _ = build(router=DocumentRouter(retriever=router, documents=2))
    found = {d.metadata["doc_id"] for d in routed.invoke(QUERY, k=10, mode="chunks")}
    assert found == {"vega.txt", "lyra.txt"}
    # the router is asked the original query only, also with extra queries
    routed.invoke(QUERY, queries=["delivery of goods"])
    assert router.calls[-1] == QUERY and router.calls.count("delivery of goods") == 0


def test_a_router_that_finds_nothing_of_ours_filters_nothing() -> None:
    plain, _ = build()
    foreign = RecordingRouter(results=[Document("unrelated", metadata={})], calls=[])
    unknown = RecordingRouter(results=[Document("x", id="not-indexed.txt")], calls=[])
    empty = RecordingRouter(results=[], calls=[])
    expected = [(d.page_content, d.metadata) for d in plain.invoke(QUERY, k=5)]
    for router in (foreign, unknown, empty):
        for check in (10, None):
            routed, _ = build(router=DocumentRouter(retriever=router, check_k=check))
            assert [(d.page_content, d.metadata) for d in routed.invoke(QUERY, k=5)] == expected
        assert router.calls == [QUERY, QUERY]


def test_routing_settings_are_validated_and_saved(tmp_path) -> None:
    with pytest.raises(ValueError, match="documents"):
        DocumentRouter(retriever=lead_router([]), documents=0)
    leads = lead_router([contract(n) for n in NAMES])
    routed, docs = build(router=DocumentRouter(retriever=leads, documents=2, check_k=5))
    routed.save(tmp_path / "idx")
    # the router's settings are saved; its retriever is passed again
    loaded = RSERetriever.load(tmp_path / "idx", embedding=HashingEmbeddings(), router=leads)
    assert loaded.router is not None and loaded.router.retriever is leads
    assert (loaded.router.documents, loaded.router.check_k) == (2, 5)
    assert [d.page_content for d in loaded.invoke(QUERY)] == [
        d.page_content for d in routed.invoke(QUERY)
    ]


async def test_a_copy_searches_with_its_own_settings() -> None:
    # model_copy copies private state: the copy's search branches must use the copy's
    # fetch depth and router, not the original's.
    plain, docs = build(fetch_k=2)
    copy = plain.model_copy(update={"fetch_k": 12})
    assert len(search_branches(plain).dense(REQUEST).hits) == 2
    assert len(search_branches(copy).dense(REQUEST).hits) == 12
    assert len((await search_branches(copy).adense(REQUEST)).hits) == 12
    assert len(search_branches(copy).lexical_search(REQUEST)) > 2
    router = DocumentRouter(retriever=lead_router(docs))
    routed = plain.model_copy(update={"router": router, "fetch_k": 20})
    assert len(search_branches(routed).dense(REQUEST).hits) == 20
    results = routed.invoke(QUERY, k=6, mode="chunks")
    assert results and {d.metadata["doc_id"] for d in results} == {"orion.txt"}
    assert len(search_branches(plain).dense(REQUEST).hits) == 2  # the original is unchanged
    # assignment is validated and takes effect too
    plain.fetch_k = 7
    assert len(search_branches(plain).dense(REQUEST).hits) == 7


def with_unrelated_doc(**kwargs: Any) -> RSERetriever:
    retriever, _ = build(**kwargs)
    weather = "\n\n".join(
        f"Day {n}: light rain over the northern hills, winds from the west at {n} knots."
        for n in range(1, 9)
    )
    retriever.add_documents([Document(page_content=weather, id="weather.txt")])
    return retriever


def test_a_route_the_search_disagrees_with_is_not_applied() -> None:
    wrong = RecordingRouter(results=[Document("x", id="weather.txt")], calls=[])
    plain = with_unrelated_doc()
    expected = [(d.page_content, d.metadata) for d in plain.invoke(QUERY, k=5)]
    assert "weather.txt" not in {m["doc_id"] for _, m in expected}

    checked = with_unrelated_doc(router=DocumentRouter(retriever=wrong, check_k=10))
    assert [(d.page_content, d.metadata) for d in checked.invoke(QUERY, k=5)] == expected

    forced = with_unrelated_doc(router=DocumentRouter(retriever=wrong, check_k=None))
    found = forced.invoke(QUERY, k=5, mode="chunks")
    assert found and {d.metadata["doc_id"] for d in found} == {"weather.txt"}


async def test_only_the_routed_documents_the_search_agrees_with_are_kept() -> None:
    router = RecordingRouter(
        results=[Document("x", id="weather.txt"), Document("y", id="lyra.txt")], calls=[]
    )
    routed = with_unrelated_doc(router=DocumentRouter(retriever=router, documents=2, check_k=10))
    for results in (
        routed.invoke(QUERY, k=10, mode="chunks"),
        await routed.ainvoke(QUERY, k=10, mode="chunks"),
    ):
        assert {d.metadata["doc_id"] for d in results} == {"lyra.txt"}


def test_fetch_k_is_one_field_on_the_retriever() -> None:
    # the retriever's default is what its default (routed) search fetched: 200 per branch
    r = RSERetriever(vectorstore=InMemoryVectorStore(HashingEmbeddings()))
    assert r.fetch_k == 200 and r.router is not None
    with pytest.raises(ValueError, match="fetch_k"):
        DocumentRouter(retriever=RecordingRouter(results=[], calls=[]), fetch_k=200)


def test_router_settings_are_validated() -> None:
    for bad in ({"check_k": 0}, {"documents": 0}, {"fetch_k": 50}, {"unknown": 1}):
        with pytest.raises(ValueError):
            DocumentRouter(retriever=RecordingRouter(results=[], calls=[]), **bad)


async def test_sync_router_keeps_the_leads_in_step() -> None:
    router = RSERetriever(
        vectorstore=InMemoryVectorStore(HashingEmbeddings()), mode="chunks", enricher=NoEnricher()
    )
    routed, docs = build(router=DocumentRouter(retriever=router, sync=True))
    assert {d.id for d in router.get(["orion.txt", "lyra.txt", "vega.txt"])} == {
        "orion.txt",
        "lyra.txt",
        "vega.txt",
    }
    assert router.invoke(QUERY)[0].metadata["doc_id"] == "orion.txt"
    assert {d.metadata["doc_id"] for d in routed.invoke(QUERY, k=6, mode="chunks")} == {"orion.txt"}

    # replaced: the new opening is what the router sees
    renamed = Document(
        page_content=docs[0].page_content.replace("ORION", "ATLAS").replace("Orion", "Atlas"),
        id="orion.txt",
    )
    routed.add_documents([renamed])
    assert "ATLAS" in router.get(["orion.txt"])[0].page_content
    # deleted, and emptied, documents leave the router too (also on the async path)
    routed.delete(["lyra.txt"])
    await routed.aadd_documents([Document(page_content="  ", id="vega.txt")])
    assert [d.id for d in router.get(["orion.txt", "lyra.txt", "vega.txt"])] == ["orion.txt"]


def test_sync_router_needs_a_document_index() -> None:
    with pytest.raises(ValueError, match="DocumentIndex"):
        DocumentRouter(retriever=RecordingRouter(results=[], calls=[]), sync=True)


def test_router_and_index_saved_and_loaded_side_by_side(tmp_path) -> None:
    # As the README says: the router is saved with its own save() and passed to load().
    router = RSERetriever(
        vectorstore=InMemoryVectorStore(HashingEmbeddings()), mode="chunks", enricher=NoEnricher()
    )
    routed, _ = build(router=DocumentRouter(retriever=router, sync=True), weights=(1.0, 0.0))
    routed.save(tmp_path / "idx")
    router.save(tmp_path / "router")
    loaded_router = RSERetriever.load(tmp_path / "router", embedding=HashingEmbeddings())
    loaded = RSERetriever.load(
        tmp_path / "idx",
        embedding=HashingEmbeddings(),
        router=loaded_router,  # wrapped with the saved settings (sync=True)
    )
    assert [d.page_content for d in loaded.invoke(QUERY)] == [
        d.page_content for d in routed.invoke(QUERY)
    ]
    loaded.delete(["vega.txt"])
    assert [d.id for d in loaded_router.get(["orion.txt", "vega.txt"])] == ["orion.txt"]


# ---------------------------------------------------------------- the default: built-in leads


def default_retriever(**kwargs: Any) -> RSERetriever:
    return RSERetriever(
        vectorstore=InMemoryVectorStore(HashingEmbeddings()),
        chunk_size=200,
        enricher=NoEnricher(),
        **kwargs,
    )


def test_the_default_routes_softly_with_the_built_in_lead_index() -> None:
    retriever = default_retriever()
    router = retriever.router
    assert router is not None and isinstance(router.retriever, LeadIndex)
    assert router.sync and router.boost == DEFAULT_BOOST and router.check_k == 50
    # each retriever gets its own lead index
    assert default_retriever().router.retriever is not router.retriever  # type: ignore[union-attr]
    retriever = default_retriever(router=DocumentRouter.leads(min_naming=ONE_WORD))
    router = retriever.router
    assert router is not None and isinstance(router.retriever, LeadIndex)
    docs = [contract(n) for n in NAMES]
    retriever.add_documents(docs)
    assert len(router.retriever) == 3  # type: ignore[arg-type]
    assert router.retriever.invoke(QUERY)[0].id == "orion.txt"
    plain, _ = build()
    unrouted = [d.metadata["doc_id"] for d in plain.invoke(QUERY, k=6, mode="chunks")]
    routed = [d.metadata["doc_id"] for d in retriever.invoke(QUERY, k=6, mode="chunks")]
    assert len(set(unrouted)) > 1  # without routing, the clauses of all three compete
    assert routed.count("orion.txt") > unrouted.count("orion.txt")
    assert routed[0] == "orion.txt"


def test_soft_boost_favours_without_filtering() -> None:
    retriever = default_retriever(router=DocumentRouter.leads(boost=0.5, min_naming=ONE_WORD))
    retriever.add_documents([contract(n) for n in NAMES])
    soft = [d.metadata["doc_id"] for d in retriever.invoke(QUERY, k=20, mode="chunks")]
    retriever.router = DocumentRouter.leads(boost=math.inf, min_naming=ONE_WORD)
    assert isinstance(retriever.router.retriever, LeadIndex)
    assert retriever.index.local.leads is retriever.router.retriever  # rebound on assignment
    assert len(retriever.router.retriever) == 3  # filled from the records
    hard = [d.metadata["doc_id"] for d in retriever.invoke(QUERY, k=20, mode="chunks")]
    assert set(hard) == {"orion.txt"}
    assert "orion.txt" in soft and len(set(soft)) > 1  # others still compete


def test_boosted_reorders_by_multiplied_scores_stably() -> None:
    from langchain_rse.fusion import fused
    from langchain_rse.indexing.records import chunk_key, in_docs

    keys = [chunk_key(d, "v", i) for d, i in (("a", 0), ("b", 0), ("a", 1), ("b", 1))]
    ranking = fused([[(k, None) for k in keys]], [1.0], rrf_k=0.0)  # 1, 1/2, 1/3, 1/4
    out = ranking.boosted(lambda ids: in_docs(ids, {"b"}), 2.0).top()
    assert [h.id for h in out] == [keys[0], keys[1], keys[3], keys[2]]
    assert [h.fused_score for h in out] == [1.0, 1.0, 0.5, 1 / 3]  # a tie keeps the fused order
    assert [h.ranks for h in out] == [(1,), (2,), (4,), (3,)]


def test_in_docs_parses_keys_whose_doc_id_holds_the_separator() -> None:
    from langchain_rse.indexing.records import _SEP, chunk_key, in_docs

    keys = [chunk_key("a", "v", 0), chunk_key(f"a{_SEP}b", "v", 1), chunk_key("b", "v", 0)]
    assert in_docs(keys, {"a"}).tolist() == [True, False, False]
    assert in_docs(keys, {f"a{_SEP}b", "b"}).tolist() == [False, True, True]
    assert in_docs([], {"a"}).tolist() == []


@pytest.mark.parametrize("seed", range(20))
def test_in_docs_agrees_with_parsing_every_key(seed: int) -> None:
    """Doc ids made of ``a``, ``b`` and separators: ``in_docs`` says what ``doc_of`` does."""
    from langchain_rse.indexing.records import _SEP, chunk_key, doc_of, in_docs

    rng = random.Random(seed)
    ids = list(
        {"".join(rng.choice(["a", "b", _SEP]) for _ in range(rng.randint(1, 4))) for _ in range(12)}
    )
    keys = [chunk_key(d, rng.choice(["v1", "v2.1"]), rng.randint(0, 30)) for d in ids * 3]
    for n in (1, 2, 3):
        docs = set(rng.sample(ids, min(n, len(ids))))
        assert in_docs(keys, docs).tolist() == [doc_of(k) in docs for k in keys]


def test_the_lead_index_returns_the_leads_it_was_given() -> None:
    """Leads are kept compressed, not as the given ``Document``s: ``get``, ``invoke`` and a
    re-analysis under another stemmer see the same text, id and metadata."""
    leads = LeadIndex(k=1)
    meta = {"doc_id": "d1", "source": "s/d1.txt"}
    lead = Document("Vertrag über — ORION SUPPLY AGREEMENT ✓ \ud800", id="d1", metadata=meta)
    leads.upsert([lead, Document("The Vega licence", id="d2", metadata={"doc_id": "d2"})])
    meta["source"] = "changed by the caller afterwards"
    assert leads.get(["d1", "unknown"]) == [
        Document(lead.page_content, id="d1", metadata={"doc_id": "d1", "source": "s/d1.txt"})
    ]
    leads.use_stemmer(None)
    (found,) = leads.invoke("orion supply")
    assert found.id == "d1" and found.page_content == lead.page_content
    assert found.metadata["source"] == "s/d1.txt" and found.metadata["bm25_score"] > 0


def test_built_in_leads_follow_replace_delete_and_load(tmp_path) -> None:
    retriever = default_retriever()
    retriever.add_documents([contract(n) for n in NAMES])
    leads = retriever.router.retriever  # type: ignore[union-attr]
    assert isinstance(leads, LeadIndex)
    renamed = Document(contract("Orion").page_content.replace("ORION", "ATLAS"), id="orion.txt")
    retriever.add_documents([renamed])
    assert "ATLAS" in leads.get(["orion.txt"])[0].page_content
    retriever.delete(["vega.txt"])
    assert len(leads) == 2 and not leads.get(["vega.txt"])
    retriever.save(tmp_path / "idx")
    loaded = RSERetriever.load(tmp_path / "idx", embedding=HashingEmbeddings(), strict=True)
    assert loaded.router is not None and isinstance(loaded.router.retriever, LeadIndex)
    assert loaded.router.retriever is not leads and len(loaded.router.retriever) == 2
    assert loaded.router.settings() == retriever.router.settings()  # type: ignore[union-attr]
    assert [(d.page_content, d.metadata) for d in loaded.invoke("ATLAS supply termination")] == [
        (d.page_content, d.metadata) for d in retriever.invoke("ATLAS supply termination")
    ]
    off = RSERetriever.load(tmp_path / "idx", embedding=HashingEmbeddings(), router=None)
    assert off.router is None


def test_built_in_leads_see_another_workers_writes(tmp_path) -> None:
    from langchain_classic.storage import LocalFileStore

    store = LocalFileStore(tmp_path / "records")  # a shared record store (a directory)
    vs = InMemoryVectorStore(HashingEmbeddings())
    a = RSERetriever(vectorstore=vs, record_store=store, chunk_size=200, enricher=NoEnricher())
    b = RSERetriever(vectorstore=vs, record_store=store, chunk_size=200, enricher=NoEnricher())
    a.add_documents([contract(n) for n in NAMES])
    leads_b = b.router.retriever  # type: ignore[union-attr]
    assert isinstance(leads_b, LeadIndex) and len(leads_b) == 0
    assert leads_b.invoke(QUERY)[0].id == "orion.txt"  # reloaded from the records
    assert len(leads_b) == 3
    a.delete(["orion.txt"])
    assert "orion.txt" not in {d.id for d in leads_b.invoke(QUERY)}


def test_documents_the_leads_cannot_tell_apart_are_not_routed() -> None:
    # Contracts from one template: every lead reads alike, the query names an order number
    # that no lead holds (the template's terms fill the opening the lead keeps). Routing
    # would pick a contract at random; the margin keeps it off.
    from langchain_rse.indexing.chunking import LEAD_CHARS

    terms = "\n\n".join(f"Term {t}. The supplier and the buyer agree." for t in range(60))
    assert len(terms) > LEAD_CHARS

    def templated(f: int) -> Document:
        clauses = "\n\n".join(
            f"{f}.{c} Clause {c} of contract {f}: the supplier ships order {f * 100 + c} "
            f"within {c + 2} days."
            for c in range(30)
        )
        return Document(f"CONTRACT {f}\n\n{terms}\n\n{clauses}\n", id=f"contract{f}.txt")

    retriever = RSERetriever(vectorstore=InMemoryVectorStore(HashingEmbeddings()), chunk_size=100)
    retriever.add_documents([templated(f) for f in range(4)])
    query = "when does the supplier ship order 317?"
    leads = retriever.router.retriever.invoke(query)  # type: ignore[union-attr]
    assert retriever.router.chosen(leads) is None  # type: ignore[union-attr]
    assert any("order 317" in d.page_content for d in retriever.invoke(query, mode="chunks"))
    # without the margin the route is taken (and misses: the lead search cannot tell)
    assert retriever.router.model_copy(update={"margin": 0.0}).chosen(leads)  # type: ignore[union-attr]


def test_off_route_segments_must_clear_the_boosted_bar() -> None:
    from langchain_rse.indexing.records import Pointer, chunk_key
    from langchain_rse.pipeline import QuerySettings
    from langchain_rse.query import Candidate, Route
    from langchain_rse.segments import choose_segments as select
    from langchain_rse.segments import get_preset

    params = get_preset("default")
    pointers = {
        d: Pointer(doc_id=d, version="v", metadata={}, spans=[(i, i + 1) for i in range(10)])
        for d in ("a", "b")
    }

    def cand(doc: str, idx: int, relevance: float) -> Candidate:
        key = chunk_key(doc, "v", idx)
        return Candidate(key, doc, "v", idx, relevance, [1, 0], relevance=relevance)

    # a0 is the routed document's hit; b8 is worth 0.75, b5 0.3 (above the floor 0.2, below
    # (1 + boost) x 0.2 = 0.6)
    cands = [cand("a", 0, 1.0), cand("b", 8, 0.95), cand("b", 5, 0.5)]
    s = QuerySettings(
        k=10,
        mode="segments",
        queries=["q"],
        weights=(4.0, 1.0),
        candidate_pool=50,
        params=params,
        rerank=False,
        strict_rerank=False,
    )
    picked = lambda route: [(d, start) for d, start, _, _ in select(s, cands, pointers, route)]  # noqa: E731
    assert picked(None) == [("a", 0), ("b", 8), ("b", 5)]
    assert picked(Route(frozenset({"a"}), 1.0 + DEFAULT_BOOST)) == [("a", 0), ("b", 8)]
    # the routed document's own segments need only the floor
    assert picked(Route(frozenset({"b"}), 1.0 + DEFAULT_BOOST)) == [("a", 0), ("b", 8), ("b", 5)]
    # a hard route already dropped the other documents' candidates: nothing more to do
    assert picked(Route(frozenset({"a"}), math.inf)) == [("a", 0), ("b", 8), ("b", 5)]
    # chunks mode has no floor: unchanged
    chunks = QuerySettings(**{**s.__dict__, "mode": "chunks"})
    assert len(select(chunks, cands, pointers, Route(frozenset({"a"}), 3.0))) == 3


def test_a_held_route_returns_only_strong_segments_of_other_documents() -> None:
    from langchain_rse.pipeline import QuerySettings, tracing
    from langchain_rse.query import Route
    from langchain_rse.segments import choose_segments as select

    retriever = default_retriever(router=DocumentRouter.leads(min_naming=ONE_WORD))
    retriever.add_documents(
        [contract(n) for n in [*NAMES, "Draco", "Cygnus", "Aquila", "Hydra", "Carina"]]
    )
    router = retriever.router
    assert router is not None
    assert router.chosen(router.retriever.invoke(QUERY)) == {"orion.txt"}
    bar = (1.0 + router.boost) * retriever.params.min_segment_value
    with tracing() as traces:
        segments = retriever.invoke(QUERY, k=50)
    assert segments[0].metadata["doc_id"] == "orion.txt"
    others = [d.metadata["score"] for d in segments if d.metadata["doc_id"] != "orion.txt"]
    assert others and all(score >= bar for score in others)
    # the same candidates without the bar: weaker segments of the other contracts too
    trace = traces[-1]
    s = QuerySettings.of(retriever, QUERY, 50, None, None, [], None)
    unbarred = select(s, trace.candidates, trace.pointers, None)
    route = Route(frozenset({"orion.txt"}), 1.0 + router.boost)
    barred = select(s, trace.candidates, trace.pointers, route)  # before fit_segments
    dropped = [g for g in unbarred if g not in barred]
    assert dropped and all(d != "orion.txt" and value < bar for d, _, _, value in dropped)
    assert [g for g in unbarred if g not in dropped] == barred
    assert {g.doc_id for g in trace.selection} == {d for d, *_ in barred}


def test_the_built_in_lead_index_stems_as_the_retriever_does() -> None:
    leads = LeadIndex()
    assert leads.stemmer == "english"
    leads.add_sources([contract("Orion")])
    assert [d for d, _ in leads.hits("Orion holding")] == ["orion.txt"]  # "Holdings" stemmed
    leads.use_stemmer(None)  # the leads held are indexed again, words as written
    assert leads.hits("Orion holding") and leads.hits("holding") == []
    for stemmer in (None, "german"):
        retriever, _ = build(router=DocumentRouter.leads(), lexical_stemmer=stemmer)
        built_in = retriever.router.retriever
        assert isinstance(built_in, LeadIndex) and built_in.stemmer == stemmer
        assert len(built_in) == len(NAMES)
        assert [d for d, _ in built_in.hits("Orion supply agreement")][0] == "orion.txt"


@pytest.mark.parametrize("seed", range(30))
def test_soft_route_candidates_are_those_of_boosting_every_id(seed: int) -> None:
    """The candidates of a soft route are those of boosting every id of the routed
    documents: the same candidates, scores and ranks, and the dense search's first hit
    after them when the boost pushed it out of the pool."""
    from langchain_rse.fusion import RRF_K, candidates, fused
    from langchain_rse.indexing.records import chunk_key, in_docs
    from langchain_rse.routing import apply_route

    rng = random.Random(seed)
    keys = [chunk_key(d, "v", i) for d in "abcdef" for i in range(rng.randint(1, 40))]
    dense = [(k, rng.random()) for k in rng.sample(keys, min(len(keys), rng.randint(1, 60)))]
    lexical = [(k, rng.random()) for k in rng.sample(keys, min(len(keys), rng.randint(0, 60)))]
    dense.sort(key=lambda h: -h[1])
    lexical.sort(key=lambda h: -h[1])
    pool, boost = rng.choice([1, 5, 20, 50]), rng.choice([0.5, 2.0, 9.0])
    routed = set(rng.sample("abcdef", rng.randint(1, 2)))
    router = DocumentRouter(retriever=LeadIndex(), check_k=None, boost=boost)
    route = router.policy("q", routed)
    ranking = fused([dense, lexical], [4.0, 1.0], RRF_K)
    applied, held = apply_route(route, ranking, [dense, lexical], [4.0, 1.0])
    got = candidates(applied, pool, {})
    boosted = ranking.boosted(lambda ids: in_docs(ids, routed), 1.0 + boost)
    want = boosted.top(pool)
    if dense[0][0] not in [h.id for h in want]:
        want.append(next(h for h in boosted.top() if h.id == dense[0][0]))
    assert [(c.key, c.fused_score, tuple(r or None for r in c.ranks)) for c in got] == want
    assert held == route and held is not None and held.docs == routed
