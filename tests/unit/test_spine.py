"""One path per query (issue 48): few of the package's own frames between ``invoke`` and
the vector store's search, and few of its modules touched by one query, measured through
the public API."""

from __future__ import annotations

import inspect
import sys
from types import FrameType
from typing import Any

from langchain_core.documents import Document
from langchain_core.vectorstores import InMemoryVectorStore

from helpers import HashingEmbeddings, make_contract
from langchain_rse import RSERetriever

MAX_OWN_FRAMES = 8
"""The package's own frames from ``invoke`` to the vector store's search, at most (a
tripwire with slack, issue 56: not a limit to shape the code to)."""
MAX_MODULES = 15
"""The package's modules one default query touches, at most (with slack: the driver, the
query's types and the engine under the retriever are modules of their own; a default query
touches 15 since the engine, ``engine.py``, moved out of the retriever)."""


def documents() -> list[Document]:
    topics = [["termination", "payment"], ["warranty", "confidentiality"], ["audit", "fees"]]
    return [Document(make_contract(f"c{i}", t, 4), id=f"c{i}") for i, t in enumerate(topics)]


def own(module: str) -> bool:
    return module == "langchain_rse" or module.startswith("langchain_rse.")


class RecordingStore(InMemoryVectorStore):
    """A user's vector store that records the stack each similarity search is called on."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.stacks: list[list[str]] = []

    def similarity_search_with_score(self, *args: Any, **kwargs: Any) -> Any:
        self.stacks.append([f.frame.f_globals.get("__name__", "") for f in inspect.stack(0)])
        return super().similarity_search_with_score(*args, **kwargs)


def test_a_query_reaches_the_vector_store_through_at_most_eight_own_frames() -> None:
    vs = RecordingStore(HashingEmbeddings())
    r = RSERetriever(vectorstore=vs)
    r.add_documents(documents())
    vs.stacks.clear()
    assert r.invoke("termination for convenience")
    assert vs.stacks, "the dense search was not called"
    for stack in vs.stacks:
        frames = [m for m in stack if own(m)]
        assert 0 < len(frames) <= MAX_OWN_FRAMES, frames


def test_a_default_query_touches_at_most_fifteen_package_modules() -> None:
    r = RSERetriever.from_documents(documents(), embedding=HashingEmbeddings())
    r.invoke("payment terms")  # warm: first-use imports and caches are not the query's
    touched: set[str] = set()

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if event == "call":
            module = frame.f_globals.get("__name__", "")
            if own(module):
                touched.add(module)

    sys.setprofile(profile)
    try:
        found = r.invoke("when is payment due")
    finally:
        sys.setprofile(None)
    assert found
    assert 0 < len(touched) <= MAX_MODULES, sorted(touched)


async def test_sync_and_async_queries_share_one_path() -> None:
    r = RSERetriever.from_documents(documents(), embedding=HashingEmbeddings())
    for query in ("termination notice", "audit fees and warranty"):
        sync = [(d.page_content, d.metadata) for d in r.invoke(query)]
        assert sync == [(d.page_content, d.metadata) for d in await r.ainvoke(query)]
