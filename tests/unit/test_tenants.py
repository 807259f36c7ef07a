"""Tenants behind one index: a retriever bound to a filter (or a call's ``filter=``) sees,
traces and changes only what the filter allows (issue 46, items 4-6; issue 50, internal
runs are not retriever runs)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from langchain_core.callbacks import BaseCallbackHandler, CallbackManagerForRetrieverRun
from langchain_core.documents import Document
from langchain_core.retrievers import BaseRetriever
from langchain_core.vectorstores import InMemoryVectorStore

from helpers import HashingEmbeddings
from langchain_rse import DocumentRouter, NoEnricher, RSERetriever
from langchain_rse.filters import parse
from langchain_rse.indexing.chunking import document_leads
from langchain_rse.routing import LeadIndex

ACME = {"tenant": "acme"}
QUERY = "termination notice period of the Orion supply agreement"
SECRET = "Zebulon"  # only in the globex document's title and opening
GLOBEX_ID = "gx-7781.txt"


def contract(name: str, tenant: str, clauses: int = 6) -> Document:
    """A contract named only in its opening; the clauses could belong to any contract."""
    body = "\n\n".join(
        f"{n}. Clause {n}\n\nEither party may end this contract by termination with a notice "
        f"period of {n * 10} days, and the supplier shall deliver goods within {n} weeks."
        for n in range(1, clauses + 1)
    )
    opening = f"{name.upper()} SUPPLY AGREEMENT\n\nbetween {name} Holdings and the Buyer.\n\n"
    return Document(opening + body, id=f"{name.lower()}.txt", metadata={"tenant": tenant})


def globex() -> Document:
    """Another tenant's document whose lead matches the query better than acme's own."""
    opening = (
        f"ORION SUPPLY AGREEMENT {SECRET} termination notice period Orion supply "
        f"agreement Orion supply agreement. {SECRET} Orion termination notice.\n\n"
    )
    return Document(
        opening + "Unrelated text about deliveries. " * 40,
        id=GLOBEX_ID,
        metadata={"tenant": "globex", "title": f"Orion supply agreement {SECRET}"},
    )


ACME_DOCS = [contract("Orion", "acme"), contract("Lyra", "acme"), contract("Vega", "acme")]


def build(with_globex: bool = True, **kwargs: Any) -> RSERetriever:
    r = RSERetriever(
        vectorstore=InMemoryVectorStore(HashingEmbeddings()),
        chunk_size=200,
        enricher=NoEnricher(),
        **kwargs,
    )
    r.add_documents(ACME_DOCS + ([globex()] if with_globex else []))
    return r


def bound(with_globex: bool = True, **kwargs: Any) -> RSERetriever:
    """The index of both tenants, then bound to acme (as a tenant's request handler gets it)."""
    r = build(with_globex, **kwargs)
    r.filter = ACME
    return r


def foreign(payload: Any) -> list[str]:
    """What of the globex document shows in ``payload``'s text."""
    text = repr(payload)
    return [s for s in (SECRET, GLOBEX_ID, "globex", "Unrelated text") if s in text]


class Recorder(BaseCallbackHandler):
    """Records every callback with all its arguments."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []

    def __getattribute__(self, name: str) -> Any:
        if name.startswith("on_") and name not in ("on_text",):
            calls = object.__getattribute__(self, "calls")
            return lambda *args, **kwargs: calls.append((name, args, kwargs))
        return object.__getattribute__(self, name)

    def named(self, prefix: str) -> list[tuple[str, tuple[Any, ...], dict[str, Any]]]:
        return [c for c in self.calls if c[0].startswith(prefix)]


# ---------------------------------------------------------------- 4: callbacks and events


@pytest.mark.parametrize("how", ["bound", "per call"])
def test_no_other_tenant_reaches_a_callback(how: str) -> None:
    r = bound() if how == "bound" else build()
    call = {} if how == "bound" else {"filter": ACME}
    rec = Recorder()
    results = r.invoke(QUERY, config={"callbacks": [rec]}, **call)
    assert results and {d.metadata["tenant"] for d in results} == {"acme"}
    assert rec.calls and not foreign(rec.calls)
    # one retriever run: ours; the searches (and the route) are internal chain runs
    assert [c[0] for c in rec.named("on_retriever")] == ["on_retriever_start", "on_retriever_end"]
    names = {c[2].get("name") for c in rec.named("on_chain_start")}
    assert {"dense_search", "lexical_search", "rse.route"} <= names
    for _, args, _ in rec.named("on_chain_end"):
        assert "Either party may end" not in repr(args)  # no document text in their outputs


async def test_no_other_tenant_in_astream_events() -> None:
    r = bound()
    events = [e async for e in r.astream_events(QUERY, version="v2")]
    assert not foreign(events)
    retriever_events = [e for e in events if e["event"].startswith("on_retriever")]
    assert [e["event"] for e in retriever_events] == ["on_retriever_start", "on_retriever_end"]
    assert retriever_events[0]["name"] == "RSERetriever"
    for e in events:
        if e["event"] == "on_chain_end":
            assert "Either party may end" not in repr(e["data"])
    rec = Recorder()
    await r.ainvoke(QUERY, config={"callbacks": [rec]})
    assert rec.calls and not foreign(rec.calls)
    assert len(rec.named("on_retriever")) == 2


def test_explain_shows_no_other_tenant() -> None:
    r = bound()
    explanation = r.explain(QUERY)
    assert not foreign(explanation.to_text()) and not foreign(explanation.to_html())


# ---------------------------------------------------------------- 5: results


def _results(r: RSERetriever, **kwargs: Any) -> list[tuple[str, dict[str, Any]]]:
    return [(d.page_content, d.metadata) for d in r.invoke(QUERY, **kwargs)]


@pytest.mark.parametrize("mode", ["segments", "chunks"])
def test_another_tenants_document_does_not_change_the_results(mode: str) -> None:
    alone = _results(bound(with_globex=False), mode=mode, k=3)
    assert alone and alone[0][1]["doc_id"] == "orion.txt"  # the route holds for acme
    assert _results(bound(), mode=mode, k=3) == alone
    assert _results(build(), mode=mode, k=3, filter=ACME) == alone


async def test_another_tenants_document_does_not_change_async_results() -> None:
    alone = [(d.page_content, d.metadata) for d in await bound(False).ainvoke(QUERY, k=3)]
    got = [(d.page_content, d.metadata) for d in await bound().ainvoke(QUERY, k=3)]
    assert got == alone


def test_a_filtered_router_retriever_sees_only_the_filter() -> None:
    """A router over an ``RSERetriever`` of :func:`document_leads` (which carry the
    documents' metadata) gets the filter too."""
    docs = [*ACME_DOCS, globex()]
    leads = RSERetriever.from_documents(
        document_leads(docs),
        embedding=HashingEmbeddings(),
        mode="chunks",
        enricher=NoEnricher(),
        k=3,
    )
    assert leads.invoke(QUERY)[0].id != "orion.txt"  # unfiltered, globex's lead wins
    alone = RSERetriever.from_documents(
        document_leads(ACME_DOCS),
        embedding=HashingEmbeddings(),
        mode="chunks",
        enricher=NoEnricher(),
        k=3,
    )
    want = _results(bound(False, router=DocumentRouter(retriever=alone)), k=3)
    rec = Recorder()
    r = bound(router=DocumentRouter(retriever=leads))
    assert _results(r, k=3, config={"callbacks": [rec]}) == want
    assert not foreign(rec.calls)


def test_the_focus_search_sees_only_the_filter() -> None:
    """The clause that names the routed document is found among the leads the filter
    allows: other tenants' leads that match it better do not push the document's out."""
    query = "Consider the Orion Supply Agreement between Orion Holdings and the Buyer; which law"
    alone = bound(False)
    want = [(d.page_content, d.metadata) for d in alone.invoke(query, k=3)]
    for n in range(3):  # more than the lead index's k, each naming Orion better than Orion's
        opening = "Orion Supply Agreement between Orion Holdings and the Buyer. " * 3
        alone.filter = None
        alone.add_documents(
            [Document(opening + f"Globex file {n}.", id=f"gx-{n}", metadata={"tenant": "globex"})]
        )
    alone.filter = ACME
    assert [(d.page_content, d.metadata) for d in alone.invoke(query, k=3)] == want


# ---------------------------------------------------------------- 6: the other methods


def test_get_returns_only_the_bound_tenants_documents() -> None:
    r = bound()
    assert [d.id for d in r.get(["orion.txt", GLOBEX_ID, "missing"])] == ["orion.txt"]
    r.filter = None
    assert [d.id for d in r.get(["orion.txt", GLOBEX_ID])] == ["orion.txt", GLOBEX_ID]


async def test_delete_removes_only_the_bound_tenants_documents() -> None:
    r = bound()
    assert r.delete([GLOBEX_ID])["num_deleted"] == 0
    assert (await r.adelete([GLOBEX_ID, "lyra.txt"]))["succeeded"] == ["lyra.txt"]
    r.filter = None
    assert [d.id for d in r.get([GLOBEX_ID, "lyra.txt"])] == [GLOBEX_ID]
    found = r.invoke(SECRET, filter={"tenant": "globex"})
    assert any(d.metadata["doc_id"] == GLOBEX_ID for d in found)


async def test_add_documents_refuses_what_the_filter_does_not_allow() -> None:
    r = build()
    before = r.get([GLOBEX_ID])
    assert before
    r.filter = ACME
    with pytest.raises(ValueError, match="filter"):
        r.add_documents([contract("Sirius", "globex")])
    with pytest.raises(ValueError, match="filter"):
        await r.aadd_documents([Document("untagged text", id="x.txt")])
    with pytest.raises(ValueError, match="filter"):  # with an allowed one: nothing written
        r.upsert([contract("Deneb", "acme"), contract("Sirius", "globex")])
    # another tenant's id cannot be taken over by writing an allowed document under it
    takeover = Document("acme now owns this", id=GLOBEX_ID, metadata=ACME)
    with pytest.raises(ValueError, match="outside this retriever's filter"):
        r.add_documents([takeover])
    with pytest.raises(ValueError, match="outside this retriever's filter"):
        r.add_documents([Document("acme text", metadata=ACME)], ids=[GLOBEX_ID])
    r.filter = None
    assert r.get([GLOBEX_ID]) == before
    assert r.get(["sirius.txt", "deneb.txt", "x.txt"]) == []
    # what the filter allows is written as before
    r.filter = ACME
    assert r.add_documents([contract("Deneb", "acme")]) == ["deneb.txt"]
    assert [d.id for d in r.get(["deneb.txt"])] == ["deneb.txt"]


class FixedRouter(BaseRetriever):
    """A router retriever that cannot be given a filter: it returns the globex lead."""

    calls: list[str] = []

    def _get_relevant_documents(
        self, query: str, *, run_manager: CallbackManagerForRetrieverRun
    ) -> list[Document]:
        self.calls.append(query)
        return document_leads([globex()])


def test_a_router_that_cannot_take_the_filter_is_not_asked() -> None:
    router = FixedRouter(calls=[])
    want = _results(bound(router=None), k=3)
    rec = Recorder()
    assert (
        _results(bound(router=DocumentRouter(retriever=router)), k=3, config={"callbacks": [rec]})
        == want
    )
    assert router.calls == [] and not foreign(rec.calls)
    assert build(router=DocumentRouter(retriever=router)).invoke(QUERY) and router.calls == [QUERY]


def test_the_lead_index_takes_a_filter() -> None:
    leads = LeadIndex()
    leads.add_sources([*ACME_DOCS, globex()])
    assert leads.invoke(QUERY)[0].id == GLOBEX_ID
    found = leads.invoke(QUERY, filter=ACME)
    assert [d.id for d in found][0] == "orion.txt" and not foreign(found)
    assert found[0].metadata["tenant"] == "acme"  # leads carry the documents' metadata


_NAMES = ("Orion", "ORION", "Supply", "SUPPLY", "Agreement", "Holdings", "Buyer", "Lyra", "Vega")
_WORDS = ("termination", "notice", "period", "supply", "agreement", "orion", "deliveries", "goods")
OTHER_WORDS = (*_NAMES, *_WORDS, "Clause", "days", "weeks", "party")
"""What another tenant's documents are made of: the words that name acme's contracts."""
PHRASINGS = (
    QUERY,
    "Consider the Orion Supply Agreement between Orion Holdings and the Buyer; which law",
    "Orion Holdings's supply agreement: what notice period ends it?",
    "notice period in the orion supply agreement",
)
_other_text = st.lists(st.sampled_from(OTHER_WORDS), min_size=3, max_size=60).map(" ".join)


@settings(max_examples=25, deadline=None)
@given(
    texts=st.lists(st.tuples(_other_text, _other_text), min_size=1, max_size=5),
    query=st.sampled_from(PHRASINGS),
)
def test_no_other_tenants_documents_change_a_tenants_route_focus_or_results(
    texts: list[tuple[str, str]], query: str
) -> None:
    """Whatever another tenant holds (random documents of the words that name acme's
    contracts, capitalised or not), acme's route, focus text and results are those of an
    index without them: every count the router weighs a name by is over acme's documents."""
    acme = parse(ACME)
    alone = bound(False)
    r = bound()
    r.filter = None
    other = [
        Document(f"{a}.\n\n{b}.", id=f"gx-{i}", metadata={"tenant": "globex"})
        for i, (a, b) in enumerate(texts)
    ]
    r.add_documents(other)
    r.filter = ACME
    assert alone.router is not None and r.router is not None
    route = r.router.route(query, filter=acme)
    assert route == alone.router.route(query, filter=acme)
    if route is not None:
        focus = r.router.focus_query(query, set(route.docs), acme)
        assert focus == alone.router.focus_query(query, set(route.docs), acme)
    got = [(d.page_content, d.metadata) for d in r.invoke(query, k=3)]
    assert got == [(d.page_content, d.metadata) for d in alone.invoke(query, k=3)]
