"""A FAISS docstore for the retriever's chunks that keeps no chunk text.

LangChain's ``FAISS`` keeps a ``Document`` per vector in its docstore: the enriched chunk
text, its metadata and the pydantic object around them, about 3 KB a chunk. The
retriever's record store already holds every source text with each chunk's offsets and
context, so the default local store keeps only each chunk's metadata values, in one tuple
led by the key names (one key tuple shared by every chunk with the same keys), and builds
a ``Document`` with an empty ``page_content`` when FAISS asks for one. Searching the store
directly returns that metadata (``doc_id``, ``start_index``, ``end_index``…); the text is
``RSERetriever.get([doc_id])`` sliced there. The retriever's dense branch skips the
``Document``\\ s altogether (:meth:`ChunkDocstore.search_index`).
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
from langchain_core.documents import Document
from langchain_core.vectorstores import VectorStore

from langchain_rse.chunking import chunk_key
from langchain_rse.fusion import NO_KEY, Ranked, key_ids

with warnings.catch_warnings():  # langchain-community warns on import
    warnings.simplefilter("ignore", DeprecationWarning)
    from langchain_community.docstore.base import AddableMixin, Docstore

__all__ = ["ChunkDocstore", "delete_runs"]

_KEY_FIELDS = ("doc_id", "doc_version", "chunk_index")
"""The metadata that names a chunk of the retriever (its chunk key)."""

_NO_IDS = np.zeros(0, dtype=np.int64)

HitKeys = tuple["dict[int, str] | None", "list[str | None]", np.ndarray]
"""A position map, the chunk key of each of its positions, and their key ids."""

_ARITHMETIC = (
    VectorStore._euclidean_relevance_score_fn,
    VectorStore._cosine_relevance_score_fn,
)
"""LangChain's relevance functions that are plain arithmetic, so they map an array."""


def delete_runs(items: list[Any], positions: Sequence[int]) -> None:
    """Delete ``items[i]`` for each of the ascending ``positions``, in place: from the end,
    one slice deletion (a C memmove of the tail) per run of consecutive positions."""
    end = len(positions)
    while end:
        start = end - 1
        while start and positions[start - 1] == positions[start] - 1:
            start -= 1
        del items[positions[start] : positions[end - 1] + 1]
        end = start


class ChunkDocstore(Docstore, AddableMixin):
    """Each chunk's metadata by id, without its text (see the module docstring)."""

    def __init__(self, metadata: dict[str, dict[str, Any]] | None = None) -> None:
        self._rows: dict[str, tuple[Any, ...]] = {}  # (key names, *values)
        self._schemas: dict[tuple[str, ...], tuple[str, ...]] = {}
        self._key_at: dict[int, tuple[int, ...]] = {}  # by id() of a key tuple in _schemas
        self._doc_rows: dict[str, np.ndarray] | None = None  # FAISS positions by doc id
        # The position map of a FAISS store, the chunk key of each of its positions and
        # their key ids (see `position_keys`); one attribute, so it is read whole.
        self._hit_keys: HitKeys = (None, [], _NO_IDS)
        for i, m in (metadata or {}).items():
            self._rows[i] = self._row(m)

    def _row(self, metadata: dict[str, Any]) -> tuple[Any, ...]:
        keys = tuple(metadata)
        schema = self._schemas.setdefault(keys, keys)  # one key tuple for every chunk
        return (schema, *(sys.intern(v) if isinstance(v, str) else v for v in metadata.values()))

    def add(self, texts: dict[str, Document]) -> None:
        """Keep the metadata of these documents (their text is dropped); like
        ``InMemoryDocstore``, an id that is already present raises ``ValueError``."""
        overlapping = set(texts).intersection(self._rows)
        if overlapping:
            raise ValueError(f"Tried to add ids that already exist: {overlapping}")
        self._rows.update((i, self._row(doc.metadata)) for i, doc in texts.items())
        self._doc_rows = None

    def delete(
        self,
        ids: list[str],
        moved: tuple[dict[int, str], dict[int, str], Sequence[int]] | None = None,
    ) -> None:
        """Remove these ids (all of them must be present, as in ``InMemoryDocstore``).

        ``moved``, from a store that deletes these ids' vectors: ``(old map, new map,
        removed positions)``, the positions ascending and the later ones moved up, so the
        cached keys of the other chunks follow them (see :meth:`position_keys`) instead of
        being dropped."""
        missing = set(ids).difference(self._rows)
        if missing:
            raise ValueError(f"Tried to delete ids that does not exist: {missing}")
        for i in ids:
            del self._rows[i]
        self._doc_rows = None
        of, keys, key_ids = self._hit_keys
        self._hit_keys = (None, [], _NO_IDS)  # a cached key may name a deleted row
        if moved is not None and moved[0] is of:
            # New lists: the hits of a finished search still read the old ones.
            gone = [p for p in moved[2] if p < len(keys)]  # past the end: never cached
            key_ids = np.delete(key_ids[: len(keys)], gone)
            keys = keys.copy()
            delete_runs(keys, gone)
            self._hit_keys = (moved[1], keys, key_ids)

    def metadata(self, chunk_id: str) -> dict[str, Any] | None:
        """The metadata of one chunk (a new dict), or None when the id is unknown."""
        row = self._rows.get(chunk_id)
        return None if row is None else dict(zip(row[0], row[1:]))

    def search(self, search: str) -> str | Document:
        """The chunk with this id, text empty; a message string when it is unknown."""
        metadata = self.metadata(search)
        if metadata is None:
            return f"ID {search} not found."
        return Document(page_content="", metadata=metadata, id=search)

    def search_index(
        self, vectorstore: Any, query: str, k: int, docs: set[str] | None = None
    ) -> Ranked:
        """``(chunk key, relevance score)`` of the ``k`` nearest chunks in ``vectorstore``
        (a LangChain ``FAISS`` over this docstore), best first, the same hits and scores
        as its ``_similarity_search_with_relevance_scores`` without building a
        ``Document`` per hit (the retriever's dense branch needs only the keys), as a
        :class:`~langchain_rse.fusion.Ranked` branch: positions whose keys are read when
        fusion keeps them. With
        ``docs``, only chunks of those doc ids: FAISS searches just their vectors (an ID
        selector over their positions, indexed once per version of the store)."""
        import faiss

        vector = np.asarray([vectorstore._embed_query(query)], dtype=np.float32)
        if vectorstore._normalize_L2:
            faiss.normalize_L2(vector)
        if docs is None:  # LocalFAISS: the same hits, reading half the bytes
            search = getattr(vectorstore, "search_vectors", vectorstore.index.search)
            scores, indices = search(vector, k)
        else:
            scores, indices = self._search_docs(vectorstore, vector, k, docs)
        relevance = vectorstore._select_relevance_score_fn()
        if relevance in _ARITHMETIC:  # 1 - d / c: one array operation for every hit
            found = relevance(scores[0].astype(np.float64))
        else:
            found = np.asarray([relevance(x) for x in scores[0].tolist()], dtype=np.float64)
        keys, ids = self._positions(vectorstore.index_to_docstore_id)
        # -1: fewer than k hits (FAISS positions end with the map: keys were made for all)
        inside = (indices[0] >= 0) & (indices[0] < len(keys))
        at, found = indices[0][inside], found[inside]
        hit_ids = ids[at]
        ours = hit_ids != NO_KEY  # not: no such row, or a chunk the retriever did not write
        return Ranked(keys, at[ours], hit_ids[ours], found[ours])

    def position_keys(self, mapping: dict[int, str], writing: bool = False) -> list[str | None]:
        """The chunk key of each FAISS position of ``mapping`` (a store's
        ``index_to_docstore_id``; None where no row is stored, "" for a chunk the retriever
        did not write).

        Building a hit's key reads the position map, the chunk's row and its fields, and
        formats the key: slow reads once an exact scan has flushed the CPU caches, where a
        key in this list is one read. Beside it, each key's id (``fusion.key_ids``), which
        the retriever fuses hits by, so that a search returns positions and only the hits
        fusion keeps have their key read. The list is made for a new map and follows it as
        the store changes it: an add appends positions to the map in place, and the next
        call builds the new positions' keys only (the retriever calls it through
        ``LocalFAISS.prepare_search`` after its writes, ``writing``: it extends the list in
        place, no search running; a search that finds keys missing makes a longer copy);
        ``LocalFAISS``'s delete moves the keys up with their positions into a new list (see
        :meth:`delete`); any other new map (such as LangChain's ``FAISS.delete`` builds)
        gets a new list. A published list is only ever appended to, so the hits of a search
        read their keys after it ended, and concurrent searches need no lock (two that both
        extend it build the same keys); writes to a local store never overlap its searches
        (the retriever's lock)."""
        return self._positions(mapping, writing)[0]

    def _positions(self, mapping: dict[int, str], writing: bool = False
                   ) -> tuple[list[str | None], np.ndarray]:  # fmt: skip
        """:meth:`position_keys` and their key ids (``ids[p]`` for ``p < len(keys)``)."""
        of, keys, ids = self._hit_keys
        start = len(keys) if of is mapping else 0
        if start < len(mapping):  # a new map, or positions appended to it
            new = [self._key_of(mapping.get(p)) for p in range(start, len(mapping))]
            if start and writing:
                keys.extend(new)
                if len(ids) < len(keys):  # room for a quarter more (amortised appends)
                    ids = np.concatenate([ids[:start], np.empty(len(keys) // 4 + len(new),
                                                                dtype=np.int64)])  # fmt: skip
                ids[start : len(keys)] = key_ids(new)
            else:
                keys = keys + new if start else new
                ids = np.concatenate([ids[:start], key_ids(new)])
            self._hit_keys = (mapping, keys, ids)
        elif of is not mapping:  # a new, empty map
            keys, ids = [], _NO_IDS
            self._hit_keys = (mapping, keys, ids)
        return keys, ids

    def _key_of(self, docstore_id: str | None) -> str | None:
        """The chunk key of the row stored under ``docstore_id``: "" for a chunk the
        retriever did not write, None when there is no such row."""
        row = self._rows.get(docstore_id) if docstore_id is not None else None
        if row is None:
            return None
        at = self._key_positions(row[0])
        return chunk_key(row[at[0]], row[at[1]], int(row[at[2]])) if at else ""

    def _search_docs(
        self, vectorstore: Any, vector: np.ndarray, k: int, docs: set[str]
    ) -> tuple[np.ndarray, np.ndarray]:
        """FAISS's search over the positions of ``docs``' chunks only."""
        import faiss

        by_doc = self._doc_rows
        if by_doc is None:  # after a write: one pass over the position map
            found: dict[str, list[int]] = {}
            rows, at = self._rows, _KEY_FIELDS.index("doc_id")
            for position, name in vectorstore.index_to_docstore_id.items():
                row = rows.get(name)
                where = None if row is None else self._key_positions(row[0])
                if where:
                    found.setdefault(row[where[at]], []).append(position)  # type: ignore[index]
            by_doc = {d: np.asarray(p, dtype=np.int64) for d, p in found.items()}
            self._doc_rows = by_doc  # whole, so a concurrent reader never sees a part
        parts = [by_doc[d] for d in sorted(docs) if d in by_doc]
        if not parts:
            return np.zeros((1, 0), dtype=np.float32), np.zeros((1, 0), dtype=np.int64)
        wanted = np.concatenate(parts)
        selector = faiss.IDSelectorBatch(wanted)
        index = vectorstore.index
        params = faiss.SearchParameters()
        if isinstance(index, faiss.IndexIVF):  # the same lists as an unrestricted search
            params = faiss.SearchParametersIVF()
            params.nprobe = index.nprobe
        params.sel = selector  # kept alive by the local name until the search returns
        return index.search(vector, min(k, len(wanted)), params=params)  # type: ignore[no-any-return]

    def _key_positions(self, schema: tuple[str, ...]) -> tuple[int, ...]:
        """Where a row with these key names holds the chunk key's fields (``()``: not all);
        found once per key tuple (they are shared: looked up by identity)."""
        at = self._key_at.get(id(schema))
        if at is None:
            at = tuple(schema.index(f) + 1 for f in _KEY_FIELDS if f in schema)
            self._key_at[id(schema)] = at = at if len(at) == len(_KEY_FIELDS) else ()
        return at

    def items(self) -> Iterator[tuple[str, dict[str, Any]]]:
        """``(id, metadata)`` of every chunk (for saving)."""
        return ((i, dict(zip(row[0], row[1:]))) for i, row in self._rows.items())

    def __len__(self) -> int:
        return len(self._rows)

    def __repr__(self) -> str:
        return f"ChunkDocstore({len(self)} chunks)"
