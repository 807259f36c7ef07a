"""The default local store (``FaissStore``, ours over faiss-cpu) and the default path
without sunset packages: no ``langchain_community`` / ``langchain_classic`` module is
imported to build, query, cache, save or load an index; an index of an earlier build is
refused with "re-create the index"; LangChain's ``FAISS`` still works when a user passes
one."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from langchain_core.documents import Document

from conftest import corpus_documents
from helpers import HashingEmbeddings
from langchain_rse import RSERetriever, cached_embeddings
from langchain_rse.embeddings import model_namespace
from langchain_rse.filters import matches, parse
from langchain_rse.indexing.recordstore import FileByteStore
from langchain_rse.integrations.faiss import FaissStore

faiss = pytest.importorskip("faiss")

TESTS = Path(__file__).resolve().parents[1] / "support"
FIXTURE = TESTS / "data" / "index_localfaiss_0_1"
WORDS = ["fees", "notice", "term", "audit", "warranty", "liability", "assignment", "law"]


def snapshot(r: RSERetriever, queries: list[str]) -> list[Any]:
    return [[(d.page_content, d.metadata) for d in r.invoke(q)] for q in queries]


def clauses(n: int) -> tuple[list[str], list[dict[str, Any]], list[str]]:
    texts = [f"{WORDS[i % 8]} {WORDS[(i * 3) % 8]} clause {i}" for i in range(n)]
    metas = [
        {
            "tenant": ["acme", "globex", "initech"][i % 3],
            "year": 2000 + i % 7,
            "doc_id": f"d{i % 5}",
        }
        for i in range(n)
    ]
    return texts, metas, [f"id{i}" for i in range(n)]


# ------------------------------------------------------------------ the store itself


def test_store_adds_replaces_deletes_and_gets_by_id() -> None:
    store = FaissStore(HashingEmbeddings())
    texts, metas, ids = clauses(10)
    assert store.add_texts(texts, metas, ids=ids) == ids
    assert [d.page_content for d in store.get_by_ids(["id3", "missing", "id1"])] == [
        texts[3],
        texts[1],
    ]
    store.add_texts(["audit replaced"], [{"tenant": "acme"}], ids=["id3"])  # an add replaces
    assert len(store) == 10 and store.get_by_ids(["id3"])[0].page_content == "audit replaced"
    assert store.delete(["id0", "id5", "never-added"]) is True  # unknown ids are ignored
    assert len(store) == store.index.ntotal == 8 and not store.get_by_ids(["id0", "id5"])
    top = store.similarity_search_with_score("audit replaced", k=1)[0]
    assert top[0].id == "id3" and top[1] == pytest.approx(1.0, abs=1e-5)  # cosine
    with pytest.raises(ValueError, match="unique"):
        store.add_texts(["a", "b"], ids=["x", "x"])
    with pytest.raises(ValueError, match="NaN or infinite"):
        store.add_embeddings(["nan"], [[float("nan")] * store.index.d])


def test_scores_are_cosines_in_the_order_of_an_exact_search() -> None:
    emb = HashingEmbeddings()
    store = FaissStore(emb)
    texts, metas, ids = clauses(40)
    store.add_texts(texts, metas, ids=ids)
    vectors = np.asarray(emb.embed_documents(texts))
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    q = np.asarray(emb.embed_query("audit fees"))
    cosines = vectors @ (q / np.linalg.norm(q))
    found = store.similarity_search_with_score("audit fees", k=40)
    assert [s for _, s in found] == pytest.approx(sorted(cosines, reverse=True), abs=1e-5)
    assert all(cosines[ids.index(d.id)] == pytest.approx(s, abs=1e-5) for d, s in found)


@pytest.mark.parametrize(
    "spec",
    [
        {"tenant": "globex"},
        {"year": {"$gte": 2004}, "tenant": {"$ne": "acme"}},
        {"$or": [{"doc_id": "d2"}, {"tenant": "initech"}]},
        {"doc_id": "d3"},
        {"doc_id": {"$in": ["d1", "d4"]}},
        {"doc_id": {"$in": ["d1", "d3"]}, "tenant": "acme"},  # those documents, then the rest
        {"doc_id": "nowhere"},
    ],
)
def test_a_filtered_search_is_exact(spec: dict[str, Any]) -> None:
    """A filter (dict, parsed, or a function of the metadata) returns the ``k`` best of
    the documents that pass it, however selective: the same as ranking them all."""
    store = FaissStore(HashingEmbeddings())
    texts, metas, ids = clauses(60)
    store.add_texts(texts, metas, ids=ids)
    f = parse(spec)
    every = store.similarity_search_with_score("warranty law", k=60)
    score = {d.id: s for d, s in every}
    want = [s for d, s in every if matches(f, d.metadata)][:4]
    for form in (spec, f, lambda m: matches(f, m)):
        got = store.similarity_search_with_score("warranty law", k=4, filter=form)
        assert [s for _, s in got] == pytest.approx(want, abs=1e-6)  # (ties in any order)
        assert all(matches(f, d.metadata) and score[d.id] == pytest.approx(s) for d, s in got)


FILTERS = [
    {"tenant": "acme"},
    {"tenant": {"$ne": "acme"}, "year": {"$gte": 2003}},
    {"flag": True},
    {"flag": 1},  # equal to True in Python, not in the filter language
]


@settings(max_examples=40, deadline=None)
@given(
    steps=st.lists(
        st.tuples(
            st.sampled_from(["add", "delete"]),
            st.lists(st.integers(0, 11), max_size=4, unique=True),
        ),
        max_size=12,
    ),
    order=st.permutations(range(len(FILTERS))),
)
def test_a_filtered_search_sees_every_write_before_it(
    steps: list[tuple[str, list[int]]], order: list[int]
) -> None:
    """After each of random adds, replaces (with new metadata) and deletes, every filter
    returns the best of exactly the vectors that pass it now: what a filter let through
    before a write is never reused after it."""
    store = FaissStore(HashingEmbeddings())
    for n, (action, picked) in enumerate(steps):
        ids = [f"id{i}" for i in picked]
        if action == "add" and ids:
            metas = [
                {"tenant": ["acme", "globex"][(i + n) % 2], "year": 2000 + (i * n) % 7}
                | [{"flag": True}, {"flag": 1}, {}][(i + n) % 3]
                for i in picked
            ]
            store.add_texts([f"{WORDS[(i + n) % 8]} clause {i}" for i in picked], metas, ids=ids)
        elif ids:
            store.delete(ids)  # (unknown ids are ignored)
        every = store.similarity_search_with_score("warranty law", k=len(store) + 1)
        for spec in [FILTERS[i] for i in order]:
            want = [s for d, s in every if matches(parse(spec), d.metadata)]
            got = store.similarity_search_with_score("warranty law", k=len(store) + 1, filter=spec)
            assert [s for _, s in got] == pytest.approx(want, abs=1e-6), spec
            assert all(matches(parse(spec), d.metadata) for d, _ in got), spec


def test_store_saves_as_faiss_and_json_and_loads(tmp_path: Path) -> None:
    emb = HashingEmbeddings()
    store = FaissStore(emb)
    texts, metas, ids = clauses(12)
    store.add_texts(texts, metas, ids=ids)
    store.delete(["id4"])
    store.save_local(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["index.faiss", "index.json"]
    assert faiss.read_index(str(tmp_path / "index.faiss")).ntotal == 11  # FAISS's own format
    json.loads((tmp_path / "index.json").read_text())  # JSON, no pickle
    loaded = FaissStore.load_local(tmp_path, emb)
    assert loaded.ids == store.ids and loaded.metadatas == store.metadatas
    assert [(d.id, s) for d, s in loaded.similarity_search_with_score("audit", k=5)] == [
        (d.id, s) for d, s in store.similarity_search_with_score("audit", k=5)
    ]


# ------------------------------------------------------------------ the retriever's default


def test_the_default_store_is_ours_and_keeps_no_chunk_text(tmp_path: Path) -> None:
    r = RSERetriever.from_documents(corpus_documents(), embedding=HashingEmbeddings(), k=3)
    assert isinstance(r.vectorstore, FaissStore) and not r.vectorstore.keep_text
    assert set(r.vectorstore.texts) == {""} and r.invoke("royalties")
    r.save(tmp_path / "idx")
    manifest = json.loads((tmp_path / "idx" / "rse_index.json").read_text())
    assert manifest["vectorstore"]["class"] == "langchain_rse.integrations.faiss.FaissStore"
    loaded = RSERetriever.load(tmp_path / "idx", embedding=HashingEmbeddings())
    assert isinstance(loaded.vectorstore, FaissStore)
    queries = ["termination provisions", "royalties and audit rights"]
    assert snapshot(loaded, queries) == snapshot(r, queries)


_DEFAULT_PATH = """
import sys, tempfile
sys.path[:0] = [f"{sys.argv[1]}/../{d}" for d in ("support", "unit", "integration", ".")]
from helpers import HashingEmbeddings
from langchain_core.documents import Document

from langchain_rse import RSERetriever, cached_embeddings
from langchain_rse.persistence import default_vectorstore
from langchain_rse.sample_data import load_sample_documents
from langchain_core.documents import Document

emb = cached_embeddings(HashingEmbeddings(), tempfile.mkdtemp())
r = RSERetriever(vectorstore=default_vectorstore(emb), show_progress=False)
r.add_documents(load_sample_documents())
assert r.invoke("notice period")
path = tempfile.mkdtemp()
r.save(path)
assert RSERetriever.load(path, embedding=HashingEmbeddings()).invoke("notice period")
from langchain_rse.indexing.chunking import combine_pages
from langchain_rse.indexing.recordstore import file_store
file_store(tempfile.mkdtemp()).mset([("k", b"v")])
print(sorted(m for m in sys.modules
             if m.split(".")[0] in ("langchain_community", "langchain_classic")))
"""


def test_the_default_path_imports_no_sunset_package() -> None:
    """Build, query, cache embeddings, save and load with the defaults: no module of
    ``langchain-community`` or ``langchain-classic`` is imported (both are installed here)."""
    out = subprocess.run(
        [sys.executable, "-c", _DEFAULT_PATH, str(TESTS)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"


# ------------------------------------------------------------------ compatibility


def test_an_index_of_an_earlier_build_is_refused_with_re_create(tmp_path: Path) -> None:
    """``tests/support/data/index_localfaiss_0_1`` was saved by main at acba546 (format
    version 1, ``LocalFAISS``): nothing was released, so it is not read; the error says to
    re-create the index."""
    from langchain_rse.persistence import IndexFormatError

    index = tmp_path / "idx"
    shutil.copytree(FIXTURE, index)
    with pytest.raises(IndexFormatError, match="version 1 .*re-create the index"):
        RSERetriever.load(index, embedding=HashingEmbeddings(dim=16))


def test_an_index_of_format_2_is_refused_with_re_create(tmp_path: Path) -> None:
    """``tests/support/data/index_format_2`` was saved by main at 4180282 (format version 2:
    the record store's role and manifest key were ``docstore``, the router saved its own
    ``fetch_k``): the error says to re-create the index."""
    from langchain_rse.persistence import IndexFormatError

    index = tmp_path / "idx"
    shutil.copytree(FIXTURE.parent / "index_format_2", index)
    with pytest.raises(IndexFormatError, match="version 2 .*re-create the index"):
        RSERetriever.load(index, embedding=HashingEmbeddings(dim=16))


def test_a_saved_index_names_its_record_store(tmp_path: Path) -> None:
    r = RSERetriever.from_documents(
        [Document("# Terms\n\nPayment is due within 45 days.", id="t")],
        embedding=HashingEmbeddings(dim=16),
        show_progress=False,
    )
    r.save(tmp_path / "idx")
    manifest = json.loads((tmp_path / "idx" / "rse_index.json").read_text())
    assert manifest["record_store"] == {"kind": "embedded", "class": "InMemoryByteStore"}
    assert manifest["files"]["record_store"]["name"].startswith("record_store.")
    loaded = RSERetriever.load(tmp_path / "idx", embedding=HashingEmbeddings(dim=16))
    assert loaded.get(["t"])[0].page_content == r.get(["t"])[0].page_content


@pytest.fixture
def langchain_faiss() -> Any:
    pytest.importorskip("langchain_community", reason="LangChain's FAISS: the compat extra")
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from langchain_community.docstore.in_memory import InMemoryDocstore
        from langchain_community.vectorstores import FAISS

    def make(emb: Any, normalize: bool) -> Any:
        dim = len(emb.embed_query("probe"))
        return FAISS(emb, faiss.IndexFlatL2(dim), InMemoryDocstore({}), {}, normalize_L2=normalize)

    return make


@pytest.mark.parametrize("normalize", [True, False])
def test_langchains_faiss_passed_by_a_user_works_saves_and_loads(
    tmp_path: Path, langchain_faiss: Any, normalize: bool
) -> None:
    emb = HashingEmbeddings()
    vs = langchain_faiss(emb, normalize)
    r = RSERetriever.from_documents(corpus_documents(), embedding=emb, vectorstore=vs, k=3)
    queries = ["termination provisions", "insurance"]
    assert all(snapshot(r, queries))
    r.delete(["gamma.txt"])
    assert all(d.metadata["doc_id"] != "gamma.txt" for d in r.invoke("royalties", k=5))
    r.save(tmp_path / "idx")
    loaded = RSERetriever.load(tmp_path / "idx", embedding=HashingEmbeddings())
    assert type(loaded.vectorstore) is type(vs)  # still LangChain's FAISS
    assert snapshot(loaded, queries) == snapshot(r, queries)


def test_embedding_cache_keys_are_langchain_classics(tmp_path: Path) -> None:
    """A cache written by ``langchain_classic``'s ``CacheBackedEmbeddings`` (what
    ``cached_embeddings`` returned before) is read without embedding again, and the
    other way round."""
    pytest.importorskip("langchain_classic", reason="the compat extra")
    from langchain_classic.embeddings import CacheBackedEmbeddings

    class Counting(HashingEmbeddings):
        texts = 0

        def embed_documents(self, texts: list[str]) -> list[list[float]]:
            Counting.texts += len(texts)
            return super().embed_documents(texts)

    texts = [f"clause {i}" for i in range(6)]
    store = FileByteStore(tmp_path)
    theirs = CacheBackedEmbeddings.from_bytes_store(
        Counting(), store, namespace=model_namespace(Counting()), key_encoder="sha256"
    )
    old = theirs.embed_documents(texts[:3])
    assert cached_embeddings(Counting(), store).embed_documents(texts) == [
        *old,
        *Counting().embed_documents(texts[3:]),
    ]
    Counting.texts = 0
    assert theirs.embed_documents(texts) == cached_embeddings(Counting(), store).embed_documents(
        texts
    )
    assert Counting.texts == 0  # every vector came from the cache


def test_ties_come_in_the_order_they_were_added() -> None:
    """Equal vectors (template documents) rank the earlier added first, so adding a
    look-alike document never pushes an existing one down among its ties."""
    store = FaissStore(HashingEmbeddings())
    store.add_texts(["same words here", "other words", "same words here"], ids=["a", "b", "c"])
    found = store.similarity_search_with_score("same words here", k=3)
    assert [d.id for d, _ in found] == ["a", "c", "b"]
