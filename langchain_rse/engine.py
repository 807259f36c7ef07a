"""The engine under :class:`~langchain_rse.retriever.RSERetriever`: one :class:`Index`.

An :class:`Index` owns an index's parts — the record store (:class:`RecordStore`), the
write protocol (:class:`~langchain_rse.indexing.writer.Writer`), the in-process BM25 index
and the router's lead index (both kept in step with the records by the writer), the vector
store and an optional lexical store, the search branches built for each setting, and the
locks — and runs every operation on them: add, delete, vacuum, get, save and retrieve
(the query path of :mod:`~langchain_rse.pipeline`, driven by :mod:`~langchain_rse.driver`).
The retriever holds one and passes it typed settings
(:class:`~langchain_rse.pipeline.RetrievalSettings`,
:class:`~langchain_rse.indexing.steps.WriteSettings`,
:class:`~langchain_rse.persistence.SavedSettings`), never itself.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from langchain_core.callbacks import Callbacks
from langchain_core.documents import Document
from langchain_core.stores import BaseStore, InMemoryByteStore
from langchain_core.vectorstores import VectorStore

from langchain_rse import pipeline
from langchain_rse.driver import Handlers, adrive, drive
from langchain_rse.filters import Filter, Translator, matches, parse
from langchain_rse.indexing.records import Pointer
from langchain_rse.indexing.recordstore import ReadWriteLock, RecordStore
from langchain_rse.indexing.steps import WriteSettings, check_writable, index_steps
from langchain_rse.indexing.writer import LocalIndexes, Writer
from langchain_rse.lexical import BM25Index
from langchain_rse.persistence import SavedSettings, SavedStores, save_index
from langchain_rse.routing import DocumentRouter, LeadIndex
from langchain_rse.search import SearchBranches, is_local

__all__ = ["Index", "QueryCall"]


@dataclass(frozen=True)
class QueryCall:
    """One ``invoke``'s own arguments (checked by :func:`~langchain_rse.pipeline.retrieval`)."""

    query: object
    k: object
    mode: object
    queries: object
    filter: object
    max_chars: object
    unknown: Mapping[str, object]


class Index:
    """An index's stores and the operations on them (see the module docstring).

    Args:
        vectorstore: The vector store holding the (enriched) chunk texts.
        record_store: The byte store of records (pointers, versions, bodies); an
            ``InMemoryByteStore`` is this process's own, any other is taken as shared.
        lexical_store: A ``VectorStore`` searched lexically instead of the in-process BM25
            index, or None.
        stemmer: The Snowball stemmer of the in-process BM25 index (None: words as they are).
    """

    def __init__(
        self,
        vectorstore: VectorStore,
        record_store: BaseStore[str, bytes],
        lexical_store: VectorStore | None,
        stemmer: str | None,
    ) -> None:
        self.vectorstore = vectorstore
        self.record_store = record_store
        self.lexical_store = lexical_store
        self.stemmer = stemmer
        self.local = LocalIndexes(BM25Index(stemmer=stemmer))
        """The in-process BM25 and lead indexes, which the writer keeps in step."""
        in_memory = isinstance(record_store, InMemoryByteStore)
        self.records = RecordStore(record_store, in_memory)
        self.writer = Writer(
            self.records,
            vectorstore,
            self.local,
            lexical_store,
            ReadWriteLock(enabled=is_local(vectorstore)),
            shared=not in_memory,
        )
        self._branches: dict[tuple[int, int], SearchBranches] = {}

    @property
    def lexical(self) -> BM25Index:
        """The in-process BM25 index (empty when ``lexical_store`` searches instead)."""
        return self.local.lexical

    def __len__(self) -> int:
        """The number of chunks in the in-process BM25 index."""
        return len(self.lexical)

    # ------------------------------------------------------------ routing and search

    def bind_router(self, router: DocumentRouter | None) -> None:
        """Keep a router's built-in lead index in step with this index's records."""
        leads = router.retriever if router is not None else None
        if not isinstance(leads, LeadIndex):
            leads = None
        else:
            leads.check_before_search(self._sync_local())
            leads.use_stemmer(self.stemmer)  # leads are analyzed as the chunks are
            leads.use_text_counts(self.lexical)
        self.writer.attach_leads(leads)

    def _sync_local(self) -> Callable[[], None] | None:
        """Before an in-process search (BM25, leads): a shared record store's generation check."""
        return self.writer.sync_local if self.writer.shared else None

    def branches(self, fetch_k: int, translator: Translator | None = None) -> SearchBranches:
        """The search branches fetching ``fetch_k`` candidates each (built once per setting)."""
        key = (fetch_k, id(translator))
        branches = self._branches.get(key)
        if branches is None:
            branches = self._branches[key] = SearchBranches(
                self.vectorstore,
                self.lexical,
                self.lexical_store,
                self.writer.vs_lock,
                fetch_k,
                translator,
                self._sync_local(),
            )
        return branches

    def _handlers(
        self, s: pipeline.RetrievalSettings, callbacks: Callbacks, asynchronous: bool
    ) -> Handlers:
        """The handlers of one retrieval (:func:`~langchain_rse.pipeline.handlers`)."""
        return pipeline.handlers(
            self.branches(s.fetch_k, s.filter_translator),
            s.router,
            self.records,
            s.query_expander,
            s.reranker,
            self.writer.swaps,
            callbacks,
            asynchronous,
        )

    def retrieval(self, s: pipeline.RetrievalSettings, call: QueryCall) -> pipeline.Steps:
        """One call's retrieval (:func:`~langchain_rse.pipeline.retrieval`: the call is
        checked at once), for :meth:`run` or :meth:`arun`."""
        return pipeline.retrieval(
            s,
            self.lexical,
            call.query,
            call.k,
            call.mode,
            call.queries,
            call.filter,
            call.max_chars,
            call.unknown,
        )

    def run(
        self, s: pipeline.RetrievalSettings, steps: pipeline.Steps, callbacks: Callbacks
    ) -> list[Document]:
        """The documents a :meth:`retrieval` returns (child runs under ``callbacks``)."""
        return drive(steps, self._handlers(s, callbacks, False), pipeline.THROWN)

    async def arun(
        self, s: pipeline.RetrievalSettings, steps: pipeline.Steps, callbacks: Callbacks
    ) -> list[Document]:
        """Async :meth:`run` (the same generator, awaited)."""
        return await adrive(steps, self._handlers(s, callbacks, True), pipeline.THROWN)

    # ------------------------------------------------------------ writes

    def add(
        self,
        s: WriteSettings[DocumentRouter | None],
        documents: Sequence[Document],
        ids: Sequence[str] | None,
    ) -> list[str]:
        """Index ``documents`` (see :meth:`RSERetriever.add_documents`); their doc ids."""
        with self.writer.lock:
            check_writable(s.filter, self.records, documents, ids)
            return drive(*index_steps(s, self.writer, documents, ids, False))

    async def aadd(
        self,
        s: WriteSettings[DocumentRouter | None],
        documents: Sequence[Document],
        ids: Sequence[str] | None,
    ) -> list[str]:
        """Async :meth:`add`: enrichment natively async, writes in a thread."""
        if s.filter:
            await asyncio.to_thread(check_writable, s.filter, self.records, documents, ids)
        return await adrive(*index_steps(s, self.writer, documents, ids, True))

    def delete(
        self,
        doc_ids: Sequence[str],
        bound: Mapping[str, object] | None,
        router: DocumentRouter | None,
    ) -> list[str]:
        """Remove these documents (only those the ``bound`` filter allows); the ids found."""
        ids = list(dict.fromkeys(doc_ids))
        f = parse(bound) if bound else None
        with self.writer.lock:
            if f is not None:
                held = self.records.pointers(ids)
                ids = [d for d, r in zip(ids, held) if r is not None and _allows(f, d, r.metadata)]
            return self.writer.delete(ids, router)

    def vacuum(self, min_age_s: float, router: DocumentRouter | None) -> int:
        """Remove what killed or losing writers left; the number of versions removed."""
        return self.writer.vacuum(min_age_s, router)

    # ------------------------------------------------------------ reads and saves

    def pointers(self, doc_ids: Sequence[str]) -> list[Pointer | None]:
        """The current pointers of these documents (None for an unknown id)."""
        return self.records.pointers(list(doc_ids))

    def get(self, doc_ids: Sequence[str], bound: Mapping[str, object] | None) -> list[Document]:
        """The indexed source documents with these ids that the ``bound`` filter allows."""
        f = parse(bound) if bound else None
        records = [
            r
            for r in self.records.pointers(list(doc_ids))
            if r is not None and _allows(f, r.doc_id, r.metadata)
        ]
        return [
            Document(page_content=body.text, metadata=dict(r.metadata), id=r.doc_id)
            for r, body in zip(records, self.records.bodies(records))
        ]

    def save(self, settings: SavedSettings, path: str | os.PathLike[str]) -> int:
        """Save this index with ``settings`` to ``path`` (no write runs meanwhile); the
        number of chunks saved."""
        stores = SavedStores(self.vectorstore, self.record_store, self.lexical_store, self.lexical)
        with self.writer.lock:
            return save_index(settings, stores, path)


def _allows(f: Filter | None, doc_id: str, metadata: Mapping[str, object]) -> bool:
    """Whether ``f`` (None: no filter) allows an indexed document."""
    return f is None or matches(f, {**metadata, "doc_id": doc_id})
