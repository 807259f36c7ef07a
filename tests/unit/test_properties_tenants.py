"""Property: no other tenant's id, title or text reaches a callback, an ``astream_events``
event or the agent tool's output (content and artifact), whether the stores filter
exactly as asked or less (a lossy or partial ``filter_translator``) (issue 54, item 6 and
the Guarantees row on tenants).

Three tenants' documents (gaps, repeated passages, whitespace runs, unicode) share one
index; a retriever bound to acme is queried with generated queries, ``k``, call filters and
translators. Every passage of a tenant's document carries that tenant's name (as a word),
and so do its id and title: the name of another tenant in anything the caller can see is
a leak.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from hypothesis import example, given, settings
from hypothesis import strategies as st
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.documents import Document
from langchain_core.messages import ToolMessage
from langchain_core.vectorstores import InMemoryVectorStore

from helpers import HashingEmbeddings
from langchain_rse import RSERetriever
from langchain_rse.filters import Bool, Cmp, Filter, matches

TENANTS = ("acme", "globex", "initech")
BOUND = {"tenant": "acme"}
OTHERS = TENANTS[1:]
WORDS = (
    "payment",
    "escrow",
    "notice",
    "termination",
    "royalty",
    "audit",
    "clause",
    "naïve",
    "déjà",
    "ünïcode",
    "日本語",
    "契約",
    "🙂",
    "Straße",
    "İstanbul",
)
GAPS = (" ", "\n", "\n\n", "   ", "\n\n\n\n", " \t ", "\u3000", "\n \n  \n")


# ---------------------------------------------------------------- what the stores are given


def _without_tenant(f: Filter) -> Filter | None:
    """``f`` less its conditions on ``tenant`` (None: nothing left)."""
    if isinstance(f, Cmp):
        return None if f.key == "tenant" else f
    if f.op == "$or":
        return f
    items = tuple(i for i in (_without_tenant(x) for x in f.items) if i is not None)
    if not items:
        return None
    return items[0] if len(items) == 1 else Bool("$and", items)


def lossy(f: Filter) -> dict[str, Any]:
    """A translator that translates nothing: the store filters nothing."""
    return {}


def partial(f: Filter) -> dict[str, Any]:
    """A translator that drops the tenant condition and keeps the others."""
    rest = _without_tenant(f)
    return {} if rest is None else {"filter": lambda doc: matches(rest, doc.metadata)}


TRANSLATORS: dict[str, Callable[[Filter], dict[str, Any]] | None] = {
    "exact": None,
    "lossy": lossy,
    "partial": partial,
}


class Recorder(BaseCallbackHandler):
    """Records every callback with all its arguments."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []

    def __getattribute__(self, name: str) -> Any:
        if name.startswith("on_") and name != "on_text":
            calls = object.__getattribute__(self, "calls")
            return lambda *args, **kwargs: calls.append((name, args, kwargs))
        return object.__getattribute__(self, name)


def leaks(payload: Any) -> list[str]:
    """The other tenants named in ``payload``'s text."""
    text = repr(payload)
    return [t for t in OTHERS if t in text]


# ---------------------------------------------------------------- generated tenants


@st.composite
def passages(draw: st.DrawFn, tenant: str) -> str:
    """Words of the shared vocabulary with the tenant's name every few words."""
    words = draw(st.lists(st.sampled_from(WORDS), min_size=2, max_size=14))
    every = draw(st.integers(2, 4))
    gap = draw(st.sampled_from(GAPS))
    return gap.join(tenant if i % every == 0 else w for i, w in enumerate(words))


@st.composite
def documents(draw: st.DrawFn, tenant: str, n: int) -> Document:
    """A document of repeated passages with whitespace runs between them."""
    pool = draw(st.lists(passages(tenant), min_size=1, max_size=3))
    order = draw(st.lists(st.integers(0, len(pool) - 1), min_size=1, max_size=10))
    parts = [pool[i] + draw(st.sampled_from(GAPS)) for i in order]
    return Document(
        "".join(parts),
        id=f"{tenant}-{n}.txt",
        metadata={"tenant": tenant, "title": f"{tenant} file {n}", "year": 2020 + n},
    )


@st.composite
def corpora(draw: st.DrawFn) -> list[Document]:
    return [
        draw(documents(tenant, n)) for tenant in TENANTS for n in range(draw(st.integers(1, 3)))
    ]


def build(docs: list[Document], translator: str, lexical_store: bool) -> RSERetriever:
    """One index of every tenant's documents, then bound to acme."""
    r = RSERetriever(
        vectorstore=InMemoryVectorStore(HashingEmbeddings()),
        lexical_store=InMemoryVectorStore(HashingEmbeddings()) if lexical_store else None,
        chunk_size=120,
        filter_translator=TRANSLATORS[translator],
        show_progress=False,
    )
    r.add_documents(docs)
    r.filter = BOUND
    return r


SIMPLE = [
    Document(
        "globex escrow payment " * 20, id="globex-0.txt", metadata={"tenant": "globex", "year": 1}
    ),
    Document("acme notice audit " * 20, id="acme-0.txt", metadata={"tenant": "acme", "year": 1}),
]


# ---------------------------------------------------------------- item 6, by hand


def test_a_store_that_filters_less_than_asked_shows_no_other_tenant_to_callbacks() -> None:
    for translator in ("lossy", "partial"):
        for lexical_store in (False, True):
            r = build(SIMPLE, translator, lexical_store)
            rec = Recorder()
            found = r.invoke("escrow payment", config={"callbacks": [rec]}, filter={"year": 1})
            assert {d.metadata["tenant"] for d in found} <= {"acme"}
            assert rec.calls and not leaks(rec.calls), (translator, lexical_store)


# ---------------------------------------------------------------- the property


@settings(max_examples=50)
@example(docs=SIMPLE, query="escrow payment", k=2, translator="lossy", lexical_store=True, year=0)
@given(
    docs=corpora(),
    query=st.lists(st.sampled_from(WORDS + ("acme",)), min_size=1, max_size=4).map(" ".join),
    k=st.integers(1, 5),
    translator=st.sampled_from(sorted(TRANSLATORS)),
    lexical_store=st.booleans(),
    year=st.sampled_from([0, 2020, 2021, 2022]),
)
def test_no_other_tenant_reaches_callbacks_events_or_the_tool(
    docs: list[Document], query: str, k: int, translator: str, lexical_store: bool, year: int
) -> None:
    r = build(docs, translator, lexical_store)
    call: dict[str, Any] = {"filter": {"year": {"$gte": year}}} if year else {}
    rec = Recorder()
    found = r.invoke(query, k=k, config={"callbacks": [rec]}, **call)
    assert {d.metadata["tenant"] for d in found} <= {"acme"}
    assert not leaks(found) and not leaks(rec.calls)

    async def events() -> list[Any]:
        return [e async for e in r.astream_events(query, version="v2", k=k, **call)]

    assert not leaks(asyncio.run(events()))
    tool = r.as_tool()
    message = tool.invoke(
        {"type": "tool_call", "id": "c", "name": "search", "args": {"query": query, "k": k}}
    )
    assert isinstance(message, ToolMessage)
    assert not leaks(message.content) and not leaks(message.artifact)
