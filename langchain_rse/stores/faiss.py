"""The default local vector store: LangChain's ``FAISS`` with a delete that scales and an
exact search that reads half the bytes.

``FAISS.delete`` inverts the whole position → id map, sorts it and rebuilds it in Python
on every call: at 100k chunks that is about 33 of its 41 ms, FAISS's own ``remove_ids``
the rest. :class:`LocalFAISS` does one pass over the map instead, and a
:class:`~langchain_rse.stores.chunk_docstore.ChunkDocstore` keeps the chunk keys it has
cached for the positions that remain. Over a flat index, :meth:`LocalFAISS.search_vectors`
(the retriever's dense search) scans a half-precision copy of the vectors first and gets
the same hits as ``index.search`` (:mod:`langchain_rse.stores.half_scan`). Everything else
(index, docstore, LangChain's own searches, the map itself) is LangChain's.
"""

from __future__ import annotations

import logging
import threading
import time
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np

from langchain_rse.stores.chunk_docstore import ChunkDocstore, delete_runs
from langchain_rse.stores.half_scan import HalfCopy, exact_search

with warnings.catch_warnings():  # langchain-community warns on import
    warnings.simplefilter("ignore", DeprecationWarning)
    from langchain_community.vectorstores import FAISS

__all__ = ["LocalFAISS", "check_deletes", "kept_ids_ivf", "move_up", "removable"]

logger = logging.getLogger(__name__)


_BUILDING = threading.Lock()
"""Held while a store's half-precision copy is made or extended (by a write's
``prepare_search`` or a search that finds it behind)."""


class LocalFAISS(FAISS):
    """LangChain's ``FAISS`` with a linear-time :meth:`delete` and an exact
    :meth:`search_vectors` that reads a half-precision copy first (see the module
    docstring)."""

    half_precision_scan: bool = True
    """Keep a half-precision copy of a flat index's vectors for :meth:`search_vectors`
    (2 bytes a dimension); False: scan the float32 vectors and drop the copy at the next
    search (set it on a store)."""
    _half: HalfCopy | None = None

    def search_vectors(self, vector: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """``self.index.search(vector, k)`` for one float32 query vector (shape ``(1, d)``):
        the same distances and positions (as FAISS computes them on one OpenMP thread, see
        :mod:`~langchain_rse.stores.half_scan`). Over a flat index (``IndexFlatL2`` or
        ``IndexFlatIP``) it scans a half-precision copy of the vectors and then the exact
        vectors of the candidates only (:func:`~langchain_rse.stores.half_scan.exact_search`);
        the copy follows the store's writes (see :meth:`prepare_search`)."""
        copy = self._synced_half()
        if copy is None:
            return self.index.search(vector, k)  # type: ignore[no-any-return]
        return exact_search(copy, vector, k)

    def prepare_search(self) -> None:
        """Bring what :meth:`search_vectors` and the retriever's dense branch read up to
        date now rather than at the next search: the half-precision copy (made, or extended
        by the vectors added since) and a ``ChunkDocstore``'s key of every position. The
        retriever calls it after its writes and when it loads an index, holding its write
        lock; a search that finds them behind brings them up to date itself."""
        self._synced_half()
        if isinstance(self.docstore, ChunkDocstore):
            self.docstore.position_keys(self.index_to_docstore_id, writing=True)

    def _synced_half(self) -> HalfCopy | None:
        """The half-precision copy of the index as it is now; None for an index other than
        an L2 or inner-product flat one, or with :attr:`half_precision_scan` off."""
        import faiss

        index = self.index
        flat = isinstance(index, faiss.IndexFlat) and index.metric_type in (
            faiss.METRIC_L2,
            faiss.METRIC_INNER_PRODUCT,
        )
        if not (flat and self.half_precision_scan):
            self._half = None  # (a copy made before the flag was cleared)
            return None
        copy = self._half
        if copy is None or not copy.synced(index):
            with _BUILDING:  # one caller makes it; the others wait for it
                copy, start = self._half, time.perf_counter()
                if copy is None or copy.source is not index or copy.n > index.ntotal:
                    copy = HalfCopy.of(index)
                    logger.debug("half-precision copy of %d vectors made in %.2f s", copy.n,
                                 time.perf_counter() - start)  # fmt: skip
                elif copy.n < index.ntotal:  # added since (FAISS appends): copy only those
                    copy = copy.extend()
                self._half = copy
        return copy

    def delete(self, ids: Sequence[str] | None = None, **kwargs: Any) -> bool | None:
        """Delete by id, as ``FAISS.delete`` does: every id must be present (else a
        ``ValueError`` and nothing is deleted); the positions after a deleted one move up,
        in an IVF index too (:func:`move_up`), where FAISS keeps the ids that remain."""
        if ids is None:
            raise ValueError("No ids provided to delete.")
        wanted = set(ids)
        mapping = self.index_to_docstore_id
        positions = np.fromiter(mapping, dtype=np.int64, count=len(mapping))
        names = list(mapping.values())
        if not np.array_equal(positions, np.arange(len(positions))):  # not LangChain-built
            order = np.argsort(positions, kind="stable")
            positions, names = positions[order], [names[i] for i in order.tolist()]
        gone = [i for i, name in enumerate(names) if name in wanted]
        if len(gone) < len(wanted):
            missing = wanted.difference(names[i] for i in gone)
            raise ValueError(
                f"Some specified ids do not exist in the current store. Ids not found: {missing}"
            )
        if not removable(self.index):
            raise ValueError(_CANNOT_REMOVE.format(type(self.index).__name__))
        ivf = kept_ids_ivf(self.index)  # (raises, nothing deleted, for lists it cannot move)
        copy, synced = self._half, self._half is not None and self._half.synced(self.index)
        self.index.remove_ids(positions[gone])
        if ivf is not None:
            move_up(ivf, positions[gone])
        if copy is not None:  # removed from the copy too; a copy that lags is made again
            self._half = copy.remove(positions[gone]) if synced else None
        delete_runs(names, gone)
        remaining = dict(enumerate(names))
        dense = positions.size > 0 and int(positions[-1]) == positions.size - 1  # 0..n-1
        carry: dict[str, Any] = {}
        if isinstance(self.docstore, ChunkDocstore) and dense:  # `gone` are positions then
            carry["moved"] = (mapping, remaining, gone)  # its cached chunk keys follow them
        self.docstore.delete(list(dict.fromkeys(ids)), **carry)
        self.index_to_docstore_id = remaining
        return True


_CANNOT_REMOVE = (
    "this FAISS index ({}) cannot remove vectors (FAISS: remove_ids not implemented), so "
    "documents in it cannot be replaced or deleted: use a flat or an IVF index"
)


def removable(index: Any) -> bool:
    """Whether FAISS can remove vectors from ``index``: a flat (or flat-codes) or IVF
    index can; others (HNSW, NSG, a refine index) are asked by removing nothing."""
    import faiss

    if isinstance(index, (faiss.IndexFlatCodes, faiss.IndexIVF)):
        return True
    try:
        index.remove_ids(faiss.IDSelectorRange(0, 0))
    except RuntimeError:
        return False
    return True


def kept_ids_ivf(index: Any) -> Any | None:
    """The IVF index in ``index`` (itself, or one it wraps), or None when there is none.

    A flat index moves the vectors after a removed one up a position, as LangChain's
    position map expects; an IVF index keeps the ids of the vectors that remain, so the
    map would name the wrong chunk for every position after a removed one, and the next
    add would reuse ids still in use. :func:`move_up` renumbers its lists as a flat index
    would; a ``ValueError`` here for inverted lists it cannot renumber in place (on disk)
    and for an array direct map, which FAISS cannot remove with."""
    import faiss

    ivf: Any = faiss.try_extract_index_ivf(index)
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
    (LangChain's positions) and FAISS numbers the next vectors it adds after them. A
    direct map (id to list entry), if the index keeps one, is built again."""
    import faiss

    removed = np.sort(np.asarray(removed, dtype=np.int64))
    lists = ivf.invlists
    for list_no in range(ivf.nlist):
        n = lists.list_size(list_no)
        if n:  # the list's ids, in place (in-memory lists: see kept_ids_ivf)
            ids = faiss.rev_swig_ptr(lists.get_ids(list_no), n)
            ids -= np.searchsorted(removed, ids)
    kind, none = ivf.direct_map.type, faiss.DirectMap.NoMap  # type: ignore[attr-defined]
    if kind != none:
        ivf.set_direct_map_type(none)
        ivf.set_direct_map_type(kind)


def check_deletes(vectorstore: Any) -> None:
    """A ``ValueError`` for a FAISS store that cannot delete correctly: an index FAISS
    cannot remove from (see :func:`removable`), and LangChain's own ``FAISS`` over an IVF
    index, whose ``delete`` renumbers the position map but not the index (see
    :func:`kept_ids_ivf`), so a replaced or deleted document would leave hits mapped to
    the wrong chunks (:class:`LocalFAISS`, the same constructor, renumbers both)."""
    if not isinstance(vectorstore, FAISS):
        return
    if not removable(vectorstore.index):
        raise ValueError(_CANNOT_REMOVE.format(type(vectorstore.index).__name__))
    if not isinstance(vectorstore, LocalFAISS):
        import faiss

        if faiss.try_extract_index_ivf(vectorstore.index) is not None:
            raise ValueError(
                "LangChain's FAISS store cannot delete from an IVF index (its delete "
                "renumbers the position map, not the index, so hits would name the wrong "
                "chunks): build the store as langchain_rse.stores.faiss.LocalFAISS (same "
                "arguments), which renumbers both"
            )
