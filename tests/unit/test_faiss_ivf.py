"""IVF indexes in the local FAISS store: a delete leaves the index numbered as a flat one
(FAISS keeps an IVF index's ids where a flat index moves them up, and the store's positions
assume the latter), and LangChain's own ``FAISS`` over an IVF index is refused before a
write that would delete from it."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import numpy as np
import pytest
from langchain_core.documents import Document

from helpers import HashingEmbeddings, make_contract
from langchain_rse import RSERetriever
from langchain_rse.integrations.faiss import FaissStore
from langchain_rse.persistence import default_vectorstore

faiss = pytest.importorskip("faiss")

WORDS = ["fees", "notice", "term", "audit", "warranty", "liability", "assignment", "law"]
NLIST = 4


def ivf_index(emb: Any) -> Any:
    """An IVF index over ``emb``'s vectors, trained, searching every list (``nprobe`` =
    ``nlist``: the same hits and distances as a flat index)."""
    dim = len(emb.embed_query("probe"))
    index = faiss.IndexIVFFlat(faiss.IndexFlatIP(dim), dim, NLIST, faiss.METRIC_INNER_PRODUCT)
    train = np.asarray(
        emb.embed_documents([f"{a} {b}" for a in WORDS for b in WORDS]), dtype=np.float32
    )
    faiss.normalize_L2(train)
    index.cp.min_points_per_centroid = 1  # a small training set, on purpose
    index.train(train)
    index.nprobe = NLIST
    return index


def store(emb: Any, index: Any) -> FaissStore:
    return FaissStore(emb, index, keep_text=False)


def hits(vs: Any, query: str) -> list[tuple[Any, float]]:
    """Every hit as ``(id, distance)``, in a canonical order; a retriever's chunk by
    ``(doc id, chunk index)`` (chunk ids differ between two retrievers: every write has its
    own version id)."""
    found = vs.similarity_search_with_score(query, k=vs.index.ntotal)

    def name(d):
        return (d.metadata["doc_id"], d.metadata["chunk_index"]) if "doc_id" in d.metadata else d.id

    return sorted((name(d), round(float(s), 5)) for d, s in found)


def list_ids(index: Any) -> list[int]:
    ivf = faiss.extract_index_ivf(index)
    lists = ivf.invlists
    ids = [
        faiss.rev_swig_ptr(lists.get_ids(i), lists.list_size(i)).tolist()
        for i in range(ivf.nlist)
        if lists.list_size(i)
    ]
    return sorted(x for part in ids for x in part)


@pytest.mark.parametrize("direct_map", [False, True])
def test_ivf_deletes_and_adds_as_a_flat_index(direct_map: bool) -> None:
    """Random deletes and adds on an IVF ``FaissStore`` and a flat one: after each, the
    same ids by position, the IVF's ids exactly ``0..ntotal-1``, the same search results
    and, with a hashtable direct map (id to list entry), the same vector at every
    position after a delete."""
    emb = HashingEmbeddings()
    index = ivf_index(emb)
    if direct_map:  # set on the empty index, as a user sets it up
        index.set_direct_map_type(faiss.DirectMap.Hashtable)
    flat, ivf = default_vectorstore(emb), store(emb, index)
    rng = random.Random(7)
    live: list[str] = []
    serial = 0
    for step in range(12):
        if step % 3 == 2 and live:  # delete a few, anywhere
            gone = rng.sample(live, min(len(live), rng.randint(1, 5)))
            assert ivf.delete(gone) is True and flat.delete(gone) is True
            live = [i for i in live if i not in gone]
        else:
            n = rng.randint(3, 9)
            texts = [" ".join(rng.sample(WORDS, 3)) + f" clause {serial + i}" for i in range(n)]
            ids = [f"id{serial + i}" for i in range(n)]
            serial += n
            for vs in (flat, ivf):
                vs.add_texts(texts, metadatas=[{"i": i} for i in ids], ids=ids)
            live += ids
        assert ivf.ids == flat.ids
        assert list_ids(ivf.index) == list(range(ivf.index.ntotal)) == list(range(len(live)))
        for q in ("fees notice", "audit law clause 3", "warranty"):
            assert hits(ivf, q) == hits(flat, q)
        if direct_map and step % 3 == 2:  # the map the delete built again
            for p in range(ivf.index.ntotal):
                assert np.array_equal(ivf.index.reconstruct(p), flat.index.reconstruct(p))


def contracts() -> list[Document]:
    topics = [
        ["termination", "payment"],
        ["confidentiality", "warranty"],
        ["liability", "fees"],
        ["assignment", "audit"],
    ]
    return [Document(make_contract(f"c{i}", t), id=f"c{i}") for i, t in enumerate(topics)]


def answers(r: RSERetriever) -> list[Any]:
    out = []
    for q in ("termination for convenience", "audit rights", "limitation of liability"):
        for mode in ("segments", "chunks"):
            found = r.invoke(q, mode=mode, k=4)
            out.append(
                [(d.metadata["doc_id"], d.metadata["start_index"], d.page_content) for d in found]
            )
    return out


def test_a_hashtable_map_set_on_the_empty_index_deletes_replaced_documents() -> None:
    """A retriever over an IVF ``FaissStore`` whose hashtable direct map was set before
    anything was added (faiss-cpu 1.15 leaves such a map without the vectors added later,
    and its ``remove_ids`` then removes nothing): a replacement removes the old vectors,
    so the old text never comes back under the new document's metadata."""
    emb = HashingEmbeddings()
    index = ivf_index(emb)
    index.set_direct_map_type(faiss.DirectMap.Hashtable)
    r = RSERetriever(vectorstore=store(emb, index))
    r.add_documents([Document(f"{w} clause of the agreement", id=w) for w in WORDS])
    r.add_documents([Document("the old warranty text", id="term")])
    r.add_documents([Document("indemnity and audit", id="term")])
    r.delete(["fees"])
    assert index.ntotal == len(WORDS) - 1
    for query in ("old warranty text", "fees clause", "indemnity"):
        for doc in r.invoke(query, mode="chunks", k=len(WORDS)):
            assert "old warranty" not in doc.page_content and doc.metadata["doc_id"] != "fees"


def test_retriever_over_ivf_replaces_and_deletes_as_over_flat() -> None:
    """A retriever over an IVF ``FaissStore`` after documents are added, replaced and
    deleted: every position holds the vector of the chunk the store's ids name there
    (as the default flat store holds it after the same writes), so its dense hits are
    the flat store's, and the replacement is found, the deleted document never."""
    emb = HashingEmbeddings()
    flat = RSERetriever(vectorstore=default_vectorstore(emb))
    ivf = RSERetriever(vectorstore=store(emb, ivf_index(emb)))
    for r in (flat, ivf):
        r.add_documents(contracts())
        r.add_documents([Document(make_contract("c1", ["indemnity", "audit"]), id="c1")])
        r.delete(["c0"])
    a: Any = ivf.vectorstore
    b: Any = flat.vectorstore
    chunks_a = [(m["doc_id"], m["chunk_index"]) for m in a.metadatas]  # ids differ: versions
    chunks_b = [(m["doc_id"], m["chunk_index"]) for m in b.metadatas]
    assert sorted(chunks_a) == sorted(chunks_b)
    assert list_ids(a.index) == list(range(a.index.ntotal))
    a.index.set_direct_map_type(faiss.DirectMap.Hashtable)  # to read a position's vector
    where = {chunk: p for p, chunk in enumerate(chunks_b)}
    for p, chunk in enumerate(chunks_a):
        assert np.array_equal(a.index.reconstruct(p), b.index.reconstruct(where[chunk]))
    for q in ("termination for convenience", "audit rights", "indemnity"):
        assert hits(a, q) == hits(b, q)
    found = [d.metadata["doc_id"] for q in ("indemnity", "termination") for d in ivf.invoke(q)]
    assert "c1" in found and "c0" not in found
    for doc in ("c1", "c3"):  # a doc_id filter searches those documents' positions only
        got = ivf.invoke("audit rights", filter={"doc_id": doc}, mode="chunks", k=3)
        want = flat.invoke("audit rights", filter={"doc_id": doc}, mode="chunks", k=3)
        assert [d.metadata["doc_id"] for d in got] == [doc] * 3
        assert sorted(d.page_content for d in got) == sorted(d.page_content for d in want)


def refuses_removals(vs: Any, match: str) -> None:
    """A retriever over ``vs`` adds documents, but a delete, a replacement and a vacuum
    (sync and async) raise a ``ValueError`` matching ``match`` before anything is written
    or removed (the vectors, the BM25 index and the records stay as they were)."""
    r = RSERetriever(vectorstore=vs)
    r.add_documents(contracts())
    before, n = answers(r), vs.index.ntotal
    replaced = [Document(make_contract("c1", ["indemnity", "audit"]), id="c1")]
    for call in (lambda: r.delete(["c0"]), lambda: r.add_documents(replaced), r.vacuum):
        with pytest.raises(ValueError, match=match):
            call()
    for coro in (r.adelete(["c0"]), r.aadd_documents(replaced), r.avacuum()):
        with pytest.raises(ValueError, match=match):
            asyncio.run(coro)  # type: ignore[arg-type]
    assert vs.index.ntotal == n and answers(r) == before and len(r.get(["c0", "c1"])) == 2
    r.add_documents([Document(make_contract("c9", ["indemnity"]), id="c9")])
    assert vs.index.ntotal > n


def test_langchains_faiss_over_ivf_refuses_deletes_before_writing() -> None:
    """LangChain's ``FAISS.delete`` renumbers its map, not an IVF index: a retriever over
    it refuses removals with a ``ValueError`` that names ``FaissStore``."""
    pytest.importorskip("langchain_community")
    from langchain_community.docstore.in_memory import InMemoryDocstore
    from langchain_community.vectorstores import FAISS

    emb = HashingEmbeddings()
    vs = FAISS(emb, ivf_index(emb), InMemoryDocstore({}), {}, normalize_L2=True)
    refuses_removals(vs, "FaissStore")


def test_ivf_with_an_array_direct_map_refuses_deletes() -> None:
    """FAISS cannot remove from an IVF index with an array direct map: the delete raises
    a ``ValueError`` and the store is as it was."""
    emb = HashingEmbeddings()
    vs = store(emb, ivf_index(emb))
    vs.add_texts([f"{w} clause" for w in WORDS], ids=WORDS)
    vs.index.set_direct_map_type(faiss.DirectMap.Array)
    before, ids = hits(vs, "fees notice"), list(vs.ids)
    with pytest.raises(ValueError, match="array direct map"):
        vs.delete(["term"])
    assert vs.ids == ids and hits(vs, "fees notice") == before


def test_ivf_store_saves_and_loads_after_deletes(tmp_path: Any) -> None:
    """An IVF ``FaissStore`` is saved and loaded as the default store is: after a
    replacement and a delete, the loaded retriever's store and answers are the saved one's,
    and it can delete again."""
    emb = HashingEmbeddings()
    r = RSERetriever(vectorstore=store(emb, ivf_index(emb)))
    r.add_documents(contracts())
    r.add_documents([Document(make_contract("c1", ["indemnity", "audit"]), id="c1")])
    r.delete(["c0"])
    r.save(tmp_path / "index")
    loaded = RSERetriever.load(tmp_path / "index", embedding=emb)
    a: Any = loaded.vectorstore
    assert isinstance(a, FaissStore) and faiss.try_extract_index_ivf(a.index) is not None
    assert a.ids == r.vectorstore.ids  # type: ignore[attr-defined]
    assert a.index.nprobe == NLIST and answers(loaded) == answers(r)
    loaded.delete(["c2"])
    assert list_ids(a.index) == list(range(a.index.ntotal))
    assert all(d.metadata["doc_id"] != "c2" for d in loaded.invoke("liability fees"))


def test_an_index_that_cannot_remove_refuses_deletes_before_writing() -> None:
    """FAISS cannot remove from an HNSW index: the store's delete, and a retriever's
    removals, raise a ``ValueError`` that says so before anything changes."""
    emb = HashingEmbeddings()
    vs = store(emb, faiss.IndexHNSWFlat(len(emb.embed_query("probe")), 16))
    vs.add_texts(["fees clause"], ids=["x"])
    with pytest.raises(ValueError, match="cannot remove vectors"):
        vs.delete(["x"])
    assert vs.ids == ["x"]
    refuses_removals(
        store(emb, faiss.IndexHNSWFlat(len(emb.embed_query("probe")), 16)), "cannot remove vectors"
    )
