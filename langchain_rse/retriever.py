"""``RSERetriever``: its fields and the checks of its settings, add/delete/get/save/load and
invoke. A write runs :mod:`~langchain_rse.indexing.writer` (documents checked and split by
:mod:`~langchain_rse.indexing.chunking`, enriched by :mod:`~langchain_rse.enrichment`); a
query runs the generator of :mod:`~langchain_rse.pipeline` (see ``docs/architecture.md``).
"""

from __future__ import annotations

import asyncio
import logging
import os
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
from langchain_rse.engine import Index, QueryCall
from langchain_rse.enrichment import BaseEnricher, HeaderEnricher
from langchain_rse.explain import Explanation, build_explanation, tracing
from langchain_rse.filters import Filter, check_filter
from langchain_rse.indexing.chunking import DEFAULT_CHUNK_SIZE
from langchain_rse.indexing.steps import WriteSettings
from langchain_rse.lexical import BM25Index
from langchain_rse.lexical.tokenizer import DEFAULT_STEMMER, check_stemmer
from langchain_rse.persistence import (
    COMPONENTS,
    SAVED_FIELDS,
    SavedSettings,
    default_vectorstore,
    load_index,
)
from langchain_rse.persistence.schema import (
    check_delete_ids,
    check_expander,
    check_settings,
)
from langchain_rse.rerank import BaseReranker, as_reranker
from langchain_rse.routing import DocumentRouter, as_router
from langchain_rse.search import ls_params
from langchain_rse.segments import RSEParams, get_preset, preset_for_chunk_size

if TYPE_CHECKING:
    from langchain_core.tools import BaseTool

__all__ = ["RSERetriever"]

logger = logging.getLogger(__name__)


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
        reranker: BaseReranker | BaseDocumentCompressor | None
            Optional reranker; its calibrated scores become chunk relevance.
        rse_params: RSEParams | str | None
            RSE parameters or a preset's name; by default the one tuned for ``chunk_size``.

    Instantiate:
        .. code-block:: python

            from langchain_core.vectorstores import InMemoryVectorStore
            from langchain_rse import RSERetriever

            retriever = RSERetriever(vectorstore=InMemoryVectorStore(embeddings), k=3)
            retriever.add_documents(docs)
            # or: RSERetriever.from_documents(docs, embedding=embeddings)

    Invoke:
        .. code-block:: python

            for seg in retriever.invoke("termination for convenience", k=2):
                meta = seg.metadata
                print(meta["doc_id"], meta["start_index"], meta["end_index"], meta["score"])

    Use within a chain:
        .. code-block:: python

            from langchain_core.prompts import ChatPromptTemplate
            from langchain_core.runnables import RunnablePassthrough

            prompt = ChatPromptTemplate.from_template("Context: {context}\nQuestion: {question}")

            def format_docs(docs):
                return "\n\n".join(d.page_content for d in docs)

            chain = (
                {"context": retriever | format_docs, "question": RunnablePassthrough()}
                | prompt
                | llm
            )
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
    record_store: BaseStore[str, bytes] = Field(default_factory=InMemoryByteStore, frozen=True)
    """Record store: source texts, offsets and contexts as JSON, one record per document."""
    chunk_size: int = DEFAULT_CHUNK_SIZE
    """Chunk size in characters (ignored when ``splitter`` is given)."""
    splitter: TextSplitter | None = None
    """A custom LangChain text splitter (chunks located by exact offsets). For an overlap:
    ``make_splitter(chunk_size, chunk_overlap)`` from ``langchain_rse.indexing.chunking``."""
    enricher: BaseEnricher = Field(default_factory=HeaderEnricher)
    """Writes each chunk's situating context at index time (offline title/section header
    by default; ``ContextualEnricher`` for LLM-written context; ``NoEnricher`` for none)."""
    reranker: Annotated[BaseReranker | None, BeforeValidator(as_reranker)] = None
    """Reranks fused candidates; a ``BaseDocumentCompressor`` is wrapped automatically."""
    lexical_store: VectorStore | None = Field(default=None, frozen=True)
    """Instead of the in-process BM25 index, any ``VectorStore`` whose search is lexical
    (e.g. ``ElasticsearchStore(strategy=BM25Strategy())``); chunks are written to it too."""
    lexical_stemmer: Annotated[str | None, AfterValidator(check_stemmer)] = Field(
        default=DEFAULT_STEMMER, frozen=True
    )
    """Snowball stemmer of the in-process BM25 index (``"english"``, ``"german"``, ... as
    in ``Stemmer.algorithms()``), or ``None`` to match words as they are."""
    max_chars: int | None = None
    """The most characters one call returns in all (also ``invoke(query, max_chars=...)``),
    filled best first, never exceeded; ``k`` still bounds the count. ``None``: the preset's."""
    fetch_k: int = 200
    """Candidates fetched from each branch (dense and lexical); the best 50 fused ones
    (:data:`~langchain_rse.pipeline.CANDIDATE_POOL`) go on to reranking and RSE."""
    weights: tuple[float, float] = (2.0, 1.0)
    """Weights of the (dense, lexical) branches in reciprocal rank fusion (chosen on CUAD);
    a query that quotes code gives BM25 the dense weight."""
    rse_params: RSEParams | str | None = None
    """An ``RSEParams`` or a preset's name in ``langchain_rse.segments.PRESETS`` (``"reranked"``
    with a reranker). ``None``: the preset tuned for the chunk size, ``"default"`` below 600
    characters (and with a ``splitter``), ``"long_chunks"`` from 600 on."""
    router: Annotated[DocumentRouter | None, BeforeValidator(as_router)] = Field(
        default_factory=DocumentRouter.leads
    )
    """A :class:`~langchain_rse.routing.DocumentRouter` (or a bare retriever it wraps) picks
    the document a query names, whose chunks are favoured when the unrouted search agrees;
    by default over this index's titles and openings (``LeadIndex``). ``None``: off."""
    filter: Annotated[dict[str, Any] | None, AfterValidator(check_filter)] = None
    """A metadata filter every result must pass (one tenant), in :mod:`langchain_rse.filters`'
    language, on a document's metadata with ``doc_id``: pushed into both searches and the
    route, checked on every candidate; ``invoke(filter=...)`` narrows it. It binds :meth:`get`,
    :meth:`delete` and :meth:`add_documents`, not :meth:`vacuum` or :meth:`save`."""
    filter_translator: Callable[[Filter], dict[str, Any]] | None = None
    """For a store :mod:`langchain_rse.filters` cannot translate for: parsed filter → that
    store's search keyword arguments (e.g. ``lambda f: {"filter": to_dict(f)}``)."""
    query_expander: Annotated[Any, AfterValidator(check_expander)] = None
    """Optional ``QueryExpander``: an LLM rewrites the query into several search queries."""
    max_document_chars: int = 20_000_000
    """Longer documents are rejected with a ``ValueError`` before anything is written."""
    show_progress: bool | None = None
    """Progress while indexing: ``True`` a tqdm bar, ``False`` nothing, ``None`` a bar on a
    terminal, else lines on stderr (see :mod:`langchain_rse.indexing.steps`)."""

    _index: Index = PrivateAttr()

    @model_validator(mode="after")
    def _check(self) -> RSERetriever:
        check_settings(self)
        return self

    def __setattr__(self, name: str, value: object) -> None:
        # validate_assignment stores the value first: a rejected one puts the old one back.
        old = self.__dict__.get(name)
        try:
            super().__setattr__(name, value)
        except ValueError:
            if name in type(self).model_fields:
                self.__dict__[name] = old
            raise
        if name == "router":
            self._index.bind_router(self.router)

    def model_post_init(self, context: object, /) -> None:
        self._index = Index(
            self.vectorstore, self.record_store, self.lexical_store, self.lexical_stemmer
        )
        self._index.bind_router(self.router)

    @property
    def index(self) -> Index:
        """The engine under this retriever (:class:`~langchain_rse.engine.Index`): its
        stores and the operations on them; ``index.pointers(ids)`` reads what is indexed."""
        return self._index

    def _loaded_lexical(self) -> BM25Index:
        """The in-process BM25 index :func:`~langchain_rse.persistence.load_index` fills."""
        return self._index.lexical

    def _retrieval_settings(self) -> pipeline.RetrievalSettings:
        """This retriever's settings as one retrieval reads them."""
        return pipeline.RetrievalSettings(
            k=self.k,
            mode=self.mode,
            max_chars=self.max_chars,
            weights=self.weights,
            params=self.params,
            filter=self.filter,
            reranker=self.reranker,
            router=self.router,
            query_expander=self.query_expander,
            external_lexical=self.lexical_store is not None,
            fetch_k=self.fetch_k,
            filter_translator=self.filter_translator,
        )

    def _write_settings(self) -> WriteSettings[DocumentRouter | None]:
        """This retriever's settings as a write reads them."""
        return WriteSettings(
            filter=self.filter,
            show_progress=self.show_progress,
            enricher=self.enricher,
            splitter=self.splitter,
            chunk_size=self.chunk_size,
            max_document_chars=self.max_document_chars,
            router=self.router,
        )

    def _saved_settings(self) -> SavedSettings:
        """This retriever's settings as a save records them."""
        return SavedSettings(
            fields={name: getattr(self, name) for name in SAVED_FIELDS},
            components={name: getattr(self, name) for name in COMPONENTS},
            splitter=self.splitter,
            chunk_size=self.chunk_size,
            rse_params=self.rse_params,
            preset_name=self.preset_name,
            router=self.router,
        )

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
            f"mode={self.mode!r}, chunks={len(self._index)}, enricher={self.enricher!r}, "
            f"reranker={type(self.reranker).__name__ if self.reranker else None}, "
            f"rse_params={params!r})"
        )

    __str__ = __repr__

    def _get_ls_params(self, **kwargs: object) -> LangSmithRetrieverParams:
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
        """Build a retriever over ``documents`` with a local vector store: FAISS (exact
        cosine) with ``faiss-cpu`` installed, else ``InMemoryVectorStore``; both save without
        pickle. Without ``embedding``: the bundled offline ``LocalEmbeddings``."""
        if vectorstore is None:
            vectorstore = default_vectorstore(embedding)
        retriever = cls(vectorstore=vectorstore, **kwargs)
        retriever.add_documents(list(documents))
        return retriever

    def add_documents(
        self, documents: Sequence[Document], ids: Sequence[str] | None = None, **kwargs: object
    ) -> list[str]:
        """Index long source documents; returns their doc ids.

        An indexed id is replaced everywhere (unchanged: skipped); an empty document is
        skipped with a warning (its indexed version removed). All are validated and split
        first, then enriched and written in groups (:mod:`langchain_rse.indexing.steps`).
        With a bound :attr:`filter`, a document it rejects, or whose id another tenant's
        holds, is a ``ValueError`` before anything is written; the write checks the ids
        again right before it makes its documents current (another tenant, or worker, may
        have written one meanwhile): a ``ValueError`` then too, that group left unwritten.
        """
        return self._index.add(self._write_settings(), documents, ids)

    async def aadd_documents(
        self, documents: Sequence[Document], ids: Sequence[str] | None = None, **kwargs: object
    ) -> list[str]:
        """Async :meth:`add_documents`: enrichment runs natively async; writes in a thread
        (under the same lock as the sync path, re-checking what another writer wrote, and
        with a bound :attr:`filter` who owns each id)."""
        return await self._index.aadd(self._write_settings(), documents, ids)

    def delete(self, ids: Sequence[str] | None = None, **kwargs: object) -> DeleteResponse:
        """Remove documents (by doc id) from the vector store, lexical index and record
        store. With a bound :attr:`filter`, only documents it allows: other ids are treated
        as unknown (not removed, not in ``succeeded``). An id named twice counts once."""
        found = self._index.delete(check_delete_ids(ids), self.filter, self.router)
        return DeleteResponse(num_deleted=len(found), succeeded=found, failed=[])

    async def adelete(self, ids: Sequence[str] | None = None, **kwargs: object) -> DeleteResponse:
        """Async :meth:`delete` (runs in a thread)."""
        return await asyncio.to_thread(self.delete, ids)

    def vacuum(self, min_age_s: float = 0.0) -> int:
        """Remove what killed or losing writers left (non-current versions' chunks; documents
        whose records are gone); returns the number of versions removed. Run it with no
        writer active or ``min_age_s`` longer than any write. Not limited by :attr:`filter`."""
        return self._index.vacuum(min_age_s, self.router)

    async def avacuum(self, min_age_s: float = 0.0) -> int:
        """Async :meth:`vacuum` (runs in a thread)."""
        return await asyncio.to_thread(self.vacuum, min_age_s)

    def upsert(self, items: Sequence[Document], /, **kwargs: object) -> UpsertResponse:
        """``DocumentIndex`` API (``langchain_core.indexing.index``): :meth:`add_documents`."""
        return UpsertResponse(succeeded=self.add_documents(items), failed=[])

    async def aupsert(self, items: Sequence[Document], /, **kwargs: object) -> UpsertResponse:
        """Async :meth:`upsert`."""
        return UpsertResponse(succeeded=await self.aadd_documents(items), failed=[])

    def get(self, ids: Sequence[str], /, **kwargs: object) -> list[Document]:
        """The indexed source documents with these doc ids (unknown ids are skipped, and so
        are documents a bound :attr:`filter` rejects)."""
        return self._index.get(ids, self.filter)

    def save(self, path: str | os.PathLike[str]) -> None:
        """Save the index to a directory (JSON and FAISS files, no pickle; atomic; see
        :mod:`langchain_rse.persistence`). External stores persist themselves (pass them to
        :meth:`load`); components are saved as class and non-secret settings; a bound
        :attr:`filter` is neither saved nor limits what is."""
        n = self._index.save(self._saved_settings(), path)
        logger.info("saved index with %d chunks to %s", n, path)

    @classmethod
    def load(
        cls,
        path: str | os.PathLike[str],
        embedding: Embeddings | None = None,
        *,
        vectorstore: VectorStore | None = None,
        record_store: BaseStore[str, bytes] | None = None,
        strict: bool = False,
        **kwargs: object,
    ) -> RSERetriever:
        """Load a directory written by :meth:`save`.

        ``embedding``: for a saved local vector store (unless bundled ``LocalEmbeddings``);
        ``vectorstore`` / ``record_store``: when they were external. Offline enrichers,
        ``CohereReranker`` (key from the environment) and ``EmbeddingReranker`` are rebuilt;
        other components must be passed again (a warning, or ``ValueError`` if ``strict``).
        Keyword arguments override saved settings. A corrupted, tampered or newer-format
        index raises ``IndexFormatError`` naming the file.
        """
        return load_index(
            cls, cls._loaded_lexical, path, embedding, vectorstore, record_store, strict, kwargs
        )

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
        **kwargs: object,
    ) -> list[Document]:
        s = self._retrieval_settings()
        steps = self._index.retrieval(
            s, QueryCall(query, k, mode, queries, filter, max_chars, kwargs)
        )
        return self._index.run(s, steps, run_manager.get_child())

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
        **kwargs: object,
    ) -> list[Document]:
        s = self._retrieval_settings()
        steps = self._index.retrieval(
            s, QueryCall(query, k, mode, queries, filter, max_chars, kwargs)
        )
        return await self._index.arun(s, steps, run_manager.get_child())

    def as_tool(  # type: ignore[override]
        self, *, name: str = "search", description: str | None = None, allow_filter: bool = False
    ) -> BaseTool:
        """A tool for agents: numbered sources with their exact text, and the segments.

        The ``ToolMessage`` artifact is the segment ``Document``s (``[n]`` is
        ``artifact[n - 1]``); the model may pass a ``filter`` only with ``allow_filter=True``
        (it narrows the bound one). See :func:`~langchain_rse.agents.create_search_tool`.

        Example:
            .. code-block:: python

                from langchain.agents import create_agent

                agent = create_agent(llm, tools=[retriever.as_tool(name="search_contracts")])
        """
        from langchain_rse.agents import create_search_tool

        return create_search_tool(
            self, name=name, description=description, allow_filter=allow_filter
        )

    def explain(self, query: str, **kwargs: Any) -> Explanation:
        """Retrieve as :meth:`invoke` does and explain the result: every candidate chunk's
        relevance along its document and the segments chosen
        (:class:`~langchain_rse.explain.Explanation`: ``to_text()``, ``to_html()``)."""
        with tracing() as traces:
            results = self.invoke(query, **kwargs)
        return build_explanation(query, results, traces[-1] if traces else None)

    async def aexplain(self, query: str, **kwargs: Any) -> Explanation:
        """Async :meth:`explain`."""
        with tracing() as traces:
            results = await self.ainvoke(query, **kwargs)
        return build_explanation(query, results, traces[-1] if traces else None)
