"""The write protocol under shared use (issue 46): another worker's cleanup never deletes a
live version (1), a failed write can be retried and vacuumed (2), a query during a replace
sees the old or the new version (12), and add/delete cycles give their memory back (13).

Faults are injected by wrapping what a user passes in: a record store whose ``mget`` or
``mdelete`` pauses, embeddings or a vector store that fail on the n-th call.
"""

from __future__ import annotations

import gc
import threading
import tracemalloc
from collections.abc import Callable, Sequence
from typing import Any

import pytest
from langchain_core.documents import Document
from langchain_core.stores import InMemoryByteStore
from langchain_core.vectorstores import InMemoryVectorStore

from helpers import HashingEmbeddings, make_contract, stored_metadata
from langchain_rse import LeadIndex, RSERetriever
from langchain_rse.integrations.faiss import FaissStore
from langchain_rse.lexical import BM25Index
from langchain_rse.persistence import default_vectorstore

WAIT_S = 30.0
"""How long a paused call waits for the test to release it (only a hang takes this long)."""


class PausingStore(InMemoryByteStore):
    """An in-memory record store that pauses one thread's ``mget`` or ``mdelete`` once,
    when ``pause_on(method, thread, keys starting with prefix)`` was armed: it sets
    ``reached`` and waits for ``release``."""

    def __init__(self) -> None:
        super().__init__()
        self.armed: tuple[str, threading.Thread | None, str] | None = None
        self.reached = threading.Event()
        self.release = threading.Event()

    def pause_on(self, method: str, thread: threading.Thread | None, prefix: str) -> None:
        self.reached.clear()
        self.release.clear()
        self.armed = (method, thread, prefix)

    def _maybe_pause(self, method: str, keys: Sequence[str]) -> None:
        armed = self.armed
        if armed is None or armed[0] != method:
            return
        if armed[1] is not None and armed[1] is not threading.current_thread():
            return
        if not any(k.startswith(armed[2]) for k in keys):
            return
        self.armed = None
        self.reached.set()
        assert self.release.wait(WAIT_S), "the test never released the paused call"

    def mget(self, keys: Sequence[str]) -> list[bytes | None]:
        self._maybe_pause("mget", keys)
        return super().mget(keys)

    def mdelete(self, keys: Sequence[str]) -> None:
        self._maybe_pause("mdelete", keys)
        super().mdelete(keys)


def in_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    """Start ``fn`` in a thread; the list gets its result or its exception."""
    out: list[Any] = []

    def run() -> None:
        try:
            out.append(fn())
        except BaseException as exc:  # handed to the test
            out.append(exc)

    t = threading.Thread(target=run, daemon=True)
    return t, out


def whole_slices(found: list[Document], texts: dict[str, list[str]]) -> bool:
    """Every result is an exact slice of one of its document's versions."""
    return all(
        any(
            t[d.metadata["start_index"] : d.metadata["end_index"]] == d.page_content
            for t in texts[d.metadata["doc_id"]]
        )
        for d in found
    )


def exactly_current(r: RSERetriever, lexical: bool = True) -> None:
    """Every store of ``r`` holds exactly the documents' current versions (``lexical``:
    its in-process BM25 index too; another retriever's writes to an in-memory record store
    do not reach it)."""
    stored = sorted((m["doc_id"], m["doc_version"]) for m in stored_metadata(r.vectorstore))
    doc_ids = sorted({d for d, _ in stored} | {v.doc_id for v in r.index.records.versions()})
    current = [p for p in r.index.records.pointers(doc_ids) if p is not None]
    want = sorted((p.doc_id, p.version) for p in current for _ in p.spans)
    assert stored == want, "orphan or missing chunks in the vector store"
    if lexical:
        assert sorted(tuple(k.split("\x1f")[:2]) for k in list(r.index.lexical.keys())) == want
    assert sorted((v.doc_id, v.version) for v in r.index.records.versions()) == sorted(
        (p.doc_id, p.version) for p in current
    )
    keys = list(r.record_store.yield_keys())
    for prefix in ("doc/", "body/", "ver/"):
        assert len([k for k in keys if k.startswith(prefix)]) == len(current), prefix


X = make_contract("alpha", ["payment"], 3)
Y = make_contract("alpha", ["escrow"], 3)


# ------------------------------------------------------ 1: ABA, a live version deleted


def test_a_cleanup_never_deletes_the_version_another_worker_made_current_again() -> None:
    vs, store = InMemoryVectorStore(HashingEmbeddings()), PausingStore()
    a = RSERetriever(vectorstore=vs, record_store=store, k=3)
    b = RSERetriever(vectorstore=vs, record_store=store, k=3)
    a.add_documents([Document(X, id="alpha")])
    # Worker a replaces X by Y and swaps the pointer; its cleanup of X pauses in mdelete...
    t, out = in_thread(lambda: a.add_documents([Document(Y, id="alpha")]))
    store.pause_on("mdelete", t, "body/")
    t.start()
    assert store.reached.wait(WAIT_S)
    # ...while worker b adds X again: X is current once more.
    b.add_documents([Document(X, id="alpha")])
    store.release.set()
    t.join(WAIT_S)
    assert out == [["alpha"]]
    assert a.get(["alpha"])[0].page_content == X
    found = a.invoke("payment provisions")
    assert found and whole_slices(found, {"alpha": [X]})
    a.vacuum()
    exactly_current(a, lexical=False)
    assert whole_slices(b.invoke("payment provisions"), {"alpha": [X]})


def break_pointer(store: InMemoryByteStore) -> None:
    """What a lost cleanup race did: the current version's body and record gone."""
    store.mdelete([k for k in store.yield_keys() if k.startswith(("body/", "ver/"))])


def test_a_broken_pointer_is_written_again_by_re_adding_the_document() -> None:
    r = RSERetriever(vectorstore=InMemoryVectorStore(HashingEmbeddings()), k=3)
    r.add_documents([Document(X, id="alpha")])
    break_pointer(r.record_store)
    r.add_documents([Document(X, id="alpha")])  # not skipped as unchanged
    assert r.get(["alpha"])[0].page_content == X
    assert whole_slices(r.invoke("payment provisions"), {"alpha": [X]})
    r.vacuum()
    exactly_current(r)


def test_vacuum_repairs_a_broken_pointer() -> None:
    r = RSERetriever(vectorstore=InMemoryVectorStore(HashingEmbeddings()), k=3)
    r.add_documents([Document(X, id="alpha"), Document(Y, id="beta")])
    before = r.record_store.mget([k for k in r.record_store.yield_keys() if k.startswith("doc/")])
    # break alpha only
    alpha = r.index.records.pointers(["alpha"])[0]
    r.record_store.mdelete(
        [
            k
            for k in r.record_store.yield_keys()
            if k.startswith(("body/", "ver/")) and alpha.version in k
        ]
    )
    assert len(before) == 2
    assert r.vacuum() == 1  # alpha's broken version: its pointer and chunks removed
    assert r.get(["alpha"]) == []
    found = r.invoke("payment provisions escrow", k=5)
    assert found and {d.metadata["doc_id"] for d in found} == {"beta"}
    exactly_current(r)
    r.add_documents([Document(X, id="alpha")])
    assert r.get(["alpha"])[0].page_content == X
    exactly_current(r)


# ------------------------------------------- 2: a failed write can be retried on FAISS


class FlakyEmbeddings(HashingEmbeddings):
    """Fails the ``fail_at``-th ``embed_documents`` call (1-based; 0: none), once."""

    def __init__(self) -> None:
        super().__init__()
        self.fail_at = 0
        self.documents_calls = 0

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        self.documents_calls += 1
        if self.documents_calls == self.fail_at:
            raise ConnectionError("embedding service unavailable (injected)")
        return super().embed_documents(texts)


class FlakyFAISS(FaissStore):
    """The default FAISS store, whose ``fail_at``-th ``add_documents`` call fails once."""

    fail_at = 0
    adds = 0

    def add_documents(self, documents: list[Document], **kwargs: Any) -> list[str]:
        self.adds += 1
        if self.adds == self.fail_at:
            raise ConnectionError("vector store unavailable (injected)")
        return super().add_documents(documents, **kwargs)


def flaky_store(fault: str) -> tuple[Any, Callable[[int], None]]:
    """The default FAISS store, and a function that makes its n-th next batch fail (in
    the embeddings or in the store's ``add_documents``)."""
    if fault == "embeddings":
        emb = FlakyEmbeddings()
        vs = default_vectorstore(emb)

        def fail_batch(n: int) -> None:
            emb.fail_at = emb.documents_calls + n

        return vs, fail_batch
    vs = default_vectorstore(HashingEmbeddings())
    assert type(vs) is FaissStore
    vs.__class__ = FlakyFAISS

    def fail_add(n: int) -> None:
        vs.fail_at = vs.adds + n  # type: ignore[attr-defined]

    return vs, fail_add


@pytest.fixture(autouse=True)
def small_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    """Writes of 4 chunks per vector-store call, so a document takes several."""
    import langchain_rse.indexing.steps as indexing_module

    monkeypatch.setattr(indexing_module, "INDEX_BATCH_SIZE", 4)


def faiss_retriever(vs: Any) -> RSERetriever:
    return RSERetriever(vectorstore=vs, k=3, chunk_size=200)


@pytest.mark.parametrize("fault", ["embeddings", "vectorstore"])
def test_a_write_that_failed_in_its_second_batch_can_be_retried(fault: str) -> None:
    vs, fail_batch = flaky_store(fault)
    r = faiss_retriever(vs)
    r.add_documents([Document(Y, id="beta")])
    fail_batch(2)
    with pytest.raises(ConnectionError):
        r.add_documents([Document(X, id="alpha")])  # several batches; the 2nd one fails
    assert r.get(["alpha"]) == []
    assert r.add_documents([Document(X, id="alpha")]) == ["alpha"]  # the retry
    assert r.get(["alpha"])[0].page_content == X
    assert whole_slices(r.invoke("payment provisions"), {"alpha": [X], "beta": [Y]})
    r.vacuum()
    exactly_current(r)


@pytest.mark.parametrize("fault", ["embeddings", "vectorstore"])
def test_vacuum_removes_a_partly_written_version(fault: str) -> None:
    vs, fail_batch = flaky_store(fault)
    r = faiss_retriever(vs)
    r.add_documents([Document(Y, id="beta")])
    r.add_documents([Document(Y + "\nAmended.", id="beta")])  # replaced: one more batch
    fail_batch(2)
    with pytest.raises(ConnectionError):
        r.add_documents([Document(X, id="alpha")])  # the 2nd batch fails: a partial version
    r.vacuum()  # FAISS deletes the chunks that were written, and nothing more
    exactly_current(r)
    r.add_documents([Document(X, id="alpha")])
    exactly_current(r)


class FailingDeletes(InMemoryVectorStore):
    """Deletes of the chunks of one document fail."""

    refuse: set[str] = set()

    def delete(self, ids: Sequence[str] | None = None, **kwargs: Any) -> None:
        if any(i in self.refuse for i in ids or ()):
            raise ConnectionError("delete refused (injected)")
        super().delete(ids)


def test_vacuum_goes_on_past_a_version_it_cannot_remove(caplog) -> None:
    vs = FailingDeletes(HashingEmbeddings())
    r = RSERetriever(vectorstore=vs, k=3)
    r.add_documents([Document(X, id="alpha"), Document(X, id="beta")])
    old = {p.doc_id: p.version_record() for p in r.index.records.pointers(["alpha", "beta"])}
    vs.refuse = set(old["alpha"].chunk_ids())
    with pytest.raises(ConnectionError):  # the cleanup after the swap fails
        r.add_documents([Document(Y, id="alpha"), Document(Y, id="beta")])
    assert [d.page_content for d in r.get(["alpha", "beta"])] == [Y, Y]
    assert r.vacuum() == 1  # beta's old version; alpha's cannot be removed yet
    assert "alpha" in caplog.text
    vs.refuse = set()
    assert r.vacuum() == 1
    exactly_current(r)


# ---------------------------------------- 12: a query during a replace finds the new version


@pytest.mark.parametrize("vectorstore", ["faiss", "memory"])
def test_a_query_whose_candidates_were_replaced_meanwhile_retrieves_again(vectorstore) -> None:
    emb = HashingEmbeddings()
    vs = default_vectorstore(emb) if vectorstore == "faiss" else InMemoryVectorStore(emb)
    store = PausingStore()
    r = RSERetriever(vectorstore=vs, record_store=store, k=3, router=None)
    old = make_contract("alpha", ["payment"], 3)
    new = "PREAMBLE " * 9 + make_contract("alpha", ["payment", "escrow"], 3)
    r.add_documents([Document(old, id="alpha")])
    t, out = in_thread(lambda: r.invoke("payment provisions"))
    store.pause_on("mget", t, "doc/")  # the reader's pointer read, after its searches
    t.start()
    assert store.reached.wait(WAIT_S)
    r.add_documents([Document(new, id="alpha")])  # swapped; the old version removed
    store.release.set()
    t.join(WAIT_S)
    (found,) = out
    assert not isinstance(found, BaseException), found
    assert found, "the query returned nothing during a replace"
    assert whole_slices(found, {"alpha": [new]})


# --------------------------------------------------- 13: memory after add/delete cycles


def traced_growth(setup: Callable[[], Any], cycle: Callable[[Any, int], None], n: int) -> int:
    """Bytes still allocated after ``n`` more cycles than a warmed-up baseline."""
    tracemalloc.start()
    try:
        obj = setup()
        for c in range(5):
            cycle(obj, c)
        gc.collect()
        base = tracemalloc.get_traced_memory()[0]
        for c in range(5, 5 + n):
            cycle(obj, c)
        gc.collect()
        return tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()


def test_bm25_add_delete_cycles_give_their_group_entries_back() -> None:
    words = ["payment", "termination", "escrow", "audit", "royalties", "insurance"]

    def setup() -> BM25Index:
        index = BM25Index(compact_min=64, background_merges=False)
        index.add(["keep\x1fv\x1f0"], ["a permanent chunk"], {"keep\x1fv": {"a": 1}})
        return index

    def cycle(index: BM25Index, c: int) -> None:
        keys = [f"doc{i}\x1fversion{c:06d}\x1f{j}" for i in range(10) for j in range(2)]
        texts = [" ".join(words[(i + j) % 6 :]) for i in range(10) for j in range(2)]
        groups = {f"doc{i}\x1fversion{c:06d}": {"n": i} for i in range(10)}
        index.add(keys, texts, groups)
        index.delete(keys[:10])
        index.delete_groups([f"doc{i}\x1fversion{c:06d}" for i in range(5, 10)])

    # 400 cycles leave 4,000 deleted versions: about 700 kB when their entries stay
    assert traced_growth(setup, cycle, 400) < 150_000


def test_lead_index_add_delete_cycles_give_their_memory_back() -> None:
    def cycle(leads: LeadIndex, c: int) -> None:
        ids = [f"cycle{c:06d}-doc{i}" for i in range(10)]
        leads.add_sources(
            [Document(f"Agreement {i}: payment terms.", id=d) for i, d in enumerate(ids)]
        )
        leads.delete(ids)

    assert traced_growth(LeadIndex, cycle, 400) < 150_000
