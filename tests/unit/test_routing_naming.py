"""Routing favours a document only when the query names it, not when it shares a word with
its title (issue [4/5]: "...infected from their mother?" routed to *Mother-to-Child
Transmission of HIV-1*)."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
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
    assert loose.router is not None and getattr(loose.router.route(query), "docs", None) == {"hiv"}
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
    assert getattr(retriever.router.route(query), "docs", None) == {"hiv"}
    assert retriever.invoke(query)[0].metadata["doc_id"] == "hiv"


WORDS = [
    "kestrel",
    "marten",
    "osprey",
    "pike",
    "quokka",
    "raven",
    "sable",
    "tern",
    "umber",
    "vireo",
    "wren",
    "yarrow",
    "zephyr",
    "alder",
    "birch",
    "cedar",
]
KINDS = ["Supply", "Licence", "Distribution", "Services"]
ASKS = [
    "The date of the contract",
    "Which state's law governs the interpretation of the contract?",
    "On what date will the contract's initial term expire?",
    "Is there a cap on liability?",
]


def phrasings(kind: str, first: str, second: str, ask: str) -> dict[str, str]:
    """One question in the families of ``benchmarks/cuad_data.py`` (``noname`` last)."""
    name = f"{kind} Agreement between {first} and {second}"
    body = ask.rstrip("?.")
    lower = body[0].lower() + body[1:]
    return {
        "consider": f"Consider the {name}; {ask}",
        "question": f"In the {name}, {lower}?",
        "inside": f"What does the {name} say about {lower}?",
        "end": f"{body}, according to the {name}?",
        "possessive": f"{first}'s {kind} Agreement: {ask}",
        "partial": f"in the {kind.lower()} agreement with {first.lower().removesuffix(' inc.')}, "
        f"{lower}?",
        "noname": ask,
    }


FILLER = "\n\n".join(  # a contract's opening: past the 2,000 characters of a lead
    f"Recital {c}. The parties wish to cooperate on the terms set out below, in good faith "
    "and for their mutual benefit, as recorded in the schedules."
    for c in range(1, 16)
)


def routes_of(docs: list[Document], questions: dict[str, str]) -> dict[str, object]:
    """The documents each question is routed to (None: not routed) by a retriever over
    ``docs`` with the default router."""
    retriever = RSERetriever(
        vectorstore=InMemoryVectorStore(HashingEmbeddings()), chunk_size=300, show_progress=False
    )
    retriever.add_documents(docs)
    router = retriever.router
    assert router is not None
    return {family: getattr(router.route(q), "docs", None) for family, q in questions.items()}


def contracts(
    kinds: list[str], parties: list[tuple[str, str]], body: Callable[[int], str]
) -> list[Document]:
    """Contract ``c<d>``: its kind and parties in its opening, then ``body(d)``."""
    return [
        Document(f"{kind.upper()} AGREEMENT\n\nbetween {a} and {b}.\n\n{body(d)}", id=f"c{d}")
        for d, (kind, (a, b)) in enumerate(zip(kinds, parties))
    ]


def assert_named_however_phrased(
    docs: list[Document], kinds: list[str], parties: list[tuple[str, str]], i: int, ask: str
) -> None:
    """Every phrasing that names contract ``c<i>`` routes to it; the ask alone nowhere."""
    routes = routes_of(docs, phrasings(kinds[i], *parties[i], ask))
    assert routes.pop("noname") is None
    assert routes == dict.fromkeys(routes, {f"c{i}"})


@settings(max_examples=30)
@given(
    n=st.integers(3, 8),
    seed=st.integers(0, 10_000),
    ask=st.sampled_from(ASKS),
    asked=st.integers(0, 7),
)
def test_a_question_is_routed_alike_however_it_names_its_contract(
    n: int, seed: int, ask: str, asked: int
) -> None:
    """Every naming phrasing routes to the contract it names; the question alone nowhere."""
    rng = random.Random(seed)
    words = [w.title() for w in rng.sample(WORDS, 2 * n)]
    parties = [
        (f"{words[2 * i]} {words[2 * i + 1]} Inc.", "Northwind Trading LLC") for i in range(n)
    ]
    kinds = [rng.choice(KINDS) for _ in range(n)]
    clauses = (
        "Liability. Each party's liability is capped at the fees paid. Governing law. The "
        "interpretation of this contract is governed by the laws of the State of New York. "
        "Term. The initial term expires on 1 May 2030 unless renewed."
    )
    docs = contracts(kinds, parties, lambda _: f"{FILLER}\n\n{clauses}")
    assert_named_however_phrased(docs, kinds, parties, asked % n, ask)


@settings(max_examples=30)
@given(
    n=st.integers(3, 8),
    seed=st.integers(0, 10_000),
    which=st.integers(0, 7),
    gap=st.sampled_from(["could a reseller keep", "does any sublicensee owe", "must buyers pay"]),
)
def test_rare_words_scattered_over_a_question_name_nothing(
    n: int, seed: int, which: int, gap: str
) -> None:
    """Two words one lead alone holds, far apart in a question that names no document
    (CUAD: "...obligations after the termination or *expiration* ... the *last*..."), do not
    route; the same words side by side, as a name, do."""
    rng = random.Random(seed)
    words = [w.title() for w in rng.sample(WORDS, 2 * n)]
    docs = [
        Document(
            f"SUPPLY AGREEMENT\n\nbetween Northwind Trading LLC and the Buyer. The licence is "
            f"{words[2 * i].lower()} and {words[2 * i + 1].lower()} for every site.\n\n"
            "Liability. Each party's liability is capped at the fees paid.",
            id=f"c{i}",
        )
        for i in range(n)
    ]
    retriever = RSERetriever(
        vectorstore=InMemoryVectorStore(HashingEmbeddings()), chunk_size=300, show_progress=False
    )
    retriever.add_documents(docs)
    router = retriever.router
    assert router is not None
    i = which % n
    first, second = words[2 * i].lower(), words[2 * i + 1].lower()
    scattered = f"Is a {first} licence granted, and {gap} {second} rights after termination?"
    assert router.route(scattered) is None
    named = f"In the {first} {second} licence, is liability capped?"
    assert getattr(router.route(named), "docs", None) == {f"c{i}"}


COMMON_CLAUSE = (
    "Exclusivity. The reseller keeps an exclusive territory while its minimum purchase "
    "commitments are met, and audits of books and records are allowed once a year."
)
COMMON_ASKS = [
    "Is there an exclusive territory for the reseller, with minimum purchase commitments?",
    "May a party audit the books and records once a year?",
]


@settings(max_examples=30)
@given(
    n=st.integers(4, 8),
    seed=st.integers(0, 10_000),
    ask=st.sampled_from(COMMON_ASKS),
    asked=st.integers(0, 7),
    opener=st.integers(1, 7),
)
def test_the_name_decides_the_route_not_what_the_ask_shares_with_another_lead(
    n: int, seed: int, ask: str, asked: int, opener: int
) -> None:
    """Every contract holds the clause the question asks about; one of them (not the one
    named) states it in its opening, so the lead search over the whole question ranks that
    one first (CUAD: a long ask, a partial name). Every phrasing that names the contract
    routes to it; the ask alone, whose words most contracts hold, names none."""
    rng = random.Random(seed)
    words = [w.title() for w in rng.sample(WORDS, 2 * n)]
    parties = [
        (f"{words[2 * i]} {words[2 * i + 1]} Inc.", "Northwind Trading LLC") for i in range(n)
    ]
    kinds = [rng.choice(KINDS) for _ in range(n)]
    i = asked % n
    j = (i + opener) % n  # the contract whose opening states the common clause
    if j == i:
        j = (i + 1) % n
    opening = f"{COMMON_CLAUSE} {COMMON_CLAUSE}\n\n"
    docs = contracts(
        kinds, parties, lambda d: (opening if d == j else "") + f"{FILLER}\n\n{COMMON_CLAUSE}"
    )
    assert_named_however_phrased(docs, kinds, parties, i, ask)


COMMON_WORDS = [
    "national",
    "processing",
    "system",
    "associates",
    "american",
    "international",
    "capital",
    "general",
    "federated",
    "investment",
    "global",
    "services",
    "united",
    "western",
    "digital",
    "media",
    "pacific",
    "resources",
]
APART = "\n\n".join(  # longer than a chunk: the words around it share no chunk
    f"Schedule {c}. The parties keep the records of their dealings for seven years, in good "
    "faith, and deliver copies on request."
    for c in range(3)
)


@settings(max_examples=30)
@given(
    n=st.integers(4, 8),
    seed=st.integers(0, 10_000),
    ask=st.sampled_from(ASKS),
    asked=st.integers(0, 7),
)
def test_a_name_of_common_words_routes_however_it_is_phrased(
    n: int, seed: int, ask: str, asked: int
) -> None:
    """Each contract's party is two common words (CUAD: *National Processing*, *System
    Associates*) that every contract's text holds, in chunks of their own: no word names a
    contract, the two side by side do. Every phrasing routes to the contract named, the
    lower-case partial name too; the ask alone nowhere. The party words are not kind words:
    a word of another contract's title (*Services*) is in every chunk of it (the header), so
    that contract holds the pair in one chunk as soon as its text holds the other word, and
    the pair is no longer rare (a known limit, ``docs/routing.md``)."""
    rng = random.Random(seed)
    words = rng.sample([w for w in COMMON_WORDS if w.title() not in KINDS], 2 * n)
    parties = [
        (f"{words[2 * d].title()} {words[2 * d + 1].title()} Inc.", "the Buyer") for d in range(n)
    ]
    usage = f"\n\n{APART}\n\n".join(f"The {w} terms of the schedules apply." for w in words)
    kinds = [rng.choice(KINDS) for _ in range(n)]
    liability = "Liability. Each party's liability is capped at the fees paid."
    docs = contracts(kinds, parties, lambda _: f"{FILLER}\n\n{usage}\n\n{liability}")
    assert_named_however_phrased(docs, kinds, parties, asked % n, ask)


@settings(max_examples=20)
@given(n=st.integers(4, 8), seed=st.integers(0, 10_000), asked=st.integers(0, 7))
def test_common_words_side_by_side_in_lower_case_name_nothing(
    n: int, seed: int, asked: int
) -> None:
    """The same pair of common words in a lead's running text, not capitalised (COVID-QA:
    *fecal samples*, *greater risk*), is not a name: a question holding it is not routed."""
    rng = random.Random(seed)
    words = rng.sample(COMMON_WORDS, 2 * n)
    usage = f"\n\n{APART}\n\n".join(f"The {w} terms of the schedules apply." for w in words)
    docs = [
        Document(
            f"SUPPLY AGREEMENT\n\nbetween Northwind Trading LLC and the Buyer, for the "
            f"{words[2 * d]} {words[2 * d + 1]} of goods.\n\n{FILLER}\n\n{usage}\n\n"
            "Liability. Each party's liability is capped at the fees paid.",
            id=f"c{d}",
        )
        for d in range(n)
    ]
    i = asked % n
    question = f"Is liability capped for the {words[2 * i]} {words[2 * i + 1]} of goods?"
    assert routes_of(docs, {"q": question}) == {"q": None}
