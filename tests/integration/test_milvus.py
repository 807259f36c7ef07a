"""Milvus as both the vector store and the lexical store, against a real Milvus server.

The server is Milvus Lite's gRPC server (``milvus-lite server``, from the ``milvus-lite``
wheel) on 127.0.0.1, started here (``tests/milvus_server.py``). Each retriever gets two
collections on it:

* dense: stock ``langchain_milvus.Milvus`` with ``HashingEmbeddings`` (COSINE, FLAT);
* lexical: :class:`langchain_rse.integrations.milvus.MilvusLexicalStore`, a collection with
  only Milvus's built-in BM25 function, so the lexical branch is searched by the server
  and the retriever keeps no in-process BM25 index.

Chunk metadata (``doc_id``, ``doc_version``, offsets, the source's scalar metadata) is
kept as dynamic fields in both collections.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from langchain_core.documents import Document
from langchain_core.stores import InMemoryByteStore
from milvus_server import milvus_server, milvus_stores

from conftest import corpus_documents
from helpers import make_contract
from langchain_rse import RSERetriever
from langchain_rse.indexing.records import chunk_key, chunk_uuid, pointer_key

pytestmark = pytest.mark.integration

TESTS = Path(__file__).resolve().parents[1] / "support"


@pytest.fixture(scope="module")
def uri(tmp_path_factory) -> Iterator[str]:
    with milvus_server(tmp_path_factory.mktemp("milvus")) as u:
        yield u


@pytest.fixture
def make(uri) -> Iterator:
    """A factory of fresh retrievers, each over two new Milvus collections."""
    made = []

    def factory(**kw):
        dense, lexical = milvus_stores(uri, uuid.uuid4().hex[:12])
        made.append((dense, lexical))
        kw.setdefault("record_store", InMemoryByteStore())
        return RSERetriever(vectorstore=dense, lexical_store=lexical, **kw)

    yield factory
    for dense, lexical in made:
        dense.drop()
        lexical.drop()


def rows(store, expr: str = "") -> list[dict]:
    """Every row of a collection matching ``expr``: its id and chunk metadata."""
    fields = ["pk", "doc_id", "doc_version"]
    out = store.client.query(store.collection_name, filter=expr, output_fields=fields, limit=10_000)
    return [{"pk": r["pk"], "doc_id": r["doc_id"], "doc_version": r["doc_version"]} for r in out]


def chunk_ids_of(r: RSERetriever, doc_id: str) -> list[str]:
    meta = r.index.records.pointers([doc_id])[0]
    assert meta is not None
    return [chunk_uuid(chunk_key(doc_id, meta.version, i)) for i in range(len(meta.spans))]


def assert_no_orphans(r: RSERetriever, doc_ids: list[str]) -> None:
    """Both collections hold exactly the chunks of the current versions."""
    expected = sorted(
        i for d in doc_ids if r.index.records.pointers([d])[0] for i in chunk_ids_of(r, d)
    )
    for store in (r.vectorstore, r.lexical_store):
        assert sorted(row["pk"] for row in rows(store)) == expected


def test_exact_segments_from_milvus_branches(make) -> None:
    r = make(k=3)
    docs = corpus_documents()
    r.add_documents(docs)
    assert len(r.index.lexical) == 0  # the lexical branch lives in Milvus
    n = sum(len(p.spans) for p in r.index.records.pointers([d.metadata["source"] for d in docs]))
    assert len(rows(r.vectorstore)) == len(rows(r.lexical_store)) == n
    sources = {d.id: d.page_content for d in r.get([d.metadata["source"] for d in docs])}
    out = r.invoke("termination provisions of the agreement")
    assert out
    for seg in out:
        m = seg.metadata
        assert seg.page_content == sources[m["doc_id"]][m["start_index"] : m["end_index"]]
    chunks = r.invoke("royalties audit rights", mode="chunks")
    assert chunks[0].metadata["doc_id"] == "gamma.txt"
    assert all(c.metadata["lexical_rank"] is not None for c in chunks)


def test_bm25_scores_rank_best_first_and_dense_relevance_is_ordered(make) -> None:
    r = make()
    r.add_documents(corpus_documents())
    hits = r.lexical_store.similarity_search_with_score("royalties audit rights", k=8)
    scores = [s for _, s in hits]
    assert hits and all(s > 0 for s in scores)  # higher is better, on any Milvus
    assert scores == sorted(scores, reverse=True)
    assert "royalties" in hits[0][0].page_content.lower()
    dense = r.vectorstore._similarity_search_with_relevance_scores("royalties audit", k=8)
    rel = [s for _, s in dense]
    assert rel == sorted(rel, reverse=True) and all(0 <= s <= 1 for s in rel)
    for doc, _ in hits[:1] + dense[:1]:  # the metadata the retriever reads back
        assert {
            "doc_id",
            "doc_version",
            "chunk_index",
            "start_index",
            "end_index",
            "enrichment",
            "source",
            "title",
        } <= set(doc.metadata)


def test_a_rare_identifier_is_found_by_milvus_bm25(make) -> None:
    # the lexical branch alone decides the order, so what comes back is Milvus's BM25
    r = make(k=3, weights=(0.0, 1.0))
    rare = "QX7K9Z"
    zeta = make_contract("zeta", ["payment terms"], 4) + f"\nSchedule reference {rare}.\n"
    r.add_documents([*corpus_documents(), Document(zeta, metadata={"source": "zeta.txt"})])
    q = f"termination provisions {rare.lower()}"
    # the hashing embeddings rank termination chunks first, not the identifier's chunk
    assert all(rare not in d.page_content for d in r.vectorstore.similarity_search(q, k=5))
    top_lexical = r.lexical_store.similarity_search(q, k=1)[0]
    assert rare in top_lexical.page_content and top_lexical.metadata["doc_id"] == "zeta.txt"
    chunks = r.invoke(q, mode="chunks")
    assert chunks[0].metadata["lexical_rank"] == 1 and chunks[0].metadata["doc_id"] == "zeta.txt"
    assert rare in chunks[0].page_content
    segments = r.invoke(q)  # RSE may put longer segments first; the identifier's is there
    hit = [s for s in segments if rare in s.page_content]
    assert len(hit) == 1 and hit[0].metadata["doc_id"] == "zeta.txt"
    m = hit[0].metadata
    assert hit[0].page_content == zeta[m["start_index"] : m["end_index"]]


def test_replace_and_delete_leave_no_orphans_in_either_collection(make) -> None:
    r = make(k=3)
    r.add_documents(corpus_documents())
    names = ["alpha.txt", "beta.txt", "gamma.txt", "delta.txt"]
    old_ids = chunk_ids_of(r, "gamma.txt")
    r.add_documents(
        [Document(make_contract("gamma", ["escrow"]), metadata={"source": "gamma.txt"})]
    )
    new_ids = chunk_ids_of(r, "gamma.txt")
    assert not set(old_ids) & set(new_ids)
    version = r.index.records.pointers(["gamma.txt"])[0].version
    for store in (r.vectorstore, r.lexical_store):
        gamma = rows(store, 'doc_id == "gamma.txt"')
        assert {row["doc_version"] for row in gamma} == {version}
        assert sorted(row["pk"] for row in gamma) == sorted(new_ids)
    assert_no_orphans(r, names)
    assert "escrow" in r.invoke("escrow", k=1)[0].page_content.lower()

    r.delete(["gamma.txt"])
    for store in (r.vectorstore, r.lexical_store):
        assert rows(store, 'doc_id == "gamma.txt"') == []
    assert r.lexical_store.similarity_search("escrow", k=5) == []
    assert r.get(["gamma.txt"]) == []
    assert all(d.metadata["doc_id"] != "gamma.txt" for d in r.invoke("escrow", k=5))
    assert_no_orphans(r, names)


def test_vacuum_removes_a_killed_writers_chunks_from_both_collections(make, monkeypatch) -> None:
    r = make(k=3)
    r.add_documents([Document(make_contract("alpha", ["payment"]), id="alpha")])
    assert r.vacuum() == 0
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
    current = r.index.records.pointers(["alpha"])[0].version
    for store in (r.vectorstore, r.lexical_store):  # the dead writer's chunks are there
        assert len({row["doc_version"] for row in rows(store)}) == 2
    assert "escrow" not in r.invoke("escrow provisions", k=1)[0].page_content.lower()
    assert r.vacuum() == 1
    for store in (r.vectorstore, r.lexical_store):
        assert {row["doc_version"] for row in rows(store)} == {current}
    assert_no_orphans(r, ["alpha"])


def test_metadata_filters_are_pushed_down_into_both_collections(make) -> None:
    r = make(k=3)
    r.add_documents(corpus_documents())
    out = r.invoke("insurance obligations", filter={"title": {"$in": ["beta", "gamma"]}})
    assert out and {d.metadata["doc_id"] for d in out} == {"beta.txt"}
    out = r.invoke("termination", mode="chunks", filter={"title": "gamma"})
    assert out and {d.metadata["doc_id"] for d in out} == {"gamma.txt"}
    expr = 'title == "delta" and chunk_index >= 1'
    for store in (r.vectorstore, r.lexical_store):
        hits = store.similarity_search("insurance", k=5, expr=expr)
        assert hits and all(h.metadata["title"] == "delta" for h in hits)
        assert all(h.metadata["chunk_index"] >= 1 for h in hits)


async def test_async_equals_sync(make) -> None:
    r = make(k=3)
    await r.aadd_documents(corpus_documents())
    q = "insurance obligations"
    assert [d.metadata for d in r.invoke(q)] == [d.metadata for d in await r.ainvoke(q)]


# ------------------------------------------------- two processes over the same collections

WRITER = """
import json, sys, time
sys.path[:0] = [f"{sys.argv[1]}/../{d}" for d in ("support", "unit", "integration", ".")]
from langchain_community.storage import RedisStore
from langchain_core.documents import Document
from langchain_rse import RSERetriever
from milvus_server import milvus_stores
from test_milvus import alpha_version
uri, redis, name, rounds = sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
dense, lexical = milvus_stores(uri, name)
r = RSERetriever(vectorstore=dense, lexical_store=lexical,
                 record_store=RedisStore(redis_url=f"redis://127.0.0.1:{redis}", namespace=name))
for n in range(1, rounds + 1):
    r.add_documents([Document(alpha_version(n), id="alpha")])
    print(json.dumps({"round": n}), flush=True)
    time.sleep(0.15)
sys.stdin.readline()  # the reader has seen the last version
r.delete(["alpha"])
print(json.dumps({"deleted": "alpha"}), flush=True)
"""


def alpha_version(n: int) -> str:
    """Version ``n`` of document alpha: its own rare marker, and shifted offsets."""
    return "RECITAL " * (5 * (n % 3)) + make_contract("alpha", [f"marker{n:02d}q", "payment"], 3)


def test_a_second_process_sees_the_writers_replacements_in_its_lexical_branch(
    uri, tmp_path
) -> None:
    from langchain_community.storage import RedisStore
    from servers import redis_server

    rounds = 8
    versions = {n: alpha_version(n) for n in range(rounds + 1)}
    name = uuid.uuid4().hex[:12]
    with redis_server(tmp_path) as redis:
        dense, lexical = milvus_stores(uri, name)
        docstore = RedisStore(redis_url=f"redis://127.0.0.1:{redis}", namespace=name)
        reader = RSERetriever(vectorstore=dense, lexical_store=lexical, record_store=docstore, k=3)
        other = Document(make_contract("beta", ["payment", "insurance"], 3), id="beta")
        reader.add_documents([Document(versions[0], id="alpha"), other])  # creates both
        writer = subprocess.Popen(
            [sys.executable, "-c", WRITER, str(TESTS), uri, str(redis), name, str(rounds)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        latest = [0]
        done = threading.Event()

        def follow() -> None:
            assert writer.stdout is not None
            for line in writer.stdout:
                msg = json.loads(line)
                if "round" in msg:
                    latest[0] = msg["round"]
                    if msg["round"] == rounds:
                        done.set()

        follower = threading.Thread(target=follow, daemon=True)
        follower.start()
        try:
            seen: set[int] = set()
            mixed: list[dict] = []
            deadline = time.monotonic() + 60
            while not done.is_set() and time.monotonic() < deadline:
                n = latest[0]
                for c in reader.invoke(f"marker{n:02d}q", mode="chunks"):
                    m = c.metadata
                    if m["doc_id"] == "alpha" and not any(
                        v[m["start_index"] : m["end_index"]] == c.page_content
                        for v in versions.values()
                    ):
                        mixed.append(m)
                    if m["lexical_rank"] is not None and f"marker{n:02d}q" in c.page_content:
                        seen.add(n)
            assert done.is_set(), "the writer did not finish its rounds"
            # the writer waits now: its last version must be what the reader finds
            hits = reader.invoke(f"marker{rounds:02d}q", mode="chunks")
            assert hits and hits[0].metadata["doc_id"] == "alpha"
            assert hits[0].metadata["lexical_rank"] is not None
            assert f"marker{rounds:02d}q" in hits[0].page_content
            assert reader.get(["alpha"])[0].page_content == versions[rounds]
            assert not mixed, mixed[:3]
            assert len(seen) >= 2, seen  # it saw replacements while they were written
            assert len(reader.index.lexical) == 0  # every lexical hit came from Milvus

            assert writer.stdin is not None
            writer.stdin.write("go\n")
            writer.stdin.flush()
            assert writer.wait(timeout=60) == 0
            follower.join(timeout=10)
            assert reader.get(["alpha"]) == []
            left = reader.invoke(f"marker{rounds:02d}q payment", mode="chunks")
            assert left and all(c.metadata["doc_id"] == "beta" for c in left)
            for store in (dense, lexical):
                assert rows(store, 'doc_id == "alpha"') == []
            assert_no_orphans(reader, ["alpha", "beta"])
        finally:
            if writer.poll() is None:
                writer.kill()
                writer.wait()
            dense.drop()
            lexical.drop()
