"""The default local vector store: exact cosine search in ``faiss-cpu``, saved as FAISS's
own file plus JSON (no pickle, no ``langchain-community``).

:class:`FaissStore` keeps one FAISS index and, position for position, each vector's id,
metadata and (optionally) text. Vectors are normalised to unit length, so the default
``IndexFlatIP`` scores are cosine similarities. A search runs on one OpenMP thread: FAISS
splits a single query over every thread at several times the cost (an exact search of 100k
vectors: about 5 ms on one thread, 20 ms on two of a busy 2-core machine).

LangChain's own ``FAISS`` (``langchain-community``) stays usable as a retriever's store;
:func:`check_deletes` refuses the writes it would get wrong.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from functools import lru_cache, partial
from pathlib import Path
from typing import Any

import numpy as np
from langchain_core.documents import Document
from langchain_core.embeddings import Embeddings
from langchain_core.vectorstores import VectorStore

from langchain_rse.filters import Bool, Cmp, Filter, doc_ids, matches, parse
from langchain_rse.indexing.records import chunk_key

__all__ = ["FaissStore", "check_deletes", "kept_ids_ivf", "move_up", "removable", "one_thread"]

HALF_SCAN_FROM = 20_000
"""From this many vectors, an unfiltered search of an ``IndexFlatIP`` first scans a
half-precision copy (half the memory read), then scores its best candidates exactly: the
same results, in about half the time (100k vectors of 384 dimensions: ~4 ms instead of
~7.5; 1M: see ``benchmarks/RESULTS.md``), for 2 bytes per dimension and vector."""
HALF_ERROR = 1e-3
"""More than the most a half-precision copy of a unit vector changes its inner product with
a unit query (each component rounded by at most 2**-11 of itself: at most 2**-11 in all)."""
KEPT_FILTERS = 32
"""Filters whose passing positions a store keeps between writes (the least recently used
goes first): at most 8 bytes a vector each, a tenant's share of that for a tenant's filter."""

MetadataFilter = Mapping[str, Any] | Filter | Callable[[dict[str, Any]], bool] | None
"""A filter in the retriever's language (a dict, or parsed), or a function of the metadata."""


@contextmanager
def one_thread() -> Iterator[None]:
    """FAISS's OpenMP thread count set to one on the calling thread (an OpenMP setting is
    per thread), the caller's own setting restored after."""
    import faiss

    before = faiss.omp_get_max_threads()
    if before == 1:
        yield
        return
    faiss.omp_set_num_threads(1)
    try:
        yield
    finally:
        faiss.omp_set_num_threads(before)


class FaissStore(VectorStore):
    """A LangChain ``VectorStore`` over one FAISS index: exact cosine search by default.

    Setup:
        ``pip install "langchain-rse[local]"`` (``faiss-cpu``).

    Instantiate:
        .. code-block:: python

            from langchain_rse.embeddings import LocalEmbeddings
            from langchain_rse.integrations.faiss import FaissStore

            store = FaissStore(LocalEmbeddings())

    Args:
        embedding: The embedding model.
        index: An empty FAISS index to fill, with an inner-product or L2 metric (for
            example a trained ``IndexIVFFlat``); default: an ``IndexFlatIP`` made at the
            first add (exact search). Vectors are normalised to unit length either way;
            with L2, a distance ``d`` is reported as the cosine ``1 - d / 2``.
        keep_text: Keep each document's text (``False``: metadata only, the retriever's
            default, whose record store holds the texts; searches return an empty
            ``page_content``).

    Ids are strings; adding an id that is present replaces it. Filters are the retriever's
    language (:mod:`langchain_rse.filters`: ``{"tenant": "acme"}``, ``$in``, ``$and``…)
    or a function of the metadata; a filtered search is exact (FAISS searches only the
    vectors that pass), and a ``doc_id`` filter reads only those documents' positions.
    """

    def __init__(self, embedding: Embeddings, index: Any = None, *, keep_text: bool = True) -> None:
        if index is not None and index.ntotal:
            raise ValueError(
                f"FaissStore needs an empty index (this one holds {index.ntotal} vectors "
                "with no ids or metadata); use FaissStore.load_local for a saved store"
            )
        self.embedding = embedding
        self.index = index
        self.keep_text = keep_text
        self.ids: list[str] = []
        self.metadatas: list[dict[str, Any]] = []
        self.texts: list[str] = []
        self._position: dict[str, int] = {}
        self._by_doc: dict[str, np.ndarray] | None = None  # positions by doc id, lazily
        self._passing = self._new_passing()
        self._half: Any = None  # the half-precision copy (HALF_SCAN_FROM), kept by writes

    @property
    def embeddings(self) -> Embeddings:
        return self.embedding

    def __len__(self) -> int:
        return len(self.ids)

    # ------------------------------------------------------------ writes

    def add_texts(
        self,
        texts: Iterable[str],
        metadatas: list[dict] | None = None,
        *,
        ids: list[str] | None = None,
        **kwargs: object,
    ) -> list[str]:
        """Embed and add ``texts``; returns their ids (new UUIDs where none are given)."""
        texts = list(texts)
        vectors = self.embedding.embed_documents(texts) if texts else []
        return self.add_embeddings(texts, vectors, metadatas, ids=ids)

    def add_embeddings(
        self,
        texts: Sequence[str],
        vectors: Sequence[Sequence[float]] | np.ndarray,
        metadatas: Sequence[dict[str, Any]] | None = None,
        *,
        ids: Sequence[str | None] | None = None,
    ) -> list[str]:
        """Add texts with their vectors (already embedded); returns their ids."""
        import faiss

        n = len(texts)
        metadatas = list(metadatas) if metadatas is not None else [{} for _ in range(n)]
        names = [str(i) if i else str(uuid.uuid4()) for i in (ids or [None] * n)]
        if not len(vectors) == len(metadatas) == len(names) == n:
            raise ValueError(f"{n} texts need as many vectors, metadatas and ids")
        if len(set(names)) < n:
            raise ValueError("the ids of one add must be unique")
        if not n:
            return []
        array = np.array(vectors, dtype=np.float32, ndmin=2)
        if not np.isfinite(array).all():
            raise ValueError("the embedding model returned NaN or infinite values")
        faiss.normalize_L2(array)
        if self.index is None:
            self.index = faiss.IndexFlatIP(array.shape[1])
        if array.shape[1] != self.index.d:
            raise ValueError(
                f"vectors of {array.shape[1]} dimensions for an index of {self.index.d}"
            )
        self.delete([i for i in names if i in self._position])  # an add replaces
        self.index.add(array)
        if self._half is not None:
            self._half.add(array)
        else:
            self._make_half()
        start = len(self.ids)
        self.ids += names
        self.metadatas += [dict(m) for m in metadatas]
        self.texts += list(texts) if self.keep_text else [""] * n
        self._position.update((name, start + i) for i, name in enumerate(names))
        self._forget_positions()
        return names

    def delete(self, ids: Sequence[str] | None = None, **kwargs: object) -> bool | None:
        """Delete these ids (unknown ones are ignored); the later positions move up, in an
        IVF index too (:func:`move_up`)."""
        if ids is None:
            raise ValueError("No ids provided to delete.")
        gone = sorted({self._position[i] for i in ids if i in self._position})
        if not gone:
            return True
        if not removable(self.index):
            raise ValueError(_CANNOT_REMOVE.format(type(self.index).__name__))
        ivf = kept_ids_ivf(self.index)  # (raises, nothing deleted, for lists it cannot move)
        positions = np.asarray(gone, dtype=np.int64)
        if ivf is not None:
            rebuild_direct_map(ivf)  # FAISS's own adds can leave a hashtable map stale
        removed = self.index.remove_ids(positions)
        if removed != len(positions):  # nothing is renumbered: the vectors would answer
            raise RuntimeError(  # for other chunks' metadata
                f"FAISS removed {removed} of {len(positions)} vectors from this "
                f"{type(self.index).__name__}; the store is left as FAISS left it"
            )
        if self._half is not None:
            self._half.remove_ids(positions)
        if ivf is not None:
            move_up(ivf, positions)
        keep = np.ones(len(self.ids), dtype=bool)
        keep[positions] = False
        kept = np.flatnonzero(keep).tolist()
        self.ids = [self.ids[p] for p in kept]
        self.metadatas = [self.metadatas[p] for p in kept]
        self.texts = [self.texts[p] for p in kept]
        self._position = {name: p for p, name in enumerate(self.ids)}
        self._forget_positions()
        return True

    def _forget_positions(self) -> None:
        """After a write: the positions found per doc id and per filter are stale (a new
        cache, so a search still running fills the old one)."""
        self._by_doc = None
        self._passing = self._new_passing()

    # ------------------------------------------------------------ reads

    def get_by_ids(self, ids: Sequence[str], /) -> list[Document]:
        """The documents with these ids, in that order (unknown ids are skipped)."""
        return [self._document(self._position[i]) for i in ids if i in self._position]

    def _document(self, p: int) -> Document:
        return Document(
            page_content=self.texts[p], metadata=dict(self.metadatas[p]), id=self.ids[p]
        )

    def search_vector(
        self, vector: Sequence[float] | np.ndarray, k: int, filter: MetadataFilter = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """The positions of the ``k`` nearest vectors that pass ``filter``, best first, and
        their cosine similarities (FAISS on one OpenMP thread)."""
        import faiss

        none = np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float64)
        if self.index is None or not self.ids or k < 1:
            return none
        query = np.array(vector, dtype=np.float32, ndmin=2)
        faiss.normalize_L2(query)
        allowed = self._allowed(filter)
        params = selector = None
        if allowed is not None:
            if not allowed.size:
                return none
            params = faiss.SearchParameters()
            ivf = faiss.try_extract_index_ivf(self.index)
            if ivf is not None:  # the same lists as an unfiltered search
                params = faiss.SearchParametersIVF()
                params.nprobe = ivf.nprobe
            params.sel = selector = faiss.IDSelectorBatch(allowed)
        with one_thread():
            half = None if params is not None else self._half_scan(query, k)
            if half is not None:
                found, at = half
            else:
                found, at = self.index.search(query, min(k, len(self.ids)), params=params)
        del selector  # (FAISS holds a raw pointer to it: alive until the search returned)
        inside = at[0] >= 0  # -1: fewer hits than asked for
        scores = found[0][inside].astype(np.float64)
        if self.index.metric_type == faiss.METRIC_L2:  # squared distance of unit vectors
            scores = 1.0 - scores / 2.0
        positions = at[0][inside]
        order = np.lexsort((positions, -scores))  # ties: the earlier added first, every time
        return positions[order], scores[order]

    def _make_half(self) -> None:
        """Make the half-precision copy once an ``IndexFlatIP`` holds ``HALF_SCAN_FROM``
        vectors (on a write or a load, not in a search); writes keep it in step after."""
        import faiss

        if type(self.index) is faiss.IndexFlatIP and self.index.ntotal >= HALF_SCAN_FROM:
            half = faiss.IndexScalarQuantizer(
                self.index.d, faiss.ScalarQuantizer.QT_fp16, faiss.METRIC_INNER_PRODUCT
            )
            half.add(self.index.reconstruct_n(0, self.index.ntotal))
            self._half = half

    def _half_scan(self, query: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray] | None:
        """The exact top ``k`` of an ``IndexFlatIP`` of at least ``HALF_SCAN_FROM`` vectors,
        found through the half-precision copy: its best ``2k + 32`` candidates scored
        exactly. None (search the index itself) when there is no copy (another kind of
        index, or a smaller one), or when a vector outside the candidates could still be in
        the top ``k``: its exact score can exceed its copy's by at most ``HALF_ERROR``."""
        if self._half is None:
            return None
        n = self.index.ntotal
        rough, at = self._half.search(query, min(2 * k + 32, n))
        at = at[0][at[0] >= 0]
        exact = self.index.reconstruct_batch(at) @ query[0]
        best = np.lexsort((at, -exact))[:k]
        if len(at) < n and exact[best[-1]] <= rough[0][len(at) - 1] + HALF_ERROR:
            return None
        return exact[best][None, :], at[best][None, :]

    def _allowed(self, filter: MetadataFilter) -> np.ndarray | None:
        """The positions ``filter`` lets through (None: every position)."""
        if filter is None:
            return None
        if isinstance(filter, Mapping):
            filter = parse(filter)
        if isinstance(filter, (Cmp, Bool)):
            docs = doc_ids(filter)
            if docs is not None:  # only these documents' positions are read
                by_doc = self._doc_positions()
                parts = [by_doc[d] for d in sorted(docs) if d in by_doc]
                found = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
                if isinstance(filter, Bool):  # (an $and: its other conditions too)
                    meta, f = self.metadatas, filter
                    keep = (matches(f, meta[p]) for p in found.tolist())
                    found = found[np.fromiter(keep, dtype=bool, count=len(found))]
                return found
            return self._passing(repr(filter), filter)  # (repr: True and 1 differ)
        return self._positions_passing(filter)

    def _new_passing(self) -> Callable[[str, Filter], np.ndarray]:
        """The positions a filter lets through, for the :data:`KEPT_FILTERS` most recently
        used filters (keyed by their ``repr``); a write starts a new cache."""

        @lru_cache(maxsize=KEPT_FILTERS)
        def passing(key: str, filter: Filter) -> np.ndarray:
            found = self._positions_passing(partial(matches, filter))
            found.flags.writeable = False  # (shared by the searches until a write)
            return found

        return passing

    def _positions_passing(self, filter: Callable[[dict[str, Any]], bool]) -> np.ndarray:
        return np.asarray([p for p, m in enumerate(self.metadatas) if filter(m)], dtype=np.int64)

    def _doc_positions(self) -> dict[str, np.ndarray]:
        by_doc = self._by_doc
        if by_doc is None:  # after a write: one pass over the metadata
            found: dict[str, list[int]] = {}
            for p, m in enumerate(self.metadatas):
                if isinstance(m.get("doc_id"), str):
                    found.setdefault(m["doc_id"], []).append(p)
            self._by_doc = by_doc = {d: np.asarray(p, dtype=np.int64) for d, p in found.items()}
        return by_doc

    def ranked(self, query: str, k: int, filter: Filter | None = None) -> list[tuple[str, float]]:
        """The retriever's dense search: the chunk keys of the ``k`` nearest chunks it
        wrote and their cosine similarities, best first (other documents are skipped)."""
        at, scores = self.search_vector(self.embedding.embed_query(query), k, filter)
        hits = []
        for p, score in zip(at.tolist(), scores.tolist()):
            m = self.metadatas[p]
            if "doc_id" in m and "doc_version" in m and "chunk_index" in m:
                key = chunk_key(str(m["doc_id"]), str(m["doc_version"]), int(m["chunk_index"]))
                hits.append((key, score))
        return hits

    def similarity_search_with_score_by_vector(
        self,
        embedding: Sequence[float],
        k: int = 4,
        filter: MetadataFilter = None,
        **kwargs: object,
    ) -> list[tuple[Document, float]]:
        """The ``k`` nearest documents that pass ``filter`` with their cosine similarity."""
        at, scores = self.search_vector(embedding, k, filter)
        return [(self._document(p), s) for p, s in zip(at.tolist(), scores.tolist())]

    def similarity_search_with_score(
        self, query: str, k: int = 4, filter: MetadataFilter = None, **kwargs: object
    ) -> list[tuple[Document, float]]:
        """The ``k`` nearest documents that pass ``filter`` with their cosine similarity."""
        return self.similarity_search_with_score_by_vector(
            self.embedding.embed_query(query), k, filter
        )

    def similarity_search_by_vector(
        self, embedding: list[float], k: int = 4, filter: MetadataFilter = None, **kwargs: object
    ) -> list[Document]:
        return [d for d, _ in self.similarity_search_with_score_by_vector(embedding, k, filter)]

    def similarity_search(
        self, query: str, k: int = 4, filter: MetadataFilter = None, **kwargs: object
    ) -> list[Document]:
        return [d for d, _ in self.similarity_search_with_score(query, k, filter)]

    def _select_relevance_score_fn(self) -> Callable[[float], float]:
        return lambda similarity: similarity  # a cosine similarity is the relevance

    @classmethod
    def from_texts(
        cls,
        texts: list[str],
        embedding: Embeddings,
        metadatas: list[dict] | None = None,
        *,
        ids: list[str] | None = None,
        **kwargs: Any,
    ) -> FaissStore:
        """A new store holding ``texts``."""
        store = cls(embedding, **kwargs)
        store.add_texts(texts, metadatas, ids=ids)
        return store

    # ------------------------------------------------------------ saving

    def to_json(self) -> dict[str, Any]:
        """Ids, metadata and texts, position by position (the index goes to
        :meth:`index_bytes`), in the layout the retriever's index directory uses."""
        import faiss

        l2 = self.index is not None and self.index.metric_type == faiss.METRIC_L2
        return {
            "ids": self.ids,
            "docstore": "in_memory" if self.keep_text else "chunks",
            "documents": [
                {"text": t, "metadata": m} if self.keep_text else {"metadata": m}
                for t, m in zip(self.texts, self.metadatas)
            ],
            "normalize_L2": True,
            "distance_strategy": "EUCLIDEAN_DISTANCE" if l2 else "MAX_INNER_PRODUCT",
        }

    def index_bytes(self) -> memoryview:
        """The index in FAISS's own format (what ``faiss.write_index`` writes), not copied."""
        import faiss

        raw: Any = faiss.serialize_index(self.index)  # a uint8 array
        return memoryview(raw)

    @classmethod
    def from_saved(cls, embedding: Embeddings, data: Mapping[str, Any], index: Any) -> FaissStore:
        """A store from :meth:`to_json`'s dict and its FAISS index."""
        if not data.get("normalize_L2") or len(data["ids"]) != index.ntotal:
            raise ValueError(
                "the saved ids and the FAISS index disagree, or the vectors are not unit length"
            )
        documents = data["documents"]
        store = cls(embedding, keep_text=data.get("docstore") != "chunks")
        store.index = index
        store.ids = [str(i) for i in data["ids"]]
        store.metadatas = [dict(d.get("metadata") or {}) for d in documents]
        store.texts = [(d.get("text") or "") if store.keep_text else "" for d in documents]
        store._position = {name: p for p, name in enumerate(store.ids)}
        store._make_half()
        return store

    def save_local(self, folder: str | os.PathLike[str]) -> None:
        """Write ``index.faiss`` (``faiss.write_index``) and ``index.json`` to ``folder``."""
        import faiss

        path = Path(folder)
        path.mkdir(parents=True, exist_ok=True)
        faiss.write_index(self.index, str(path / "index.faiss"))
        (path / "index.json").write_text(
            json.dumps(self.to_json(), ensure_ascii=False), encoding="utf-8"
        )

    @classmethod
    def load_local(cls, folder: str | os.PathLike[str], embedding: Embeddings) -> FaissStore:
        """A store written by :meth:`save_local`."""
        import faiss

        path = Path(folder)
        index = faiss.read_index(str(path / "index.faiss"))
        data = json.loads((path / "index.json").read_text(encoding="utf-8"))
        return cls.from_saved(embedding, data, index)


# ------------------------------------------------------------ FAISS index helpers

_CANNOT_REMOVE = (
    "this FAISS index ({}) cannot remove vectors (FAISS: remove_ids not implemented), so "
    "documents in it cannot be replaced or deleted: use a flat or an IVF index"
)


def removable(index: Any) -> bool:
    """Whether FAISS can remove vectors from ``index``: a flat (or flat-codes) or IVF
    index can; others (HNSW, NSG, a refine index) are asked by removing nothing."""
    import faiss

    if index is None or isinstance(index, (faiss.IndexFlatCodes, faiss.IndexIVF)):
        return True
    try:
        index.remove_ids(faiss.IDSelectorRange(0, 0))
    except RuntimeError:
        return False
    return True


def kept_ids_ivf(index: Any) -> Any | None:
    """The IVF index in ``index`` (itself, or one it wraps), or None when there is none.

    A flat index moves the vectors after a removed one up a position; an IVF index keeps
    the ids of the vectors that remain, so positions would name the wrong chunks and the
    next add would reuse ids still in use. :func:`move_up` renumbers its lists as a flat
    index would; a ``ValueError`` here for inverted lists it cannot renumber in place (on
    disk) and for an array direct map, which FAISS cannot remove with."""
    import faiss

    ivf: Any = faiss.try_extract_index_ivf(index) if index is not None else None
    if ivf is None:
        return None
    lists = faiss.downcast_InvertedLists(ivf.invlists)
    if not isinstance(lists, faiss.ArrayInvertedLists):
        raise ValueError(
            f"cannot delete from this IVF index: its {type(lists).__name__} inverted lists "
            "cannot be renumbered after a removal (in-memory lists can)"
        )
    if ivf.direct_map.type == faiss.DirectMap.Array:  # type: ignore[attr-defined]
        raise ValueError(
            "cannot delete from an IVF index with an array direct map: FAISS removes "
            "nothing with one (a hashtable direct map, or none, can delete)"
        )
    return ivf


def move_up(ivf: Any, removed: np.ndarray) -> None:
    """After ``ivf.remove_ids(removed)``: each id left in ``ivf``'s lists moves up by the
    number of removed ids below it, as in a flat index, so the ids stay ``0..ntotal-1``
    and FAISS numbers the next vectors it adds after them. A direct map (id to list
    entry), if the index keeps one, is built again."""
    import faiss

    removed = np.sort(np.asarray(removed, dtype=np.int64))
    lists = ivf.invlists
    for list_no in range(ivf.nlist):
        n = lists.list_size(list_no)
        if n:  # the list's ids, in place (in-memory lists: see kept_ids_ivf)
            ids = faiss.rev_swig_ptr(lists.get_ids(list_no), n)
            ids -= np.searchsorted(removed, ids)
    rebuild_direct_map(ivf)


def rebuild_direct_map(ivf: Any) -> None:
    """Build ``ivf``'s direct map (id to list entry), if it keeps one, from its lists
    again. With faiss-cpu 1.15, a hashtable map set on an empty index misses the vectors
    added later, and ``remove_ids`` then removes nothing."""
    import faiss

    kind, none = ivf.direct_map.type, faiss.DirectMap.NoMap  # type: ignore[attr-defined]
    if kind != none:
        ivf.set_direct_map_type(none)
        ivf.set_direct_map_type(kind)


def is_langchain_faiss(vectorstore: object) -> bool:
    """Whether ``vectorstore`` is LangChain's ``FAISS`` (or a subclass), without importing
    ``langchain-community``."""
    return any(
        c.__name__ == "FAISS" and c.__module__.startswith("langchain_community")
        for c in type(vectorstore).__mro__
    )


def check_deletes(vectorstore: Any) -> None:
    """A ``ValueError`` for a FAISS store that cannot delete correctly: an index FAISS
    cannot remove from (see :func:`removable`), and LangChain's own ``FAISS`` over an IVF
    index, whose ``delete`` renumbers its position map but not the index (see
    :func:`kept_ids_ivf`), so a replaced or deleted document would leave hits mapped to
    the wrong chunks (:class:`FaissStore` renumbers both)."""
    if not (isinstance(vectorstore, FaissStore) or is_langchain_faiss(vectorstore)):
        return
    if not removable(vectorstore.index):
        raise ValueError(_CANNOT_REMOVE.format(type(vectorstore.index).__name__))
    if is_langchain_faiss(vectorstore):
        import faiss

        if faiss.try_extract_index_ivf(vectorstore.index) is not None:
            raise ValueError(
                "LangChain's FAISS store cannot delete from an IVF index (its delete "
                "renumbers the position map, not the index, so hits would name the wrong "
                "chunks): use langchain_rse.integrations.faiss.FaissStore(embedding, index=...), "
                "which renumbers both"
            )
