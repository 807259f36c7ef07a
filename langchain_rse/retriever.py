"""``RSERetriever``: its fields and the checks of its settings, add/delete/get/save/load and
invoke. A write runs :mod:`~langchain_rse.indexing.writer` (documents checked and split by
:mod:`~langchain_rse.indexing.chunking`, enriched by :mod:`~langchain_rse.enrichment`); a
query runs the generator of :mod:`~langchain_rse.pipeline` (see ``docs/architecture.md``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import warnings
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Annotated, Any, Literal

from langchain_core.callbacks import (
    AsyncCallbackManagerForRetrieverRun,
    CallbackManagerForRetrieverRun,
)
from langchain_core.documents import Document
from langchain_core.embeddings import Embeddings
from langchain_core.indexing import DeleteResponse, DocumentIndex, UpsertResponse
from langchain_core.retrievers import LangSmithRetrieverParams
from langchain_core.stores import BaseStore, InMemoryByteStore
from langchain_core.vectorstores import VectorStore
from langchain_text_splitters import TextSplitter
from pydantic import (
    AfterValidator,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    model_validator,
)

from langchain_rse import pipeline
from langchain_rse.enrichment import BaseEnricher, HeaderEnricher
from langchain_rse.explain import Explanation, build_explanation
from langchain_rse.filters import Filter, check_filter, matches, parse
from langchain_rse.indexing.chunking import DEFAULT_CHUNK_SIZE, doc_id_for, make_splitter
from langchain_rse.indexing.steps import index_steps
from langchain_rse.indexing.store import ReadWriteLock, RecordStore
from langchain_rse.indexing.writer import Writer
from langchain_rse.lexical import BM25Index
from langchain_rse.lexical.tokenizer import DEFAULT_STEMMER, check_stemmer
from langchain_rse.persistence import (
    default_vectorstore,
    load_index,
    overlap_settings,
    save_index,
)
from langchain_rse.pipeline import adrive, check_k, check_max_chars, drive, tracing
from langchain_rse.rerank import BaseReranker, as_reranker
from langchain_rse.routing import DocumentRouter, LeadIndex, as_router
from langchain_rse.search import SearchBranches, is_local, ls_params
from langchain_rse.segments import RSEParams, get_preset, preset_for_chunk_size

if TYPE_CHECKING:
    from langchain_core.tools import BaseTool

__all__ = ["RSERetriever"]

logger = logging.getLogger(__name__)


_POSITIVE = ("fetch_k", "max_document_chars")


def check_settings(r: Any) -> None:
    """Raise ``ValueError`` for a retriever configuration that could not run (checked at
    construction and on every assignment, so a bad setting fails where it is made)."""
    check_k(r.k)
    check_max_chars(r.max_chars)
    for name in _POSITIVE:
        if getattr(r, name) < 1:
            raise ValueError(f"{name} must be >= 1, got {getattr(r, name)}")
    if r.splitter is None:
        make_splitter(r.chunk_size)  # validates the size
    w = r.weights
    if len(w) != 2 or min(w) < 0 or max(w) <= 0:
        raise ValueError(f"weights must be two non-negative numbers, not both 0, got {w}")
    if isinstance(r.rse_params, str):
        get_preset(r.rse_params)


def check_expander(value: Any) -> Any:
    """A query expander needs ``expand`` and ``aexpand``."""
    if value is not None and not (hasattr(value, "expand") and hasattr(value, "aexpand")):
        raise TypeError(
            "query_expander must be a QueryExpander (with expand and aexpand), got "
            + type(value).__name__
        )
    return value


def check_delete_ids(ids: Any) -> list[str]:
    """The document ids of a ``delete`` call: a list, never None (everything) or a string."""
    if ids is None:
        raise ValueError(
            "delete needs a list of document ids (deleting everything is not "
            "supported; create a new retriever instead)"
        )
    if isinstance(ids, str):
        raise TypeError("delete expects a list of document ids, not a string")
    return list(ids)


class RSERetriever(DocumentIndex):
    """Hybrid (BM25 + vector) retriever that returns Relevant Segment Extraction segments.

    Documents are split into small chunks that remember their character offsets,
    optionally enriched with situating context, and indexed in any LangChain
    ``VectorStore`` and an in-process BM25 index. A query runs both searches, fuses
    them with weighted reciprocal rank fusion, optionally reranks, and returns the
    best contiguous *segments* of the source documents: each result's
    ``page_content`` is exactly ``source_text[start_index:end_index]``.

    Setup:
        .. code-block:: bash

            pip install -U langchain-rse            # core
            pip install -U "langchain-rse[local]"   # bundled offline embedding model

    Key init args:
        vectorstore: VectorStore
            Any LangChain vector store; chunks are written to it with their metadata.
        k: int
            Maximum number of segments (or chunks) returned.
        mode: "segments" | "chunks"
            Return RSE segments (default) or the plain top-k chunks.
        enricher: BaseEnricher
            Index-time context for each chunk (offline ``HeaderEnricher`` by default).
        reranker: BaseReranker | BaseDocumentCompressor | None
            Optional reranker; its calibrated scores become chunk relevance.
        rse_params: RSEParams | str | None
            RSE parameters or a preset's name (see ``langchain_rse.segments.PRESETS``); by
            default the preset tuned for ``chunk_size``.
        router: DocumentRouter | None
            Optional document routing (see :class:`~langchain_rse.routing.DocumentRouter`).

    Instantiate:
        .. code-block:: python

            from langchain_core.vectorstores import InMemoryVectorStore
            from langchain_rse import RSERetriever

            retriever = RSERetriever(vectorstore=InMemoryVectorStore(embeddings), k=3)
            retriever.add_documents(docs)
            # or: RSERetriever.from_documents(docs, embedding=embeddings)

    Usage:
        .. code-block:: python

            for seg in retriever.invoke("termination for convenience", k=2):
                meta = seg.metadata
                print(meta["doc_id"], meta["start_index"], meta["end_index"], meta["score"])

    Use within a chain:
        .. code-block:: python

            from langchain_core.prompts import ChatPromptTemplate
            from langchain_core.runnables import RunnablePassthrough

            prompt = ChatPromptTemplate.from_template("Context: {context}\\nQuestion: {question}")
            context = retriever | (lambda docs: "\\n\\n".join(d.page_content for d in docs))
            chain = {"context": context, "question": RunnablePassthrough()} | prompt | llm
            chain.invoke("Can either party terminate for convenience?")
    """

    model_config = ConfigDict(
        arbitrary_types_allowed=True, extra="forbid", validate_assignment=True
    )

    vectorstore: VectorStore = Field(frozen=True)
    """The vector store holding the (enriched) chunk texts."""
    k: int = 4
    """Maximum number of results (segments or chunks)."""
    mode: Literal["segments", "chunks"] = "segments"
    """``"segments"``: RSE segments; ``"chunks"``: the top-k chunks (same metadata)."""
    docstore: BaseStore[str, bytes] = Field(default_factory=InMemoryByteStore, frozen=True)
    """Record store: source texts, offsets and contexts as JSON, one record per document."""
    chunk_size: int = DEFAULT_CHUNK_SIZE
    """Chunk size in characters (ignored when ``splitter`` is given)."""
    splitter: TextSplitter | None = None
    """A custom LangChain text splitter; its chunks are located by exact offsets. No overlap
    is needed (segments restore context); for one, pass
    ``make_splitter(chunk_size, chunk_overlap)`` (``langchain_rse.indexing.chunking``)."""
    enricher: BaseEnricher = Field(default_factory=HeaderEnricher)
    """Writes each chunk's situating context at index time (offline title/section header
    by default; ``ContextualEnricher`` for LLM-written context; ``NoEnricher`` for none)."""
    reranker: Annotated[BaseReranker | None, BeforeValidator(as_reranker)] = None
    """Reranks fused candidates; a ``BaseDocumentCompressor`` is wrapped automatically."""
    lexical_store: VectorStore | None = Field(default=None, frozen=True)
    """An external lexical index used instead of the in-process BM25 index, for corpora
    beyond one machine: any ``VectorStore`` whose search is lexical, e.g.
    ``ElasticsearchStore(strategy=BM25Strategy())``. Chunks are written to it too."""
    lexical_stemmer: Annotated[str | None, AfterValidator(check_stemmer)] = Field(
        default=DEFAULT_STEMMER, frozen=True
    )
    """Snowball stemmer of the in-process BM25 index (``"english"``, ``"german"``, ... as
    in ``Stemmer.algorithms()``), or ``None`` to match words as they are. An external
    ``lexical_store`` analyzes text itself."""
    max_chars: int | None = None
    """The context budget: the most characters of text one call returns, in all (an
    ``invoke(query, max_chars=...)`` argument too). Segments fill it best first and never
    exceed it; ``k`` still bounds how many come back. ``None``: the preset's chunk budget."""
    fetch_k: int = 50
    """Candidates fetched from each branch (dense and lexical); the best 50 fused ones
    (:data:`~langchain_rse.pipeline.CANDIDATE_POOL`) go on to reranking and RSE."""
    weights: tuple[float, float] = (2.0, 1.0)
    """Weights of the (dense, lexical) branches in reciprocal rank fusion: dense 2/3, BM25
    1/3, chosen on CUAD with BM25 over word stems and focus (Anthropic's cookbook uses
    0.8 / 0.2). A query that quotes code gives BM25 the dense weight
    (:data:`~langchain_rse.pipeline.CODE_WEIGHTS_EQUAL`)."""
    rse_params: RSEParams | str | None = None
    """RSE parameters: an ``RSEParams``, or the name of a preset in
    ``langchain_rse.segments.PRESETS`` (``"reranked"`` with a reranker). ``None`` (the
    default): the preset tuned for the chunk size, ``"default"`` below 600 characters (and
    with a ``splitter``), ``"long_chunks"`` from 600 on."""
    router: Annotated[DocumentRouter | None, BeforeValidator(as_router)] = Field(
        default_factory=DocumentRouter.leads
    )
    """Document-aware retrieval: a :class:`~langchain_rse.routing.DocumentRouter` (or a
    bare retriever, wrapped in one with its defaults) picks the document a query is about,
    and its chunks are favoured (``boost``) when the unrouted search agrees. The default
    searches the retriever's own :class:`~langchain_rse.routing.LeadIndex` (each
    document's title and opening, kept in step with the index); ``None`` turns it off."""
    filter: Annotated[dict[str, Any] | None, AfterValidator(check_filter)] = None
    """A metadata filter every result must pass (a retriever bound to one tenant), in the
    language of :mod:`langchain_rse.filters`: equality, ``$eq``, ``$ne``, ``$in``, ``$nin``,
    ``$gt``/``$gte``/``$lt``/``$lte``, ``$and``, ``$or``. Pushed down into both searches and
    the document route, and checked again on every candidate; ``invoke(query, filter=...)``
    narrows it further. Nothing of a document it rejects reaches a callback handler or
    changes a result. It binds the other methods too: :meth:`get` returns, and
    :meth:`delete` removes, only documents it allows; :meth:`add_documents` refuses a
    document it rejects, and one whose id is taken by a document it rejects. Index-wide
    maintenance (:meth:`vacuum`, :meth:`save`) is not filtered. Documents are compared by
    their metadata with ``doc_id`` added, as the chunks are. (Lexical scores use the
    statistics of the whole index; one index per tenant keeps even those apart.)"""
    filter_translator: Callable[[Filter], dict[str, Any]] | None = None
    """For a vector or lexical store :mod:`langchain_rse.filters` cannot translate for: a
    function from the parsed filter to that store's search keyword arguments (e.g.
    ``lambda f: {"filter": to_dict(f)}``)."""
    query_expander: Annotated[Any, AfterValidator(check_expander)] = None
    """Optional ``QueryExpander``: an LLM rewrites the query into several search queries."""
    max_document_chars: int = 20_000_000
    """Longer documents are rejected with a ``ValueError`` before anything is written."""
    show_progress: bool | None = None
    """Progress while indexing (enrichment, then embedding + writing, in chunks/s with an
    ETA): ``True`` a tqdm bar, ``False`` nothing, ``None`` a bar on a terminal and else a
    plain line on stderr every 10 seconds, and one after the first batch with the expected
    time when that is 30 s or more (on the logger ``langchain_rse.progress``, level INFO,
    instead when the application's logging shows it); no logging set-up is needed."""

    _lexical: BM25Index = PrivateAttr()
    _records: RecordStore = PrivateAttr()
    _writer: Writer = PrivateAttr()
    _branches: dict[tuple[int, ...], SearchBranches] = PrivateAttr(default_factory=dict)

    # ------------------------------------------------------------------ setup

    @model_validator(mode="before")
    @classmethod
    def _renamed(cls, data: Any) -> Any:
        """Fields before 0.3: ``preset=`` (``rse_params``) and ``chunk_overlap=`` (a
        ``splitter``) are deprecated aliases; ``strict_rerank`` moved to the reranker."""
        if isinstance(data, dict) and "strict_rerank" in data:
            raise ValueError(
                "strict_rerank is no longer a retriever setting (since 0.3.0): pass "
                "strict=True to the reranker, e.g. CohereReranker(strict=True)"
            )
        if isinstance(data, dict) and "chunk_overlap" in data:
            warnings.warn("RSERetriever(chunk_overlap=...) is deprecated; pass "
                          "splitter=make_splitter(chunk_size, chunk_overlap)",
                          DeprecationWarning, stacklevel=4)  # fmt: skip
            data = dict(data)
            if overlap := data.pop("chunk_overlap"):
                data = overlap_settings(data, overlap)
        if isinstance(data, dict) and "preset" in data:
            warnings.warn("RSERetriever(preset=...) is deprecated; pass the preset's name as "
                          "rse_params=...", DeprecationWarning, stacklevel=4)  # fmt: skip
            data = dict(data)
            preset = data.pop("preset")
            if preset is not None and not isinstance(data.get("rse_params"), RSEParams):
                data["rse_params"] = preset  # explicit RSEParams win, as they did
        return data

    @model_validator(mode="after")
    def _check(self) -> RSERetriever:
        check_settings(self)
        return self

    def __setattr__(self, name: str, value: Any) -> None:
        # validate_assignment stores the value before the model validator runs: put the
        # old one back when the new one is rejected, so a failed assignment changes nothing.
        old = self.__dict__.get(name)
        try:
            super().__setattr__(name, value)
        except ValueError:
            if name in type(self).model_fields:
                self.__dict__[name] = old
            raise
        if name == "router":
            self._bind_router()

    def model_post_init(self, context: Any, /) -> None:
        self._lexical = BM25Index(stemmer=self.lexical_stemmer)
        self._records = RecordStore(self.docstore, isinstance(self.docstore, InMemoryByteStore))
        lock = ReadWriteLock(enabled=is_local(self.vectorstore))
        self._writer = Writer(self._records, self.vectorstore, self._lexical,
                              self.lexical_store, lock,
                              shared=not isinstance(self.docstore, InMemoryByteStore))  # fmt: skip
        self._bind_router()

    def _bind_router(self) -> None:
        """Keep a built-in lead index in step with this retriever's stores."""
        leads = self.router.retriever if self.router is not None else None
        if not isinstance(leads, LeadIndex):
            leads = None
        else:
            leads._before_search = self._sync_local()
            leads._term_weights = None if self.lexical_store is not None else self._lexical.idf
            leads.use_stemmer(self.lexical_stemmer)  # leads are analyzed as the chunks are
        self._writer.attach_leads(leads)

    def _sync_local(self) -> Callable[[], None] | None:
        """What runs before a search of an in-process index (BM25, leads): the shared record
        store's generation check; nothing when the record store is this process's own."""
        return self._writer.sync_local if self._writer.shared else None

    def _search(self) -> SearchBranches:
        """The search branches for the current settings (built once per setting)."""
        k = self.fetch_k if self.router is None else max(self.fetch_k, self.router.fetch_k)
        translator = self.filter_translator
        key = (id(self.vectorstore), id(self.lexical_store), k, id(translator))
        branches = self._branches.get(key)
        if branches is None:
            branches = self._branches[key] = SearchBranches(
                self.vectorstore, self._lexical, self.lexical_store, self._writer.vs_lock, k,
                translator, self._sync_local())  # fmt: skip
        return branches

    @property
    def params(self) -> RSEParams:
        """The RSE parameters in force."""
        if isinstance(self.rse_params, RSEParams):
            return self.rse_params
        return get_preset(self.preset_name)

    @property
    def preset_name(self) -> str:
        """The preset named by ``rse_params``, or the one tuned for ``chunk_size``."""
        if isinstance(self.rse_params, str):
            return self.rse_params
        return preset_for_chunk_size(self.chunk_size if self.splitter is None else 0)

    def __repr__(self) -> str:
        params = self.rse_params if isinstance(self.rse_params, RSEParams) else self.preset_name
        return (
            f"RSERetriever(vectorstore={type(self.vectorstore).__name__}, k={self.k}, "
            f"mode={self.mode!r}, chunks={len(self._lexical)}, enricher={self.enricher!r}, "
            f"reranker={type(self.reranker).__name__ if self.reranker else None}, "
            f"rse_params={params!r})"
        )

    __str__ = __repr__

    def _get_ls_params(self, **kwargs: Any) -> LangSmithRetrieverParams:
        return {**super()._get_ls_params(**kwargs), **ls_params(self.vectorstore)}  # type: ignore[typeddict-item]

    @classmethod
    def from_documents(
        cls,
        documents: Iterable[Document],
        embedding: Embeddings | None = None,
        *,
        vectorstore: VectorStore | None = None,
        **kwargs: Any,
    ) -> RSERetriever:
        """Build a retriever over ``documents`` with a local vector store.

        The store is FAISS (exact cosine search) when ``faiss-cpu`` is installed, else
        ``InMemoryVectorStore``; both save without pickle. Without ``embedding`` the
        bundled offline model (``LocalEmbeddings``) is used.
        """
        if vectorstore is None:
            vectorstore = default_vectorstore(embedding)
        retriever = cls(vectorstore=vectorstore, **kwargs)
        retriever.add_documents(list(documents))
        return retriever

    # ------------------------------------------------------------------ indexing

    def add_documents(
        self, documents: Sequence[Document], ids: Sequence[str] | None = None, **kwargs: Any
    ) -> list[str]:
        """Index long source documents; returns their doc ids.

        A document whose id is already indexed is replaced everywhere (an unchanged
        one is skipped); empty documents are skipped with a warning (and an indexed
        version of them removed). All documents are validated and split first; then, a
        group of about ``WRITE_GROUP_CHUNKS`` chunks at a time, enriched and written to
        the vector store (``INDEX_BATCH_SIZE`` chunks per call), the lexical index and the
        record store — so contexts, index texts and vectors are held for one group only.
        Progress is reported per stage (see ``show_progress``).

        With a bound :attr:`filter`, a ``ValueError`` is raised before anything is written
        when a document does not pass it, or when its id is indexed for a document that
        does not (another tenant's).
        """
        with self._writer.lock:
            self._check_writable(documents, ids)
            return drive(*index_steps(self, documents, ids, False))  # type: ignore[no-any-return]

    async def aadd_documents(
        self, documents: Sequence[Document], ids: Sequence[str] | None = None, **kwargs: Any
    ) -> list[str]:
        """Async :meth:`add_documents`: enrichment runs natively async; writes in a thread
        (under the same lock as the sync path, re-checking what another writer wrote)."""
        if self.filter:
            await asyncio.to_thread(self._check_writable, documents, ids)
        return await adrive(*index_steps(self, documents, ids, True))  # type: ignore[no-any-return]

    def _check_writable(self, documents: Sequence[Document], ids: Sequence[str] | None) -> None:
        """With a bound :attr:`filter`: a ``ValueError`` naming the first document it
        rejects, or whose id an indexed document it rejects holds (nothing is written)."""
        f = parse(self.filter) if self.filter else None
        if f is None:
            return
        if ids is not None and len(ids) != len(documents):
            return  # add_documents' own validation says so
        named = [
            (str(ids[n]) if ids is not None else doc_id_for(doc), doc)
            for n, doc in enumerate(documents)
            if isinstance(doc, Document)  # anything else: the validation's error
        ]
        for doc_id, doc in named:
            if not matches(f, {**doc.metadata, "doc_id": doc_id}):
                raise ValueError(
                    f"document {doc_id!r} does not pass this retriever's filter "
                    f"{self.filter!r}; a retriever bound to a filter writes only documents "
                    "that pass it"
                )
        if not named:
            return
        held = self._records.pointers([doc_id for doc_id, _ in named])
        for (doc_id, _), record in zip(named, held):
            if record is not None and not self._allows(f, record.doc_id, record.metadata):
                raise ValueError(
                    f"document id {doc_id!r} is indexed for a document outside this "
                    "retriever's filter; it cannot be replaced from here (use another id)"
                )

    @staticmethod
    def _allows(f: Filter | None, doc_id: str, metadata: dict[str, Any]) -> bool:
        """Whether ``f`` (None: no filter) allows an indexed document."""
        return f is None or matches(f, {**metadata, "doc_id": doc_id})

    def delete(self, ids: Sequence[str] | None = None, **kwargs: Any) -> DeleteResponse:
        """Remove documents (by doc id) from the vector store, lexical index and record
        store. With a bound :attr:`filter`, only documents it allows: other ids are treated
        as unknown (not removed, not in ``succeeded``)."""
        doc_ids = check_delete_ids(ids)
        f = parse(self.filter) if self.filter else None
        with self._writer.lock:
            if f is not None:
                held = self._records.pointers(list(doc_ids))
                doc_ids = [
                    d for d, r in zip(doc_ids, held)
                    if r is not None and self._allows(f, d, r.metadata)
                ]  # fmt: skip
            found = self._writer.delete(doc_ids, self.router)
        return DeleteResponse(num_deleted=len(found), succeeded=found, failed=[])

    async def adelete(self, ids: Sequence[str] | None = None, **kwargs: Any) -> DeleteResponse:
        """Async :meth:`delete` (runs in a thread)."""
        return await asyncio.to_thread(self.delete, ids)

    def vacuum(self, min_age_s: float = 0.0) -> int:
        """Remove chunks of document versions that are not current: what a writer killed
        half-way, or one that lost a race to another worker, left in the shared stores;
        and documents whose pointer names a version whose records are gone (a broken
        index; add them again). A version that cannot be removed is logged and left for
        the next vacuum. Returns the number of versions removed. Run it when no writer is
        active, or pass ``min_age_s`` longer than any write takes so versions being written
        are spared. Index-wide maintenance: a bound :attr:`filter` does not limit it (it
        never removes a current version, and returns only a count)."""
        return self._writer.vacuum(min_age_s, self.router)

    async def avacuum(self, min_age_s: float = 0.0) -> int:
        """Async :meth:`vacuum` (runs in a thread)."""
        return await asyncio.to_thread(self.vacuum, min_age_s)

    # DocumentIndex: lets `langchain_core.indexing.index(docs, record_manager, retriever)`
    # sync a changing source into this retriever.

    def upsert(self, items: Sequence[Document], /, **kwargs: Any) -> UpsertResponse:
        """Add or replace documents (``DocumentIndex`` API); same as :meth:`add_documents`."""
        return UpsertResponse(succeeded=self.add_documents(items), failed=[])

    async def aupsert(self, items: Sequence[Document], /, **kwargs: Any) -> UpsertResponse:
        """Async :meth:`upsert`."""
        return UpsertResponse(succeeded=await self.aadd_documents(items), failed=[])

    def get(self, ids: Sequence[str], /, **kwargs: Any) -> list[Document]:
        """The indexed source documents with these doc ids (unknown ids are skipped, and so
        are documents a bound :attr:`filter` rejects)."""
        f = parse(self.filter) if self.filter else None
        records = [
            r for r in self._records.pointers(list(ids))
            if r is not None and self._allows(f, r.doc_id, r.metadata)
        ]  # fmt: skip
        return [
            Document(page_content=body.text, metadata=dict(r.metadata), id=r.doc_id)
            for r, body in zip(records, self._records.bodies(records))
        ]

    # ------------------------------------------------------------------ persistence

    def save(self, path: str | os.PathLike[str]) -> None:
        """Save the index to a directory: settings, BM25 index, record store, local vectors.

        JSON and FAISS files only, no pickle. Writes are atomic: a process killed during
        ``save`` leaves the previous save loadable, and saves to one directory from several
        processes run one after another (a lock file, ``.rse_index.lock``). Files are
        created ``0o666`` less the umask. A vector store other than FAISS or
        ``InMemoryVectorStore``, and a record store other than the in-memory default,
        persist themselves and are passed again to :meth:`load`. Components are saved as
        their class and non-secret settings (never keys). Index-wide: a bound :attr:`filter`
        does not limit what is saved (and is not saved).
        """
        with self._writer.lock:
            n = save_index(self, path)
        logger.info("saved index with %d chunks to %s", n, path)

    @classmethod
    def load(
        cls,
        path: str | os.PathLike[str],
        embedding: Embeddings | None = None,
        *,
        vectorstore: VectorStore | None = None,
        docstore: BaseStore[str, bytes] | None = None,
        strict: bool = False,
        **kwargs: Any,
    ) -> RSERetriever:
        """Load a directory written by :meth:`save`.

        ``embedding`` is needed for a saved local vector store (the bundled
        ``LocalEmbeddings`` is used when the index was built with it). Pass
        ``vectorstore`` / ``docstore`` when they were external. The offline enrichers, a
        ``CohereReranker`` (key and endpoint from the environment, never from the index: one
        saved with another endpoint is not rebuilt) and an ``EmbeddingReranker`` over the
        same embedding are rebuilt from their saved settings; any other component the index
        was saved with (an LLM enricher, a compressor, a router, a query expander) must be
        passed again: it is named in a warning, or a ``ValueError`` with ``strict=True``.
        Other keyword arguments override saved settings. A corrupted, truncated, tampered or
        newer-format index raises ``IndexFormatError`` naming the file.
        """
        return load_index(cls, path, embedding, vectorstore, docstore, strict, kwargs)  # type: ignore[no-any-return]

    # ------------------------------------------------------------------ querying

    def _get_relevant_documents(
        self,
        query: str,
        *,
        run_manager: CallbackManagerForRetrieverRun,
        k: int | None = None,
        mode: Literal["segments", "chunks"] | None = None,
        queries: list[str] | None = None,
        filter: dict[str, Any] | None = None,
        max_chars: int | None = None,
        **kwargs: Any,
    ) -> list[Document]:
        steps = pipeline.retrieval(self, query, k, mode, queries, filter, max_chars, kwargs)
        return drive(steps, pipeline.handlers(self, run_manager.get_child(), False))  # type: ignore[no-any-return]

    async def _aget_relevant_documents(
        self,
        query: str,
        *,
        run_manager: AsyncCallbackManagerForRetrieverRun,
        k: int | None = None,
        mode: Literal["segments", "chunks"] | None = None,
        queries: list[str] | None = None,
        filter: dict[str, Any] | None = None,
        max_chars: int | None = None,
        **kwargs: Any,
    ) -> list[Document]:
        steps = pipeline.retrieval(self, query, k, mode, queries, filter, max_chars, kwargs)
        return await adrive(steps, pipeline.handlers(self, run_manager.get_child(), True))  # type: ignore[no-any-return]

    def as_tool(  # type: ignore[override]
        self, *, name: str = "search", description: str | None = None, allow_filter: bool = False
    ) -> BaseTool:
        """A tool for agents: numbered sources with their exact text, and the segments.

        The model reads ``[n] title (source), pages, characters start–end`` and the exact
        text of each source; the ``ToolMessage`` artifact is the segment ``Document``s
        (``[n]`` is ``artifact[n - 1]``). The model may pass ``query``, extra ``queries``
        and ``k``, and a ``filter`` only with ``allow_filter=True`` (it narrows this
        retriever's ``filter``, never widens it). See
        :func:`~langchain_rse.agents.create_search_tool`.

        Example:
            .. code-block:: python

                from langchain.agents import create_agent

                agent = create_agent(llm, tools=[retriever.as_tool(name="search_contracts")])
        """
        from langchain_rse.agents import create_search_tool

        return create_search_tool(self, name=name, description=description,
                                  allow_filter=allow_filter)  # fmt: skip

    # ------------------------------------------------------------------ explaining

    def explain(self, query: str, **kwargs: Any) -> Explanation:
        """Retrieve as :meth:`invoke` does (same keyword arguments) and explain the result:
        the relevance of every candidate chunk along its document and the segments chosen
        (see :class:`~langchain_rse.explain.Explanation`; ``to_text()`` for a terminal,
        ``to_html()`` for a page with the segments highlighted in their documents)."""
        with tracing() as traces:
            results = self.invoke(query, **kwargs)
        return build_explanation(query, results, traces[-1] if traces else None)

    async def aexplain(self, query: str, **kwargs: Any) -> Explanation:
        """Async :meth:`explain`."""
        with tracing() as traces:
            results = await self.ainvoke(query, **kwargs)
        return build_explanation(query, results, traces[-1] if traces else None)
