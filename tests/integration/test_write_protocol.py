"""The write protocol across threads, processes and restarts (DESIGN.md, "Writes, versions
and many workers"): writers are not starved, concurrent writers do not collide, a writer
that loses a race or dies leaves nothing behind after ``vacuum()``, and versions are the
same in every process."""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from langchain_core.documents import Document
from langchain_core.stores import InMemoryByteStore
from langchain_core.vectorstores import InMemoryVectorStore

from conftest import corpus_documents
from helpers import HashingEmbeddings, make_contract, stored_metadata
from langchain_rse import RSERetriever
from langchain_rse.indexing.records import pointer_key
from langchain_rse.indexing.recordstore import ReadWriteLock
from langchain_rse.persistence import default_vectorstore

TESTS = Path(__file__).resolve().parents[1] / "support"


# ---------------------------------------------------------------- bug 1: writers starve


def test_waiting_writer_is_not_starved_by_readers_running_flat_out() -> None:
    lock = ReadWriteLock()
    stop = threading.Event()
    reads = [0]

    def reader() -> None:
        while not stop.is_set():  # no pause: always at least one reader holds the lock
            with lock.read():
                reads[0] += 1
                time.sleep(0.002)

    threads = [threading.Thread(target=reader, daemon=True) for _ in range(4)]
    for t in threads:
        t.start()
    try:
        while reads[0] < 20:
            time.sleep(0.001)
        wrote = threading.Event()

        def writer() -> None:
            for _ in range(5):
                with lock.write():
                    pass
            wrote.set()

        threading.Thread(target=writer, daemon=True).start()
        # A starved writer never gets in; a writer-preferring lock lets it in after the
        # readers holding the lock leave (milliseconds). 30 s only guards a busy machine.
        assert wrote.wait(30), "the writer was starved by readers"
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=10)


def test_the_lock_is_taken_for_in_process_stores_only() -> None:
    assert RSERetriever(
        vectorstore=InMemoryVectorStore(HashingEmbeddings())
    ).index.writer.vs_lock.enabled
    assert RSERetriever(
        vectorstore=default_vectorstore(HashingEmbeddings())
    ).index.writer.vs_lock.enabled


# ---------------------------------------------------------------- bug 2: concurrent aadd


async def test_concurrent_aadd_documents_of_the_same_documents_on_faiss() -> None:
    r = RSERetriever(vectorstore=default_vectorstore(HashingEmbeddings()))
    docs = corpus_documents()
    results = await asyncio.gather(*(r.aadd_documents(docs) for _ in range(3)))
    assert all(ids == results[0] for ids in results)
    # each chunk once, in every store
    keys = [(m["doc_id"], m["chunk_index"]) for m in stored_metadata(r.vectorstore)]
    assert len(keys) == len(set(keys)) == len(r.index.lexical)
    assert len(keys) == sum(len(p.spans) for p in r.index.records.pointers(results[0]) if p)
    assert await r.ainvoke("royalties audit rights")


# ------------------------------------------- bug 3: shared stores, lost races, killed writers


def shared_pair() -> tuple[RSERetriever, RSERetriever]:
    """Two retriever instances ("workers") over the same vector store and record store."""
    vs, store = InMemoryVectorStore(HashingEmbeddings()), InMemoryByteStore()
    return (
        RSERetriever(vectorstore=vs, record_store=store, k=3),
        RSERetriever(vectorstore=vs, record_store=store, k=3),
    )


def orphans(r: RSERetriever) -> list[tuple[str, str]]:
    """(doc_id, version) of chunks in the vector store that are not a current version."""
    found = {(m["doc_id"], m["doc_version"]) for m in stored_metadata(r.vectorstore)}
    current = {
        (p.doc_id, p.version)
        for p in r.index.records.pointers(sorted({d for d, _ in found}))
        if p is not None
    }
    return sorted(found - current)


def test_a_killed_writer_leaves_chunks_that_vacuum_removes(monkeypatch) -> None:
    r, _ = shared_pair()
    r.add_documents([Document(make_contract("alpha", ["payment"]), id="alpha")])
    before = [(d.page_content, d.metadata) for d in r.invoke("payment terms")]
    records = r.index.records
    real_put = records.put

    def crash_at_the_swap(pairs):
        if any(key == pointer_key("alpha") for key, _ in pairs):
            raise KeyboardInterrupt("killed before the pointer swap")
        real_put(pairs)

    monkeypatch.setattr(records, "put", crash_at_the_swap)
    with pytest.raises(KeyboardInterrupt):
        r.add_documents([Document(make_contract("alpha", ["escrow"]), id="alpha")])
    monkeypatch.setattr(records, "put", real_put)
    assert len(orphans(r)) == 1  # the new version's chunks, written before the crash
    assert [(d.page_content, d.metadata) for d in r.invoke("payment terms")] == before
    assert r.vacuum(min_age_s=3600) == 0  # too recent: could still be being written
    assert r.vacuum() == 1
    assert orphans(r) == []
    assert [(d.page_content, d.metadata) for d in r.invoke("payment terms")] == before
    assert {k.split("/")[0] for k in r.record_store.yield_keys()} == {"doc", "body", "ver"}
    assert len(list(r.record_store.yield_keys())) == 3


def test_a_writer_that_lost_the_pointer_race_deletes_its_own_chunks(monkeypatch) -> None:
    a, b = shared_pair()
    a.add_documents([Document(make_contract("alpha", ["payment"]), id="alpha")])
    v0 = a.index.records.pointers(["alpha"])[0].version
    # Worker b writes a new version up to its pointer swap, which is delayed...
    delayed: list = []
    real_put = b.index.records.put

    def delay_the_swap(pairs):
        if any(key == pointer_key("alpha") for key, _ in pairs):
            delayed.extend(pairs)
            raise InterruptedError("paused before the swap")
        real_put(pairs)

    monkeypatch.setattr(b.index.records, "put", delay_the_swap)
    with pytest.raises(InterruptedError):
        b.add_documents([Document(make_contract("alpha", ["escrow"]), id="alpha")])
    monkeypatch.undo()
    # ...until right after worker a swapped to its own version: b's swap lands last.
    a_put = a.index.records.put

    def b_swaps_right_after(pairs):
        a_put(pairs)
        if delayed and any(key == pointer_key("alpha") for key, _ in pairs):
            a_put([delayed.pop()])

    monkeypatch.setattr(a.index.records, "put", b_swaps_right_after)
    a.add_documents([Document(make_contract("alpha", ["royalties"]), id="alpha")])
    monkeypatch.undo()
    current = a.index.records.pointers(["alpha"])[0].version
    assert "Escrow" in a.get(["alpha"])[0].page_content  # the last swap won
    # a saw that it lost and deleted its own version; b's old one (v0) awaits vacuum
    assert orphans(a) == [("alpha", v0)]
    assert a.vacuum() == 1 and orphans(a) == []
    assert [v.version for v in a.index.records.versions("alpha")] == [current]


WORKER = """
import sys, json
sys.path[:0] = [f"{sys.argv[1]}/../{d}" for d in ("support", "unit", "integration", ".")]
import chromadb
from langchain_chroma import Chroma
from langchain_community.storage import RedisStore
from langchain_core.documents import Document
from helpers import HashingEmbeddings, make_contract
from langchain_rse import RSERetriever
chroma, redis, name, worker, rounds = sys.argv[2:7]
client = chromadb.HttpClient(host="127.0.0.1", port=int(chroma),
                             settings=chromadb.config.Settings(anonymized_telemetry=False))
r = RSERetriever(
    vectorstore=Chroma(collection_name=name, embedding_function=HashingEmbeddings(),
                       client=client),
    record_store=RedisStore(redis_url=f"redis://127.0.0.1:{redis}", namespace=name),
)
if worker == "add":  # one document with a rare word, from "another worker"
    r.add_documents([Document(make_contract("other", ["payment"], 2) + " The zyxwvut clause.",
                              id="from-the-other-worker")])
elif worker == "delete":
    r.delete(["from-the-other-worker"])
else:  # a writer in the race: replace the same documents, `rounds` times
    print("ready", flush=True)
    sys.stdin.readline()  # start together
    for n in range(int(rounds)):
        r.add_documents([Document(make_contract(d, [f"w{worker} r{n}", "payment"], 2), id=d)
                         for d in ("alpha", "beta")])
    print(json.dumps({"done": int(rounds)}), flush=True)
"""


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    from servers import chroma_server, redis_server

    tmp = tmp_path_factory.mktemp("servers")
    with redis_server(tmp) as redis_port, chroma_server(tmp) as chroma_port:
        yield {"redis": redis_port, "chroma": chroma_port}


def test_two_processes_replacing_the_same_documents_leave_no_orphans(servers) -> None:
    import chromadb
    from langchain_chroma import Chroma
    from langchain_community.storage import RedisStore

    name = f"race{time.monotonic_ns() % 10**9}"
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                WORKER,
                str(TESTS),
                str(servers["chroma"]),
                str(servers["redis"]),
                name,
                str(w),
                "12",
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for w in range(2)
    ]
    for p in procs:
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    for p in procs:
        assert p.stdin is not None
        p.stdin.write("go\n")
        p.stdin.flush()
    for p in procs:
        out, _ = p.communicate(timeout=300)
        assert p.returncode == 0 and json.loads(out.splitlines()[-1]) == {"done": 12}

    settings = chromadb.config.Settings(anonymized_telemetry=False)
    client = chromadb.HttpClient(host="127.0.0.1", port=servers["chroma"], settings=settings)
    vs = Chroma(collection_name=name, embedding_function=HashingEmbeddings(), client=client)
    store = RedisStore(redis_url=f"redis://127.0.0.1:{servers['redis']}", namespace=name)
    r = RSERetriever(vectorstore=vs, record_store=store)
    r.vacuum()

    current = {p.doc_id: p for p in r.index.records.pointers(["alpha", "beta"]) if p is not None}
    assert set(current) == {"alpha", "beta"}
    chunks = vs.get(include=["metadatas"])["metadatas"]
    by_version = {(m["doc_id"], m["doc_version"]) for m in chunks}
    assert by_version == {(d, p.version) for d, p in current.items()}, "orphan chunks remain"
    assert len(chunks) == sum(len(p.spans) for p in current.values())
    assert sorted(v.version for v in r.index.records.versions()) == sorted(
        p.version for p in current.values()
    )
    keys = list(store.yield_keys())
    assert len(keys) == 3 * len(current) + 1  # pointer, body, version record; the generation
    texts = {d.id: d.page_content for d in r.get(["alpha", "beta"])}
    for seg in r.invoke("payment provisions", k=4):  # whole versions only
        m = seg.metadata
        assert texts[m["doc_id"]][m["start_index"] : m["end_index"]] == seg.page_content
    client.delete_collection(name)


# ------------------------------------------------------ bug 4: versions in every process

INDEXER = """
import sys, json
sys.path[:0] = [f"{sys.argv[1]}/../{d}" for d in ("support", "unit", "integration", ".")]
from langchain_core.documents import Document
from langchain_core.language_models.fake_chat_models import FakeListChatModel
from langchain_text_splitters import RecursiveCharacterTextSplitter
from helpers import HashingEmbeddings, count_words, make_contract
from langchain_rse import ContextualEnricher, RSERetriever
from langchain_rse.persistence import default_vectorstore

CALLS = [0]
class CountingChat(FakeListChatModel):
    def _call(self, *args, **kwargs):
        CALLS[0] += 1
        return super()._call(*args, **kwargs)

mode, path, concurrency, retries = sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
emb, llm = HashingEmbeddings(), CountingChat(responses=["A note situating the chunk."])
settings = dict(
    splitter=RecursiveCharacterTextSplitter(chunk_size=60, chunk_overlap=10,
                                            length_function=count_words),
    enricher=ContextualEnricher(llm, max_concurrency=concurrency, max_retries=retries),
)
docs = [Document(make_contract(n, ["payment", "termination"], 3), id=n) for n in ("a", "b")]
if mode == "build":
    r = RSERetriever(vectorstore=default_vectorstore(emb), **settings)
    r.add_documents(docs)
    r.save(path)
else:
    r = RSERetriever.load(path, embedding=emb, **settings)
    emb.calls = 0
    r.add_documents(docs)
print(json.dumps({"embedding_calls": emb.calls, "llm_calls": CALLS[0]}))
"""


def test_re_adding_unchanged_documents_in_a_new_process_makes_no_model_calls(tmp_path) -> None:
    def run(*args: str) -> dict[str, int]:
        out = subprocess.run(
            [sys.executable, "-c", INDEXER, str(TESTS), *args],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert out.returncode == 0, out.stderr[-3000:]
        return json.loads(out.stdout.splitlines()[-1])  # type: ignore[no-any-return]

    built = run("build", str(tmp_path / "idx"), "2", "1")
    assert built["embedding_calls"] > 0 and built["llm_calls"] > 0
    # another process, other concurrency and retry settings: nothing is re-indexed
    again = run("readd", str(tmp_path / "idx"), "8", "5")
    assert again == {"embedding_calls": 0, "llm_calls": 0}


# ------------------- in-process BM25 over shared stores: it notices other workers' writes


def test_in_process_bm25_sees_another_workers_writes_over_shared_stores(servers, caplog) -> None:
    import chromadb
    from langchain_chroma import Chroma
    from langchain_community.storage import RedisStore

    name = f"gen{time.monotonic_ns() % 10**9}"
    settings = chromadb.config.Settings(anonymized_telemetry=False)
    client = chromadb.HttpClient(host="127.0.0.1", port=servers["chroma"], settings=settings)
    r = RSERetriever(
        vectorstore=Chroma(
            collection_name=name, embedding_function=HashingEmbeddings(), client=client
        ),
        record_store=RedisStore(redis_url=f"redis://127.0.0.1:{servers['redis']}", namespace=name),
        weights=(0.0, 1.0),  # lexical ranking only
        mode="chunks",
    )
    r.add_documents(corpus_documents())

    def other_worker(action: str) -> None:
        out = subprocess.run(
            [
                sys.executable,
                "-c",
                WORKER,
                str(TESTS),
                str(servers["chroma"]),
                str(servers["redis"]),
                name,
                action,
                "0",
            ],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert out.returncode == 0, out.stderr[-2000:]

    assert all(d.metadata["doc_id"] != "from-the-other-worker" for d in r.invoke("zyxwvut"))
    before = len(r.index.lexical)
    other_worker("add")
    with caplog.at_level(logging.INFO, logger="langchain_rse.indexing.writer"):
        found = r.invoke("zyxwvut")  # the generation changed: the BM25 index catches up
    assert found[0].metadata["doc_id"] == "from-the-other-worker"
    assert found[0].metadata["lexical_rank"] == 1  # 1-based: the best BM25 hit
    added = len(r.index.lexical) - before
    # only the other worker's document was read and indexed, not the whole corpus again
    assert f"0 chunks removed, {added} added (1 documents)" in caplog.text and added > 0
    other_worker("delete")
    assert all(d.metadata["doc_id"] != "from-the-other-worker" for d in r.invoke("zyxwvut"))
    assert len(r.index.lexical) == before
    # our own writes stay visible without a reload, and the other worker's survive them
    other_worker("add")
    r.add_documents([Document("An escrow agreement with a qwertzuiop clause.", id="ours")])
    assert r.invoke("qwertzuiop")[0].metadata["doc_id"] == "ours"
    assert r.invoke("zyxwvut")[0].metadata["doc_id"] == "from-the-other-worker"
    client.delete_collection(name)
