"""The default local store keeps no chunk text (``ChunkDocstore``): the record store holds it.

Retrieval, reranking inputs and save/load must be exactly what a FAISS store with
LangChain's ``InMemoryDocstore`` gives, and indexes saved with one still load.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from langchain_core.documents import BaseDocumentCompressor, Document

from helpers import HashingEmbeddings, make_contract, stored_metadata
from langchain_rse import RSERetriever
from langchain_rse.persistence import _faiss_classes, default_vectorstore
from langchain_rse.stores.chunk_docstore import ChunkDocstore
from langchain_rse.stores.faiss import LocalFAISS

LangChainFAISS = LocalFAISS.__mro__[1]
"""``langchain_community.vectorstores.FAISS``, as LangChain ships it."""

QUERIES = ["termination for convenience", "payment of fees", "confidential information"]


def docs() -> list[Document]:
    topics = [["termination", "payment"], ["confidentiality", "warranty"], ["liability", "fees"]]
    return [
        Document(make_contract(f"c{i}", t), metadata={"source": f"c{i}.txt", "tenant": i % 2})
        for i, t in enumerate(topics)
    ]


def faiss_with_documents(emb: Any) -> Any:
    """FAISS as LangChain builds it: an InMemoryDocstore holding each chunk's text."""
    faiss, _, InMemoryDocstore, DistanceStrategy = _faiss_classes()
    dim = len(emb.embed_query("probe"))
    return LangChainFAISS(emb, faiss.IndexFlatL2(dim), InMemoryDocstore({}), {},
                          normalize_L2=True,
                          distance_strategy=DistanceStrategy.EUCLIDEAN_DISTANCE)  # fmt: skip


SEEN: list[str] = []


class Recording(BaseDocumentCompressor):
    """Keeps every document, in order, and records the texts it was asked to rerank."""

    def compress_documents(
        self, documents: Sequence[Document], query: str, callbacks: Any = None
    ) -> Sequence[Document]:
        SEEN.extend(d.page_content for d in documents)
        return list(documents)


def results(r: RSERetriever) -> list[list[tuple[Any, ...]]]:
    out = []
    for q in QUERIES:
        for mode in ("segments", "chunks"):
            found = r.invoke(q, mode=mode, k=4)
            out.append([(d.page_content, d.metadata["doc_id"], d.metadata["start_index"],
                         d.metadata["score"]) for d in found])  # fmt: skip
    return out


def test_default_store_keeps_metadata_but_no_text() -> None:
    r = RSERetriever(vectorstore=default_vectorstore(HashingEmbeddings()))
    r.add_documents(docs())
    store = r.vectorstore.docstore  # type: ignore[attr-defined]
    assert isinstance(store, ChunkDocstore)
    assert len(store) == len(r._lexical) > 0
    hit = r.vectorstore.similarity_search("termination", k=1)[0]
    assert hit.page_content == ""
    m = hit.metadata
    source = r.get([m["doc_id"]])[0].page_content
    assert source[m["start_index"] : m["end_index"]].strip()  # the text is one slice away
    assert {m["tenant"] for m in stored_metadata(r.vectorstore)} == {0, 1}


@pytest.mark.parametrize("reranked", [False, True])
def test_same_results_and_rerank_inputs_as_with_texts_in_faiss(reranked: bool) -> None:
    emb = HashingEmbeddings()
    runs = []
    for store in (faiss_with_documents(emb), default_vectorstore(emb)):
        SEEN.clear()
        r = RSERetriever(vectorstore=store, reranker=Recording() if reranked else None)
        r.add_documents(docs())
        runs.append((results(r), list(SEEN)))
    (with_texts, seen_with), (without, seen_without) = runs
    assert with_texts == without
    assert seen_with == seen_without
    assert (len(seen_with) > 0) == reranked
    assert all(seen_with)  # the reranker saw context + chunk text, never an empty string


@pytest.mark.parametrize("texts_in_faiss", [False, True])
def test_save_load_round_trip(tmp_path: Path, texts_in_faiss: bool) -> None:
    """The default store saves metadata only; a FAISS store with LangChain's
    InMemoryDocstore (as earlier versions saved) keeps its texts; both load to the same
    results."""
    emb = HashingEmbeddings()
    store = faiss_with_documents(emb) if texts_in_faiss else default_vectorstore(emb)
    r = RSERetriever(vectorstore=store)
    r.add_documents(docs())
    before = results(r)
    r.save(tmp_path)
    vectors = next(tmp_path.glob("vectors.*.json")).read_text()
    assert json.loads(vectors)["docstore"] == ("in_memory" if texts_in_faiss else "chunks")
    assert ("termination" in vectors.lower()) == texts_in_faiss  # chunk text, or none
    loaded = RSERetriever.load(tmp_path, embedding=emb)
    docstore = loaded.vectorstore.docstore  # type: ignore[attr-defined]
    assert isinstance(docstore, ChunkDocstore) != texts_in_faiss
    assert results(loaded) == before


def test_docstore_contract() -> None:
    store = ChunkDocstore()
    store.add({"a": Document("text", metadata={"doc_id": "d", "n": 1})})
    found = store.search("a")
    assert isinstance(found, Document)
    assert (found.page_content, found.metadata, found.id) == ("", {"doc_id": "d", "n": 1}, "a")
    assert store.search("b") == "ID b not found."
    with pytest.raises(ValueError, match="already exist"):
        store.add({"a": Document("again")})
    with pytest.raises(ValueError, match="does not exist"):
        store.delete(["a", "b"])
    assert len(store) == 1  # a failed delete removes nothing
    store.delete(["a"])
    assert len(store) == 0 and repr(store) == "ChunkDocstore(0 chunks)"


def test_search_index_gives_the_wrappers_hits_and_scores() -> None:
    from langchain_rse.search import key_of

    r = RSERetriever(vectorstore=default_vectorstore(HashingEmbeddings()))
    r.add_documents(docs())
    vs = r.vectorstore
    for q in QUERIES:
        fast = vs.docstore.search_index(vs, q, 10)  # type: ignore[attr-defined]
        wrapped = vs._similarity_search_with_relevance_scores(q, k=10)
        assert [key for key, _ in fast] == [key_of(d) for d, _ in wrapped]
        assert [s for _, s in fast] == pytest.approx([float(s) for _, s in wrapped], abs=1e-6)
        assert len(fast) == 10


def test_search_index_skips_foreign_rows_and_missing_neighbours() -> None:
    """Rows another writer put in the store (no chunk key fields, or only some) are not
    hits, and asking for more neighbours than there are vectors (FAISS pads with -1) gives
    the chunks there are."""
    from langchain_rse.search import key_of

    r = RSERetriever(vectorstore=default_vectorstore(HashingEmbeddings()))
    r.add_documents(docs())
    vs = r.vectorstore
    vs.add_texts(["fees notice term"], metadatas=[{"source": "elsewhere"}])
    vs.add_texts(["notice term fees"], metadatas=[{"doc_id": "x", "chunk_index": 0}])
    n = vs.index.ntotal
    for q in QUERIES:
        fast = vs.docstore.search_index(vs, q, n + 5)  # type: ignore[attr-defined]
        wrapped = vs._similarity_search_with_relevance_scores(q, k=n + 5)
        ours = [key_of(d) for d, _ in wrapped if key_of(d) is not None]
        assert [key for key, _ in fast] == ours and len(ours) == n - 2


def test_local_faiss_deletes_as_langchains_faiss_does() -> None:
    """``LocalFAISS.delete`` (one pass over the id map) leaves the same index, id map,
    docstore and search results as LangChain's ``FAISS.delete``; an unknown id raises and
    deletes nothing; a map not in position order (not built by LangChain) still works."""
    emb = HashingEmbeddings()
    ours, theirs = default_vectorstore(emb), faiss_with_documents(emb)
    assert isinstance(ours, LocalFAISS) and type(theirs) is LangChainFAISS
    texts = [f"clause {i} about {w}" for i, w in enumerate(["fees", "notice", "term"] * 7)]
    ids = [f"id{i}" for i in range(len(texts))]
    for store in (ours, theirs):
        store.add_texts(texts, ids=ids)
    for batch in (["id3"], ["id0", "id20", "id7"], ["id10", "id11"]):
        assert ours.delete(batch) is True and theirs.delete(batch) is True
        assert ours.index_to_docstore_id == theirs.index_to_docstore_id
        assert ours.index.ntotal == theirs.index.ntotal == len(ours.index_to_docstore_id)
        for q in ("fees", "notice term"):
            got = [(d.id, round(s, 5)) for d, s in ours.similarity_search_with_score(q, k=5)]
            assert got == [
                (d.id, round(s, 5)) for d, s in theirs.similarity_search_with_score(q, k=5)
            ]
    before = dict(ours.index_to_docstore_id)
    with pytest.raises(ValueError, match="id3"):
        ours.delete(["id1", "id3"])
    assert ours.index_to_docstore_id == before and ours.docstore.metadata("id1") is not None
    ours.index_to_docstore_id = dict(reversed(list(before.items())))  # same map, other order
    ours.delete(["id1"])
    assert list(ours.index_to_docstore_id.values()) == [i for i in before.values() if i != "id1"]


def test_cached_hit_keys_follow_adds_and_deletes() -> None:
    """``search_index`` keeps the chunk key of each position; after every kind of write
    (the retriever's adds and deletes, a foreign add, LangChain's own ``FAISS.delete``,
    ``merge_from``, a row deleted from the docstore alone) its hits are still the
    wrapper's."""
    from langchain_rse.search import key_of

    emb = HashingEmbeddings()
    r = RSERetriever(vectorstore=default_vectorstore(emb))
    r.add_documents(docs())
    vs: Any = r.vectorstore

    def check(store: Any = None) -> None:
        store = store or vs
        n = store.index.ntotal
        for q in QUERIES:
            found = store._similarity_search_with_relevance_scores(q, k=n)
            expected = [key_of(d) for d, _ in found if key_of(d) is not None]
            for _ in range(2):  # keys built (if the map changed), then read
                assert [k for k, _ in store.docstore.search_index(store, q, n)] == expected
        cached = store.docstore._hit_keys[1]
        assert sum(k is not None for k in cached) == n  # every position's key

    def cached() -> int:
        of, keys, _ = vs.docstore._hit_keys
        assert of is vs.index_to_docstore_id
        return sum(k is not None for k in keys)

    check()
    more = [Document(make_contract(f"n{i}", ["notice", "fees"]), metadata={"source": f"n{i}"})
            for i in range(3)]  # fmt: skip
    new = r.add_documents(more)  # positions appended in place, their keys made by the write
    first = stored_metadata(vs)[0]["doc_id"]
    kept = vs.docstore._hit_keys[1]
    before = list(kept)
    r.delete([first])  # LocalFAISS.delete: a new map, the keys carried over (moved up)
    assert kept == before  # into a new list: hits of a finished search still read the old one
    assert vs.docstore._hit_keys[1] is not kept and cached() == vs.index.ntotal
    check()
    vs.add_texts(["fees notice term"], metadatas=[{"source": "elsewhere"}])  # not ours
    check()
    r.delete([new[1]])  # positions in the middle: the cached keys after them move up
    assert cached() == vs.index.ntotal
    check()
    other = default_vectorstore(emb)
    other.add_texts(["termination fees"], metadatas=[{"doc_id": "m", "doc_version": "v",
                                                      "chunk_index": 0}])  # fmt: skip
    vs.merge_from(other)  # appended in place, rows added
    check()
    victim = vs.index_to_docstore_id[0]
    LangChainFAISS.delete(vs, [victim])  # LangChain's delete: a new map, rows deleted
    check()
    # Another store over the same docstore, its vectors in reverse order: another map.
    import faiss

    n = vs.index.ntotal
    index = faiss.IndexFlatL2(vs.index.d)
    index.add(vs.index.reconstruct_n(0, n)[::-1])
    names = list(vs.index_to_docstore_id.values())[::-1]
    twin = LocalFAISS(emb, index, vs.docstore, dict(enumerate(names)), normalize_L2=True,
                      distance_strategy=vs.distance_strategy)  # fmt: skip
    for store in (twin, vs, twin):
        check(store)
    # A row deleted from the docstore alone: its position stays in the map, but not a hit.
    position, name = next(iter(vs.index_to_docstore_id.items()))
    gone = key_of(vs.docstore.search(name))
    assert gone is not None
    before = {q: [k for k, _ in vs.docstore.search_index(vs, q, vs.index.ntotal)]
              for q in QUERIES}  # fmt: skip
    vs.docstore.delete([name])
    for q in QUERIES:
        keys = [k for k, _ in vs.docstore.search_index(vs, q, vs.index.ntotal)]
        assert keys == [k for k in before[q] if k != gone] and len(keys) < len(before[q])


def test_cached_hit_keys_under_concurrent_searches() -> None:
    """Searches in several threads at once, with no key list yet, all get the wrapper's
    hits (each may build the list; no lock)."""
    from concurrent.futures import ThreadPoolExecutor

    from langchain_rse.search import key_of

    r = RSERetriever(vectorstore=default_vectorstore(HashingEmbeddings()))
    r.add_documents(docs())
    vs: Any = r.vectorstore
    n = vs.index.ntotal
    queries = [f"{a} {b}" for a in ("fees", "notice", "term", "liability") for b in QUERIES]
    expected = {
        q: [key_of(d) for d, _ in vs._similarity_search_with_relevance_scores(q, k=n)]
        for q in queries
    }
    for _ in range(5):
        vs.docstore._hit_keys = (None, [], np.zeros(0, dtype=np.int64))
        with ThreadPoolExecutor(4) as pool:
            got = list(pool.map(lambda q: [k for k, _ in vs.docstore.search_index(vs, q, n)],
                                queries * 3))  # fmt: skip
        assert got == [expected[q] for q in queries * 3]


def test_hits_keep_their_keys_after_a_delete_moves_positions() -> None:
    """The dense branch returns FAISS positions and fusion reads their keys after the
    search's lock: a delete that moves the positions up does so in new lists, so the hits
    of a search that ended before it still name the chunks FAISS found."""
    from langchain_rse.fusion import key_ids

    r = RSERetriever(vectorstore=default_vectorstore(HashingEmbeddings()))
    r.add_documents(docs())
    vs: Any = r.vectorstore
    n = vs.index.ntotal
    hits = vs.docstore.search_index(vs, "termination fees", n)
    before = list(hits)
    assert len(before) == n and hits.ids.tolist() == key_ids(k for k, _ in before).tolist()
    first = stored_metadata(vs)[0]["doc_id"]
    r.delete([first])  # positions after its chunks move up
    assert vs.index.ntotal < n and list(hits) == before
    after = [k for k, _ in vs.docstore.search_index(vs, "termination fees", n)]
    assert after == [k for k, _ in before if not k.startswith(first + "\x1f")]
