"""Document-level retrieval: one short *lead* per indexed document (its title and opening),
searched with BM25, so that a query naming its document can favour that document's chunks.

Most retrieval errors on long-document corpora are chunks from the wrong document: a
clause of the right kind from another contract (Reuter et al. 2025, LegalBench-RAG). A
document's lead — for a contract its name, parties and date; for a report its title and
abstract — is what such a query matches. :class:`LeadIndex` is the retriever's built-in
document index: the retriever keeps it in step with its chunks and the query path weights
the chunks of the best-matching document (see :class:`~langchain_rse.routing.DocumentRouter`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from langchain_core.callbacks import CallbackManagerForRetrieverRun
from langchain_core.documents import Document
from langchain_core.indexing import DeleteResponse, DocumentIndex, UpsertResponse
from pydantic import PrivateAttr

from langchain_rse.bodies import compressed, decompressed
from langchain_rse.chunking import chunk_key, doc_id_for, doc_of, document_leads
from langchain_rse.filters import Filter, matches, parse
from langchain_rse.lexical import BM25Index, group_of
from langchain_rse.tokenizer import tokenize

__all__ = ["LeadIndex"]


class LeadIndex(DocumentIndex):
    """An in-process BM25 index of document leads, as a LangChain ``DocumentIndex``.

    It holds one short text per document (:func:`~langchain_rse.chunking.document_leads`:
    ``metadata["title"]`` and the first 2,000 characters), so it stays small next to the chunk
    index (one entry per document, not per chunk) and is rebuilt from the record store
    when another worker changed it. Results carry ``metadata["doc_id"]`` and
    ``metadata["bm25_score"]``, best first. A search can be given a metadata filter
    (:mod:`langchain_rse.filters`; ``invoke(query, filter=...)``): it is checked against
    each lead's metadata (the document's scalar metadata) before the top ``k`` is cut, so
    documents it rejects neither appear nor push others out.

    Usage:
        .. code-block:: python

            leads = LeadIndex(k=3)
            leads.add_sources(docs)            # whole source documents
            leads.invoke("the distribution agreement between Acme and Beta")
    """

    k: int = 3
    """Documents returned per query."""

    _bm25: BM25Index = PrivateAttr(default_factory=BM25Index)
    _leads: dict[str, tuple[bytes, dict[str, Any]]] = PrivateAttr(default_factory=dict)
    """Per doc id, the lead's text (compressed: only ``get`` and ``invoke`` read
    it) and metadata. For documents shorter than a lead, the lead is the whole text."""
    _lock: threading.Lock = PrivateAttr(default_factory=threading.Lock)
    _before_search: Callable[[], None] | None = PrivateAttr(default=None)
    """Set by the owning retriever: its shared index's generation check."""
    _term_weights: Callable[[list[str]], dict[str, float]] | None = PrivateAttr(default=None)
    """Set by the owning retriever: the IDF of terms over its chunks."""

    def __len__(self) -> int:
        return len(self._leads)

    def __repr__(self) -> str:
        return f"LeadIndex(k={self.k}, documents={len(self)})"

    @property
    def stemmer(self) -> str | None:
        """The Snowball stemmer of the leads' BM25 terms (``"english"`` unless set)."""
        return self._bm25.stemmer

    def use_stemmer(self, stemmer: str | None) -> None:
        """Analyze the leads with ``stemmer`` from now on (the retriever that owns this
        index passes its ``lexical_stemmer``); the leads held are indexed again."""
        with self._lock:
            if stemmer == self._bm25.stemmer:
                return
            bm25 = BM25Index(stemmer=stemmer)
            keys = [_key(i) for i in self._leads]
            bm25.add(keys, [_text(packed) for packed, _ in self._leads.values()],
                     {group_of(k): m for k, (_, m) in zip(keys, self._leads.values())})  # fmt: skip
            self._bm25 = bm25

    def add_sources(self, sources: Iterable[Document]) -> None:
        """Index (or replace) the leads of these source documents."""
        self.upsert(document_leads(sources))

    def upsert(self, items: Sequence[Document], /, **kwargs: Any) -> UpsertResponse:
        """Add or replace lead documents (their ids are doc ids; their metadata is what a
        search's filter is checked against)."""
        ids = [doc_id_for(d) for d in items]
        metas = [dict(d.metadata) for d in items]
        keys = [_key(i) for i in ids]
        with self._lock:
            self._leads.update((i, (_packed(d.page_content), m))
                               for i, d, m in zip(ids, items, metas))  # fmt: skip
            self._bm25.add(keys, [d.page_content for d in items],
                           {group_of(k): m for k, m in zip(keys, metas)})  # fmt: skip
        return UpsertResponse(succeeded=ids, failed=[])

    def delete(self, ids: list[str] | None = None, **kwargs: Any) -> DeleteResponse:
        """Remove the leads of these doc ids (unknown ids are ignored)."""
        if ids is None:
            raise ValueError("delete needs a list of document ids")
        with self._lock:
            found = [i for i in ids if self._leads.pop(i, None) is not None]
            self._bm25.delete([_key(i) for i in found])
        return DeleteResponse(num_deleted=len(found), succeeded=found, failed=[])

    def get(self, ids: Sequence[str], /, **kwargs: Any) -> list[Document]:
        """The leads of these doc ids (unknown ids are skipped)."""
        return [lead for i in ids if (lead := self._lead(i)) is not None]

    def _lead(self, doc_id: str, **extra: Any) -> Document | None:
        """The lead of ``doc_id`` as a new ``Document`` (``extra`` added to its metadata)."""
        found = self._leads.get(doc_id)
        if found is None:
            return None
        return Document(page_content=_text(found[0]), id=doc_id, metadata={**found[1], **extra})

    def _get_relevant_documents(
        self,
        query: str,
        *,
        run_manager: CallbackManagerForRetrieverRun,
        filter: dict[str, Any] | None = None,
    ) -> list[Document]:
        return self.search(query, parse(filter) if filter else None)

    def hits(self, query: str, filter: Filter | None = None) -> list[tuple[str, float]]:
        """``(doc id, BM25 score)`` of the ``k`` best leads for ``query`` that ``filter``
        (parsed, see :func:`~langchain_rse.filters.parse`) allows, best first."""
        before, leads = self._before_search, self._leads  # private attributes: read once
        if before is not None:
            before()
        allowed = None if filter is None else (lambda metadata: matches(filter, metadata))
        found = ((doc_of(key), score) for key, score in self._bm25.search(query, self.k, allowed))
        return [(d, score) for d, score in found if d in leads]

    def naming_share(self, text: str, doc_id: str) -> float:
        """How much of ``text`` the lead of ``doc_id`` holds: the share of the IDF weight of
        ``text``'s terms that its lead contains, from 0 to 1. The weights are IDFs over the
        owning retriever's chunks (over the leads for a lead index on its own); terms the
        index does not hold weigh nothing. A query that names a document (its title, its
        parties) scores high; one that shares a word with its title, among words the
        documents use elsewhere, scores low."""
        found = self._leads.get(doc_id)
        terms = tokenize(text, self._bm25.stemmer)
        if found is None or not terms:
            return 0.0
        held = set(tokenize(_text(found[0]), self._bm25.stemmer))
        weights = (self._term_weights or self._bm25.idf)(terms)
        total = sum(weights.values())
        return sum(w for t, w in weights.items() if t in held) / total if total else 0.0

    def search(self, query: str, filter: Filter | None = None) -> list[Document]:
        """The ``k`` best leads for ``query`` that ``filter`` allows (what ``invoke``
        returns, without a run)."""
        hits = self.hits(query, filter)
        leads = (self._lead(doc_id, bm25_score=score) for doc_id, score in hits)
        return [lead for lead in leads if lead is not None]  # None: deleted since the search


def _key(doc_id: str) -> str:
    """A lead's key in the BM25 index: a chunk key, so that its group (its metadata, which
    a filter sees) maps back to exactly its doc id, whatever characters that holds."""
    return chunk_key(doc_id, "lead", 0)


def _packed(text: str) -> bytes:
    """A lead's text as kept: UTF-8 (``surrogatepass``: any str round-trips), compressed."""
    return compressed(text.encode("utf-8", "surrogatepass"))


def _text(packed: bytes) -> str:
    """The inverse of :func:`_packed`."""
    return decompressed(packed).decode("utf-8", "surrogatepass")
