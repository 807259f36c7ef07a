"""The sync query path runs the lexical search and the route beside the dense search
(``langchain_rse.threads.Beside``): they overlap, a busy pool or a failure loses nothing,
and a forked child gets working threads of its own."""

from __future__ import annotations

import multiprocessing
import threading
import time
from typing import Any

import pytest
from langchain_core.documents import Document

from helpers import HashingEmbeddings
from langchain_rse import RSERetriever, threads
from langchain_rse.search import SearchBranches

QUERY = "termination provisions of the agreement"
WAIT = 30.0  # seconds: far beyond what any step takes, even on a slow, busy machine


@pytest.fixture
def retriever(docs: list[Document], embeddings: HashingEmbeddings) -> RSERetriever:
    return RSERetriever.from_documents(docs, embedding=embeddings, k=3)


class Spy:
    """Wraps the branches' searches: which thread ran each, and hooks to run inside."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.threads: dict[str, int] = {}
        self.in_dense: Any = None  # called inside the dense search, before it searches
        self.in_lexical: Any = None
        dense, lexical = SearchBranches.dense, SearchBranches.lexical_search

        def spy_dense(branches: SearchBranches, request: Any) -> Any:
            self.threads["dense"] = threading.get_ident()
            if self.in_dense:
                self.in_dense()
            return dense(branches, request)

        def spy_lexical(branches: SearchBranches, request: Any) -> Any:
            self.threads["lexical"] = threading.get_ident()
            if self.in_lexical:
                self.in_lexical()
            return lexical(branches, request)

        monkeypatch.setattr(SearchBranches, "dense", spy_dense)
        monkeypatch.setattr(SearchBranches, "lexical_search", spy_lexical)


def test_the_lexical_search_runs_while_the_dense_one_does(retriever, monkeypatch) -> None:
    expected = retriever.invoke(QUERY)
    spy = Spy(monkeypatch)
    lexical_started = threading.Event()
    seen_during_dense: list[bool] = []
    spy.in_lexical = lexical_started.set
    # In turn, the dense search would wait here for a lexical search that comes after it.
    spy.in_dense = lambda: seen_during_dense.append(lexical_started.wait(WAIT))
    assert retriever.invoke(QUERY) == expected
    assert seen_during_dense == [True]
    assert spy.threads["dense"] == threading.get_ident()  # the caller's thread
    assert spy.threads["lexical"] != threading.get_ident()


def test_parallel_branches_off_runs_them_in_turn_on_the_calling_thread(retriever, monkeypatch
                                                                        ) -> None:  # fmt: skip
    expected = retriever.invoke(QUERY)
    spy, order = Spy(monkeypatch), []
    spy.in_dense, spy.in_lexical = (lambda: order.append("dense")), (lambda: order.append("lex"))
    retriever.parallel_branches = False
    assert retriever.invoke(QUERY) == expected
    assert order == ["dense", "lex"]  # the lexical search after the dense one
    assert spy.threads == {"dense": threading.get_ident(), "lexical": threading.get_ident()}
    retriever.parallel_branches = True  # and back: the setting is read on every call
    lexical_started = threading.Event()
    spy.in_dense, spy.in_lexical = (lambda: lexical_started.wait(WAIT)), lexical_started.set
    assert retriever.invoke(QUERY) == expected
    assert spy.threads["lexical"] != threading.get_ident()


def test_traced_calls_overlap_too(retriever, monkeypatch) -> None:
    from langchain_core.callbacks import BaseCallbackHandler

    class Names(BaseCallbackHandler):
        def __init__(self) -> None:
            self.names: list[str] = []

        def on_chain_start(self, serialized: Any, inputs: Any, **kwargs: Any) -> None:
            self.names.append(kwargs.get("name", ""))

    spy, handler = Spy(monkeypatch), Names()  # before the branches' runnables are made
    expected = retriever.invoke(QUERY)
    lexical_started = threading.Event()
    spy.in_lexical = lexical_started.set
    spy.in_dense = lambda: lexical_started.wait(WAIT)  # else it may finish before a worker starts
    assert retriever.invoke(QUERY, config={"callbacks": [handler]}) == expected
    assert {"dense_search", "lexical_search"} <= set(handler.names)  # child runs of ours
    assert spy.threads["lexical"] != spy.threads["dense"]


def test_a_busy_pool_runs_the_lexical_search_on_the_calling_thread(retriever, monkeypatch) -> None:
    expected = retriever.invoke(QUERY)
    spy = Spy(monkeypatch)
    release, started = threading.Event(), threading.Semaphore(0)

    def occupy() -> None:
        started.release()
        release.wait(WAIT)

    pool = threads._executor()
    blockers = [pool.submit(occupy) for _ in range(threads.WORKERS)]
    try:
        for _ in range(threads.WORKERS):  # every worker is busy
            assert started.acquire(timeout=WAIT)
        assert retriever.invoke(QUERY) == expected
        assert spy.threads["lexical"] == threading.get_ident()
    finally:
        release.set()
        for b in blockers:
            b.result(timeout=WAIT)


def test_a_failing_dense_search_waits_for_the_lexical_one(retriever, monkeypatch) -> None:
    """Nothing of a failed query goes on after ``invoke`` has raised."""
    spy = Spy(monkeypatch)
    lexical_started, lexical_done = threading.Event(), threading.Event()

    def slow_lexical() -> None:
        lexical_started.set()
        time.sleep(0.2)
        lexical_done.set()

    def failing_dense() -> None:
        assert lexical_started.wait(WAIT)
        raise ConnectionError("the vector store is down")

    spy.in_lexical, spy.in_dense = slow_lexical, failing_dense
    with pytest.raises(ConnectionError, match="vector store is down"):
        retriever.invoke(QUERY)
    assert lexical_done.is_set()


def test_a_failing_lexical_search_fails_the_query(retriever, monkeypatch) -> None:
    spy = Spy(monkeypatch)

    def failing() -> None:
        raise MemoryError("no room for the scores")

    spy.in_lexical = failing
    with pytest.raises(MemoryError, match="no room"):
        retriever.invoke(QUERY)
    spy.in_lexical = None
    assert retriever.invoke(QUERY)  # the pool still works


def _invoke_in_child(retriever: RSERetriever, out: Any) -> None:
    ran: dict[str, int] = {}
    started = threading.Event()
    dense, lexical = SearchBranches.dense, SearchBranches.lexical_search

    def spy_dense(branches: SearchBranches, request: Any) -> Any:
        started.wait(WAIT)  # a worker that exists starts the lexical search meanwhile
        return dense(branches, request)

    def spy_lexical(branches: SearchBranches, request: Any) -> Any:
        ran["lexical"] = threading.get_ident()
        started.set()
        return lexical(branches, request)

    SearchBranches.dense = spy_dense  # type: ignore[method-assign]
    SearchBranches.lexical_search = spy_lexical  # type: ignore[method-assign]
    docs = retriever.invoke(QUERY)
    out.put((len(docs), ran["lexical"] != threading.get_ident()))


def test_a_forked_child_gets_a_pool_of_its_own(retriever) -> None:
    """A forked child inherits the parent's pool object without its threads: it makes a new
    one, so its queries still overlap (they would not otherwise, nor hang)."""
    assert retriever.invoke(QUERY)  # the parent's pool exists and has threads
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    child = ctx.Process(target=_invoke_in_child, args=(retriever, out))
    child.start()
    try:
        found, beside = out.get(timeout=120)
    finally:
        child.join(timeout=WAIT)
    assert child.exitcode == 0
    assert found > 0 and beside


def _spy_index(retriever: RSERetriever) -> list[int]:
    """Replace the retriever's FAISS index by a copy that records, per search, the OpenMP
    thread count in force on the searching thread."""
    import faiss

    seen: list[int] = []

    class Recording(faiss.IndexFlatIP):  # type: ignore[misc, name-defined]
        def search(self, *args: Any, **kwargs: Any) -> Any:
            seen.append(faiss.omp_get_max_threads())
            return super().search(*args, **kwargs)

    store = retriever.vectorstore
    copy = Recording(store.index.d)
    copy.add(store.index.reconstruct_n(0, store.index.ntotal))
    store.index = copy
    return seen


async def test_faiss_searches_one_query_on_one_thread(
    docs: list[Document], embeddings: HashingEmbeddings
) -> None:
    """Each dense search of the default store runs on one OpenMP thread, on whichever
    thread runs it (sync: the caller's; async: a worker's), and the caller's own setting is
    back afterwards."""
    import faiss

    r = RSERetriever.from_documents(docs, embedding=embeddings, k=3)
    seen = _spy_index(r)
    before = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(3)
    try:
        assert r.invoke(QUERY)
        assert faiss.omp_get_max_threads() == 3
        assert seen == [1]
        assert await r.ainvoke(QUERY)  # the dense search runs in a worker thread
        assert seen == [1, 1]
    finally:
        faiss.omp_set_num_threads(before)
