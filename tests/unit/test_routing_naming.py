"""Routing favours a document only when the query names it, not when it shares a word with
its title (issue [4/5]: "...infected from their mother?" routed to *Mother-to-Child
Transmission of HIV-1*)."""

from __future__ import annotations

import pytest
from langchain_core.documents import Document
from langchain_core.vectorstores import InMemoryVectorStore

from helpers import HashingEmbeddings
from langchain_rse import RSERetriever
from langchain_rse.routing import DocumentRouter

ARTICLES = {
    "hiv": (
        "Mother-to-Child Transmission of HIV-1",
        "Antiretroviral therapy during pregnancy reduces transmission of HIV-1 from mother to "
        "child. Breastfeeding remains a route of transmission in low-resource settings.",
    ),
    "neonates": (
        "Outcomes of Neonates Born to Women with Respiratory Disease",
        "Vertical transmission of the virus from an infected mother to her newborn was not "
        "observed; children were infected after birth by close contacts.",
    ),
    "masks": (
        "Face Masks in Community Settings",
        "Surgical masks reduce droplet spread. Children wore masks at school, and infected "
        "pupils were sent home.",
    ),
}


def article(key: str) -> Document:
    """Title, methods (past the 2,000 characters of a lead), then the findings."""
    title, findings = ARTICLES[key]
    methods = "\n\n".join(
        f"Paragraph {i}: cohorts, sampling and statistical methods were described in the protocol."
        for i in range(30)
    )
    return Document(f"{title}\n\n{methods}\n\n{findings}", id=key, metadata={"title": title})


@pytest.fixture
def retriever() -> RSERetriever:
    r = RSERetriever(vectorstore=InMemoryVectorStore(HashingEmbeddings()), chunk_size=200)
    r.add_documents([article(k) for k in ARTICLES])
    return r


def test_a_question_that_names_no_document_is_not_routed(retriever: RSERetriever) -> None:
    query = "How can children be infected from their mother?"
    assert retriever.router is not None
    # the lead index alone would pick the article whose title holds "mother" ...
    loose = RSERetriever(
        vectorstore=InMemoryVectorStore(HashingEmbeddings()),
        chunk_size=200,
        router=DocumentRouter.leads(min_naming=0.0),
    )
    loose.add_documents([article(k) for k in ARTICLES])
    assert loose.router is not None and loose.router.route(query) == {"hiv"}
    # ... but the question does not name it: no route, the results are the unrouted ones
    assert retriever.router.route(query) is None
    unrouted = RSERetriever(
        vectorstore=InMemoryVectorStore(HashingEmbeddings()), chunk_size=200, router=None
    )
    unrouted.add_documents([article(k) for k in ARTICLES])
    assert [d.page_content for d in retriever.invoke(query)] == [
        d.page_content for d in unrouted.invoke(query)
    ]


def test_a_question_that_names_its_document_is_routed(retriever: RSERetriever) -> None:
    assert retriever.router is not None
    query = "In Mother-to-Child Transmission of HIV-1, what reduces transmission?"
    assert retriever.router.route(query) == {"hiv"}
    assert retriever.invoke(query)[0].metadata["doc_id"] == "hiv"
