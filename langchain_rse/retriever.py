"""``RSERetriever``: the retriever that wires the stages together."""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import re
import secrets
import sys
import threading
from collections.abc import Generator, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Any, Literal

from langchain_core.callbacks import (
    AsyncCallbackManagerForRetrieverRun,
    CallbackManagerForRetrieverRun,
)
from langchain_core.documents import BaseDocumentCompressor, Document
from langchain_core.embeddings import Embeddings
from langchain_core.indexing import DeleteResponse, DocumentIndex, UpsertResponse
from langchain_core.retrievers import BaseRetriever, LangSmithRetrieverParams
from langchain_core.runnables import RunnableConfig, RunnableLambda
from langchain_core.stores import BaseStore, InMemoryByteStore
from langchain_core.vectorstores import InMemoryVectorStore, VectorStore
from langchain_text_splitters import TextSplitter
from pydantic import ConfigDict, Field, PrivateAttr, field_validator, model_validator
from tqdm.auto import tqdm

from langchain_rse.chunking import (
    DEFAULT_CHUNK_SIZE,
    Chunk,
    chunk_key,
    chunk_uuid,
    doc_id_for,
    document_leads,
    make_splitter,
    parse_chunk_key,
    split_text,
)
from langchain_rse.enrichment import BaseEnricher, ChunkContext, HeaderEnricher, index_text
from langchain_rse.fusion import FusedHit, FusionMethod, fuse
from langchain_rse.lexical import BM25Index, LexicalEngine
from langchain_rse.rerank import BaseReranker, RerankError, RerankResult
from langchain_rse.segments import (
    RSEParams,
    best_segments,
    chunk_values,
    get_preset,
    rank_relevance,
)

__all__ = ["RSERetriever"]

logger = logging.getLogger(__name__)

_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


def _looks_binary(text: str) -> bool:
    """NUL characters, or over 10% control/replacement characters in the first 100k."""
    if "\x00" in text:
        return True
    head = text[:100_000]
    odd = len(_CONTROL.findall(head)) + head.count("\ufffd")
    return odd > 0.1 * max(len(head), 1)


RECORD_FORMAT = 1
_READ_ATTEMPTS = 3
_META_CACHE_SIZE = 4096
"""Version of the JSON records kept in the chunk store."""


def _library_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("langchain-rse")
    except PackageNotFoundError:  # pragma: no cover - running from a source tree
        return "unknown"


def _store_key(kind: str, doc_id: str) -> str:
    # Hashed, so any doc id (paths, URLs, unicode) is a valid key in every BaseStore,
    # including file-backed ones that restrict key characters.
    return f"{kind}/" + hashlib.sha256(doc_id.encode("utf-8", "surrogatepass")).hexdigest()[:40]


class _StaleRead(Exception):
    """A document changed while a query was reading it; the query re-reads."""


class _RWLock:
    """Many readers or one writer: guards in-process vector stores (FAISS, in-memory),
    which are not safe to search while they are being modified."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._readers = 0
        self._writer = False

    @contextmanager
    def read(self) -> Iterator[None]:
        with self._cond:
            while self._writer:
                self._cond.wait()
            self._readers += 1
        try:
            yield
        finally:
            with self._cond:
                self._readers -= 1
                if not self._readers:
                    self._cond.notify_all()

    @contextmanager
    def write(self) -> Iterator[None]:
        with self._cond:
            while self._writer or self._readers:
                self._cond.wait()
            self._writer = True
        try:
            yield
        finally:
            with self._cond:
                self._writer = False
                self._cond.notify_all()


def _key_of(chunk: Document) -> str | None:
    """The chunk key of a search hit written by this retriever; None for foreign documents."""
    m = chunk.metadata
    if "doc_id" not in m or "chunk_index" not in m or "doc_version" not in m:
        return None
    return chunk_key(str(m["doc_id"]), str(m["doc_version"]), int(m["chunk_index"]))


@dataclass(frozen=True)
class _DocMeta:
    """The small per-document record read at query time."""

    doc_id: str
    version: str
    metadata: dict[str, Any]
    spans: list[tuple[int, int]]
    fallbacks: int = 0
    """Chunks whose LLM context failed (header used): re-adding the document retries them."""

    def to_bytes(self) -> bytes:
        return json.dumps(
            {
                "format": RECORD_FORMAT,
                "doc_id": self.doc_id,
                "version": self.version,
                "metadata": self.metadata,
                "spans": [x for span in self.spans for x in span],
                "fallbacks": self.fallbacks,
            },
            ensure_ascii=False,
        ).encode("utf-8")

    @classmethod
    def from_bytes(cls, raw: bytes) -> _DocMeta:
        data = json.loads(raw)
        if data.get("format") != RECORD_FORMAT:
            raise ValueError(
                f"chunk store record has format {data.get('format')!r}; "
                f"this version of langchain-rse reads format {RECORD_FORMAT}"
            )
        flat = data["spans"]
        spans = list(zip(flat[0::2], flat[1::2]))
        return cls(
            data["doc_id"], data["version"], data["metadata"], spans, data.get("fallbacks", 0)
        )


@dataclass(frozen=True)
class _DocBody:
    """The source text of one document version and its chunk contexts."""

    text: str
    contexts: list[ChunkContext]

    def to_bytes(self) -> bytes:
        return json.dumps(
            {"text": self.text, "contexts": [[c.text, c.method] for c in self.contexts]},
            ensure_ascii=False,
        ).encode("utf-8", "surrogatepass")

    @classmethod
    def from_bytes(cls, raw: bytes) -> _DocBody:
        data = json.loads(raw.decode("utf-8", "surrogatepass"))
        return cls(data["text"], [ChunkContext(t, m) for t, m in data["contexts"]])


@dataclass
class _Candidate:
    """A fused candidate chunk on its way to RSE."""

    key: str
    doc_id: str
    version: str
    chunk_index: int
    fused: FusedHit
    text: str | None = None  # enriched index text, when the dense branch returned it
    relevance: float = 0.0
    rerank_score: float | None = None


@dataclass
class _Prepared:
    """What ingestion computed for one document before anything is written."""

    meta: _DocMeta
    body: _DocBody
    chunks: list[Chunk]


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
        preset: str
            Named RSE parameters (see ``langchain_rse.segments.PRESETS``).

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

            from langchain_core.output_parsers import StrOutputParser
            from langchain_core.prompts import ChatPromptTemplate
            from langchain_core.runnables import RunnablePassthrough

            prompt = ChatPromptTemplate.from_template(
                "Answer from the context.\\n\\n{context}\\n\\nQuestion: {question}"
            )

            def format_docs(docs):
                return "\\n\\n".join(d.page_content for d in docs)

            chain = (
                {"context": retriever | format_docs, "question": RunnablePassthrough()}
                | prompt
                | llm
                | StrOutputParser()
            )
            chain.invoke("Can either party terminate for convenience?")
    """

    model_config = ConfigDict(arbitrary_types_allowed=True, extra="forbid")

    vectorstore: VectorStore
    """The vector store holding the (enriched) chunk texts."""
    k: int = 4
    """Maximum number of results (segments or chunks)."""
    mode: Literal["segments", "chunks"] = "segments"
    """``"segments"``: RSE segments; ``"chunks"``: the top-k chunks (same metadata)."""
    docstore: BaseStore[str, bytes] = Field(default_factory=InMemoryByteStore)
    """Chunk store: source texts, offsets and contexts as JSON, one record per document."""
    chunk_size: int = DEFAULT_CHUNK_SIZE
    """Chunk size in characters (ignored when ``splitter`` is given)."""
    chunk_overlap: int = 0
    """Chunk overlap in characters; segments restore context, so none is needed."""
    splitter: TextSplitter | None = None
    """A custom LangChain text splitter; its chunks are located by exact offsets."""
    enricher: BaseEnricher = Field(default_factory=HeaderEnricher)
    """Writes each chunk's situating context at index time (offline title/section header
    by default; ``ContextualEnricher`` for LLM-written context; ``NoEnricher`` for none)."""
    reranker: BaseReranker | None = None
    """Reranks fused candidates; a ``BaseDocumentCompressor`` is wrapped automatically."""
    strict_rerank: bool = False
    """Raise when the reranker fails instead of falling back to the fused ranking."""
    lexical_store: VectorStore | None = None
    """An external lexical index used instead of the in-process BM25 index, for corpora
    beyond one machine: any ``VectorStore`` whose search is lexical, e.g.
    ``ElasticsearchStore(strategy=BM25Strategy())``. Chunks are written to it too."""
    lexical_engine: LexicalEngine = "bm25s"
    """BM25 implementation: ``"bm25s"`` (fast, sparse) or ``"rank_bm25"``."""
    fetch_k: int = 50
    """Candidates fetched from each branch (dense and lexical)."""
    candidate_pool: int = 50
    """Fused candidates kept for reranking and RSE."""
    fusion: FusionMethod = "rrf"
    """``"rrf"``, ``"relative_score"`` or ``"dist_based"``."""
    weights: tuple[float, float] = (1.0, 1.0)
    """Fusion weights of the (dense, lexical) branches."""
    rrf_k: float = 60.0
    """Reciprocal rank fusion constant."""
    relevance: Literal["rank", "score"] = "rank"
    """Chunk relevance without a reranker: ``"rank"`` = ``exp(-rank / decay_rate)`` of the
    fused rank; ``"score"`` = fused score divided by the best fused score."""
    preset: str = "default"
    """Named RSE parameters; see ``langchain_rse.segments.PRESETS``."""
    rse_params: RSEParams | None = None
    """Explicit RSE parameters; override ``preset`` when given."""
    document_router: BaseRetriever | None = None
    """Optional document-level retriever that picks which documents to search, e.g. an
    ``RSERetriever`` in chunks mode over :func:`document_leads` (each document's title and
    opening). Candidates are kept only from the ``route_documents`` documents it returns
    first (their ``metadata["doc_id"]``, else ``Document.id``); when it returns none of
    ours, nothing is filtered. Off by default: it pays when queries name their document
    (CUAD contracts), and hurts questions that span documents."""
    route_documents: int = 1
    """Documents kept by ``document_router``."""
    route_fetch_k: int = 200
    """Candidates fetched from each branch when routing, before the document filter."""
    sync_router: bool = False
    """Keep ``document_router`` in step with this index: when True (the router must be a
    LangChain ``DocumentIndex``, e.g. an ``RSERetriever``), adding, replacing and deleting
    documents here upserts and deletes their :func:`document_leads` there too."""
    route_check_k: int | None = 10
    """A routed document is kept only if one of its chunks is among the first
    ``route_check_k`` candidates of the unrouted search; when none is, nothing is filtered
    (the router was probably wrong: on CUAD the check recovers most misrouted queries).
    None: always filter."""
    query_expander: Any = None
    """Optional ``QueryExpander``: an LLM rewrites the query into several search queries."""
    max_queries: int = 6
    """Most queries searched for one retrieval (original + ``queries=`` + expansions)."""
    max_query_chars: int = 8192
    """Longer queries are rejected with a ``ValueError``."""
    max_document_chars: int = 20_000_000
    """Longer documents are rejected with a ``ValueError`` before anything is written."""
    index_batch_size: int = 256
    """Chunks written to the vector store per call."""
    show_progress: bool | None = None
    """Progress bar while indexing; ``None`` shows it only on a terminal."""

    _lexical: BM25Index = PrivateAttr()
    _write_lock: threading.RLock = PrivateAttr(default_factory=threading.RLock)
    _vs_lock: _RWLock = PrivateAttr(default_factory=_RWLock)
    _meta_cache: dict[bytes, _DocMeta] = PrivateAttr(default_factory=dict)
    _search_cache: tuple[object, RunnableLambda, RunnableLambda] | None = PrivateAttr(None)

    # ------------------------------------------------------------------ setup

    @field_validator("reranker", mode="before")
    @classmethod
    def _wrap_compressor(cls, value: Any) -> Any:
        if isinstance(value, BaseDocumentCompressor):
            from langchain_rse.rerank import CompressorReranker

            return CompressorReranker(compressor=value)
        return value

    @model_validator(mode="after")
    def _check(self) -> RSERetriever:
        if self.k < 0:
            raise ValueError(f"k must be >= 0, got {self.k}")
        for name in (
            "fetch_k",
            "candidate_pool",
            "max_queries",
            "max_query_chars",
            "max_document_chars",
            "index_batch_size",
            "route_documents",
            "route_fetch_k",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.sync_router and not isinstance(self.document_router, DocumentIndex):
            raise ValueError(
                "sync_router needs a document_router that is a LangChain DocumentIndex "
                f"(e.g. an RSERetriever), got {type(self.document_router).__name__}"
            )
        if self.route_check_k is not None and self.route_check_k < 1:
            raise ValueError(f"route_check_k must be >= 1 or None, got {self.route_check_k}")
        if self.splitter is None:
            make_splitter(self.chunk_size, self.chunk_overlap)  # validates size/overlap
        fuse([], [], self.fusion, self.rrf_k)  # validates method and constant
        if len(self.weights) != 2 or min(self.weights) < 0 or max(self.weights) <= 0:
            raise ValueError(f"weights must be two non-negative numbers, got {self.weights}")
        if self.rse_params is None:
            get_preset(self.preset)
        return self

    def model_post_init(self, context: Any, /) -> None:
        self._lexical = BM25Index(engine=self.lexical_engine)

    @property
    def _searches(self) -> tuple[RunnableLambda, RunnableLambda]:
        """The two search branches as runnables (child runs), built once per instance:
        constructing a RunnableLambda inspects signatures (~0.1 ms each). They are bound to
        their owner, so a ``model_copy`` (which copies private state) builds its own."""
        cache = self._search_cache
        if cache is None or cache[0] is not self:
            cache = self._search_cache = (
                self,
                RunnableLambda(self._dense, afunc=self._adense, name="dense_search"),
                RunnableLambda(
                    self._lexical_search,
                    afunc=lambda q: asyncio.to_thread(self._lexical_search, q),
                    name="lexical_search",
                ),
            )
        return cache[1], cache[2]

    @property
    def params(self) -> RSEParams:
        """The RSE parameters in force."""
        return self.rse_params or get_preset(self.preset)

    def __repr__(self) -> str:
        return (
            f"RSERetriever(vectorstore={type(self.vectorstore).__name__}, k={self.k}, "
            f"mode={self.mode!r}, chunks={len(self._lexical)}, enricher={self.enricher!r}, "
            f"reranker={type(self.reranker).__name__ if self.reranker else None}, "
            f"fusion={self.fusion!r}, preset={self.preset!r})"
        )

    def __str__(self) -> str:
        return repr(self)

    def _get_ls_params(self, **kwargs: Any) -> LangSmithRetrieverParams:
        params = super()._get_ls_params(**kwargs)
        params["ls_vector_store_provider"] = type(self.vectorstore).__name__
        embeddings = getattr(self.vectorstore, "embeddings", None)
        if embeddings is not None:
            params["ls_embedding_provider"] = type(embeddings).__name__
            model = getattr(embeddings, "model", None) or getattr(embeddings, "model_name", None)
            if isinstance(model, str):
                params["ls_embedding_model"] = model
        return params

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
            if embedding is None:
                from langchain_rse.embeddings import LocalEmbeddings

                embedding = LocalEmbeddings()
            from langchain_rse.persistence import default_vectorstore

            vectorstore = default_vectorstore(embedding)
        retriever = cls(vectorstore=vectorstore, **kwargs)
        retriever.add_documents(list(documents))
        return retriever

    # ------------------------------------------------------------------ indexing

    def _splitter(self) -> TextSplitter:
        return self.splitter or make_splitter(self.chunk_size, self.chunk_overlap)

    def _version(self, text: str, metadata: dict[str, Any]) -> str:
        h = hashlib.sha256()
        h.update(text.encode("utf-8", "surrogatepass"))
        h.update(json.dumps(metadata, sort_keys=True, default=str).encode())
        splitter = (
            f"{self.chunk_size}/{self.chunk_overlap}"
            if self.splitter is None
            else repr(self.splitter.__dict__)
        )
        h.update(f"{splitter}|{self.enricher!r}".encode())
        return h.hexdigest()[:16]

    def _validate_documents(
        self, documents: Sequence[Document], ids: Sequence[str] | None
    ) -> list[str]:
        if isinstance(documents, (str, Document)):
            raise TypeError("add_documents expects a list of Documents")
        if ids is not None and len(ids) != len(documents):
            raise ValueError(f"got {len(ids)} ids for {len(documents)} documents")
        doc_ids: list[str] = []
        for n, doc in enumerate(documents):
            if not isinstance(doc, Document):
                raise TypeError(f"documents[{n}] is {type(doc).__name__}, not a Document")
            if not isinstance(doc.page_content, str):
                raise TypeError(f"documents[{n}].page_content is not a string")
            doc_id = str(ids[n]) if ids is not None else doc_id_for(doc)
            if len(doc.page_content) > self.max_document_chars:
                raise ValueError(
                    f"document {doc_id!r} has {len(doc.page_content):,} characters; the limit "
                    f"is max_document_chars={self.max_document_chars:,} (split it, or raise "
                    "the limit)"
                )
            if _looks_binary(doc.page_content):
                raise ValueError(
                    f"document {doc_id!r} looks like binary data decoded as text (NUL or "
                    "many control characters); extract its text first"
                )
            for key, value in doc.metadata.items():
                try:
                    json.dumps(value)
                except (TypeError, ValueError) as exc:
                    raise TypeError(
                        f"metadata[{key!r}] of document {doc_id!r} is not JSON-serialisable "
                        f"({type(value).__name__}); convert it to a string or number first"
                    ) from exc
            doc_ids.append(doc_id)
        seen: set[str] = set()
        for doc_id in doc_ids:
            if doc_id in seen:
                raise ValueError(f"duplicate document id {doc_id!r} in one add_documents call")
            seen.add(doc_id)
        return doc_ids

    def _progress(self, total: int, desc: str) -> tqdm:
        show = self.show_progress if self.show_progress is not None else sys.stderr.isatty()
        return tqdm(total=total, desc=desc, unit="doc", disable=not show)

    def _decode_meta(self, raw: bytes | None) -> _DocMeta | None:
        """Decode a pointer record; decoded records are cached by their bytes."""
        if raw is None:
            return None
        meta = self._meta_cache.get(raw)
        if meta is None:
            meta = _DocMeta.from_bytes(raw)
            if len(self._meta_cache) >= _META_CACHE_SIZE:
                self._meta_cache.pop(next(iter(self._meta_cache)), None)
            self._meta_cache[raw] = meta
        return meta

    def _get_meta(self, doc_ids: Sequence[str]) -> list[_DocMeta | None]:
        raw = self.docstore.mget([_store_key("doc", d) for d in doc_ids])
        return [self._decode_meta(r) for r in raw]

    async def _aget_meta(self, doc_ids: Sequence[str]) -> list[_DocMeta | None]:
        raw = await self.docstore.amget([_store_key("doc", d) for d in doc_ids])
        return [self._decode_meta(r) for r in raw]

    def _get_bodies(self, metas: Sequence[_DocMeta]) -> list[_DocBody]:
        raw = self.docstore.mget([_store_key(f"body/{m.version}", m.doc_id) for m in metas])
        return [self._decode_body(m, r) for m, r in zip(metas, raw)]

    async def _aget_bodies(self, metas: Sequence[_DocMeta]) -> list[_DocBody]:
        raw = await self.docstore.amget([_store_key(f"body/{m.version}", m.doc_id) for m in metas])
        return [self._decode_body(m, r) for m, r in zip(metas, raw)]

    @staticmethod
    def _decode_body(meta: _DocMeta, raw: bytes | None) -> _DocBody:
        if raw is None:  # replaced or deleted since its pointer was read
            raise _StaleRead(meta.doc_id)
        return _DocBody.from_bytes(raw)

    def _prepare(
        self,
        doc: Document,
        doc_id: str,
        contexts: list[ChunkContext] | None,
        chunks: list[Chunk],
        version: str,
    ) -> _Prepared:
        contexts = contexts if contexts is not None else [ChunkContext("", "none")] * len(chunks)
        if len(contexts) != len(chunks):
            raise RuntimeError(
                f"{self.enricher!r} returned {len(contexts)} contexts for {len(chunks)} chunks"
            )
        meta = _DocMeta(
            doc_id,
            version,
            dict(doc.metadata),
            [(c.start_index, c.end_index) for c in chunks],
            sum(ctx.method == "fallback" for ctx in contexts),
        )
        return _Prepared(meta, _DocBody(doc.page_content, contexts), chunks)

    def _plan(
        self, documents: Sequence[Document], ids: Sequence[str] | None
    ) -> tuple[list[str], list[tuple[Document, str, str, list[Chunk]]], list[str]]:
        """Validate, split and version (no writes).

        Returns all doc ids, the documents to (re)index, and the ids of documents
        that became empty (to remove). Documents already indexed as they are skipped.
        """
        doc_ids = self._validate_documents(documents, ids)
        old = self._get_meta(doc_ids) if doc_ids else []
        todo: list[tuple[Document, str, str, list[Chunk]]] = []
        removals: list[str] = []
        splitter = self._splitter()
        for doc, doc_id, prev in zip(documents, doc_ids, old):
            version = self._version(doc.page_content, doc.metadata)
            if prev is not None and prev.version.split(".")[0] == version:
                if not prev.fallbacks:
                    logger.debug("document %r unchanged; not re-indexed", doc_id)
                    continue
                # Unchanged, but some chunk contexts fell back: index it again (the
                # enricher's cache makes the good chunks free) under a fresh version id.
                version = f"{version}.{secrets.token_hex(4)}"
            chunks = split_text(doc.page_content, doc_id, splitter)
            if not chunks:
                logger.warning("document %r has no text; nothing indexed for it", doc_id)
                removals.append(doc_id)
                continue
            todo.append((doc, doc_id, version, chunks))
        return doc_ids, todo, removals

    def add_documents(
        self, documents: Sequence[Document], ids: Sequence[str] | None = None, **kwargs: Any
    ) -> list[str]:
        """Index long source documents; returns their doc ids.

        A document whose id is already indexed is replaced everywhere (an unchanged
        one is skipped); empty documents are skipped with a warning (and an indexed
        version of them removed). Documents are enriched, then written to the
        vector store, the BM25 index and the chunk store.
        """
        with self._write_lock:
            doc_ids, todo, removals = self._plan(documents, ids)
            prepared: list[_Prepared] = []
            with self._progress(len(todo), "enriching") as bar:
                for doc, doc_id, version, chunks in todo:
                    contexts = self.enricher.enrich(doc_id, doc.page_content, doc.metadata, chunks)
                    prepared.append(self._prepare(doc, doc_id, contexts, chunks, version))
                    bar.update(1)
            self._write(prepared, removals)
        return doc_ids

    async def aadd_documents(
        self, documents: Sequence[Document], ids: Sequence[str] | None = None, **kwargs: Any
    ) -> list[str]:
        """Async :meth:`add_documents`: enrichment runs natively async; writes in a thread."""
        doc_ids, todo, removals = await asyncio.to_thread(self._plan, documents, ids)
        prepared: list[_Prepared] = []
        with self._progress(len(todo), "enriching") as bar:
            for doc, doc_id, version, chunks in todo:
                contexts = await self.enricher.aenrich(
                    doc_id, doc.page_content, doc.metadata, chunks
                )
                prepared.append(self._prepare(doc, doc_id, contexts, chunks, version))
                bar.update(1)
        await asyncio.to_thread(self._write, prepared, removals)
        return doc_ids

    def _write(self, prepared: list[_Prepared], removals: Sequence[str] = ()) -> None:
        """New version first (vector store, BM25, text), then the pointer, then old chunks go.

        A concurrent query sees the old version until the pointer (``doc/`` record)
        is swapped, and the new version after; chunks of any other version are ignored.
        """
        with self._write_lock:
            olds = self._get_meta([p.meta.doc_id for p in prepared])
            self._write_new(prepared)
            self._remove(
                [
                    o
                    for o, p in zip(olds, prepared)
                    if o is not None and o.version != p.meta.version
                ],
                keep_pointer=True,
            )
            self._remove([m for m in self._get_meta(list(removals)) if m is not None])
            self._sync_router(prepared, removals)

    def _sync_router(self, prepared: Sequence[_Prepared], removed: Sequence[str]) -> None:
        """Upsert the leads of (re)indexed documents in the router, delete removed ones."""
        router = self.document_router
        if not self.sync_router or not isinstance(router, DocumentIndex):
            return
        if prepared:
            sources = [
                Document(page_content=p.body.text, id=p.meta.doc_id, metadata=p.meta.metadata)
                for p in prepared
            ]
            router.upsert(document_leads(sources))
        if removed:
            router.delete(list(removed))

    def _write_new(self, prepared: list[_Prepared]) -> None:
        pending: list[tuple[str, Document]] = []

        def flush() -> None:
            if pending:
                docs, ids = [d for _, d in pending], [i for i, _ in pending]
                with self._vs_lock.write():
                    self.vectorstore.add_documents(docs, ids=ids)
                if self.lexical_store is not None:
                    self.lexical_store.add_documents(docs, ids=ids)
                pending.clear()

        lexical_ids: list[str] = []
        lexical_texts: list[str] = []
        for p in prepared:
            m = p.meta
            for chunk, ctx in zip(p.chunks, p.body.contexts):
                key = chunk_key(m.doc_id, m.version, chunk.chunk_index)
                text = index_text(ctx, chunk.text)
                pending.append(
                    (
                        chunk_uuid(key),
                        Document(
                            page_content=text,
                            id=chunk_uuid(key),
                            metadata={
                                "doc_id": m.doc_id,
                                "doc_version": m.version,
                                "chunk_index": chunk.chunk_index,
                                "start_index": chunk.start_index,
                                "end_index": chunk.end_index,
                                "enrichment": ctx.method,
                            },
                        ),
                    )
                )
                lexical_ids.append(key)
                lexical_texts.append(text)
                if len(pending) >= self.index_batch_size:
                    flush()
        flush()
        if self.lexical_store is None:
            self._lexical.add(lexical_ids, lexical_texts)
        self.docstore.mset(
            [
                (_store_key(f"body/{p.meta.version}", p.meta.doc_id), p.body.to_bytes())
                for p in prepared
            ]
        )
        self.docstore.mset(
            [(_store_key("doc", p.meta.doc_id), p.meta.to_bytes()) for p in prepared]
        )
        if prepared:
            logger.info("indexed %d documents (%d chunks)", len(prepared), len(lexical_ids))

    def _remove(self, metas: Sequence[_DocMeta], keep_pointer: bool = False) -> None:
        if not metas:
            return
        keys = [chunk_key(m.doc_id, m.version, i) for m in metas for i in range(len(m.spans))]
        if not keep_pointer:
            self.docstore.mdelete([_store_key("doc", m.doc_id) for m in metas])
        self._lexical.delete(keys)
        if keys:
            ids = [chunk_uuid(k) for k in keys]
            with self._vs_lock.write():
                self.vectorstore.delete(ids=ids)
            if self.lexical_store is not None:
                self.lexical_store.delete(ids=ids)
        self.docstore.mdelete([_store_key(f"body/{m.version}", m.doc_id) for m in metas])

    def delete(self, ids: Sequence[str] | None = None, **kwargs: Any) -> DeleteResponse:
        """Remove documents (by doc id) from the vector store, BM25 index and chunk store."""
        if ids is None:
            raise ValueError(
                "delete needs a list of document ids (deleting everything is not "
                "supported; create a new retriever instead)"
            )
        if isinstance(ids, str):
            raise TypeError("delete expects a list of document ids, not a string")
        with self._write_lock:
            metas = self._get_meta(list(ids))
            self._remove([m for m in metas if m is not None])
            found = [i for i, m in zip(ids, metas) if m is not None]
            self._sync_router((), found)
        return DeleteResponse(num_deleted=len(found), succeeded=found, failed=[])

    async def adelete(self, ids: Sequence[str] | None = None, **kwargs: Any) -> DeleteResponse:
        """Async :meth:`delete` (runs in a thread)."""
        return await asyncio.to_thread(self.delete, ids)

    # DocumentIndex: lets `langchain_core.indexing.index(docs, record_manager, retriever)`
    # sync a changing source into this retriever.

    def upsert(self, items: Sequence[Document], /, **kwargs: Any) -> UpsertResponse:
        """Add or replace documents (``DocumentIndex`` API); same as :meth:`add_documents`."""
        return UpsertResponse(succeeded=self.add_documents(items), failed=[])

    async def aupsert(self, items: Sequence[Document], /, **kwargs: Any) -> UpsertResponse:
        """Async :meth:`upsert`."""
        return UpsertResponse(succeeded=await self.aadd_documents(items), failed=[])

    def get(self, ids: Sequence[str], /, **kwargs: Any) -> list[Document]:
        """The indexed source documents with these doc ids (unknown ids are skipped)."""
        metas = [m for m in self._get_meta(list(ids)) if m is not None]
        return [
            Document(page_content=body.text, metadata=dict(m.metadata), id=m.doc_id)
            for m, body in zip(metas, self._get_bodies(metas))
        ]

    # ------------------------------------------------------------------ persistence

    _SAVED_FIELDS = (
        "k", "mode", "chunk_size", "chunk_overlap", "strict_rerank", "lexical_engine",
        "fetch_k", "candidate_pool", "fusion", "weights", "rrf_k", "relevance", "preset",
        "max_queries", "max_query_chars", "max_document_chars", "index_batch_size",
        "route_documents", "route_fetch_k", "route_check_k",
    )  # fmt: skip

    def save(self, path: str | os.PathLike[str]) -> None:
        """Save the index to a directory: settings, BM25 index, chunk store, local vectors.

        JSON/NumPy/FAISS files only, no pickle. Writes are atomic: a process killed
        during ``save`` leaves the previous save loadable. A vector store other than
        FAISS or ``InMemoryVectorStore``, and a chunk store other than the in-memory
        default, persist themselves and are passed again to :meth:`load`.
        """
        from langchain_rse import persistence as ps

        with self._write_lock:
            writer = ps.IndexWriter(path)
            tokens = self._lexical.tokens()
            writer.add_bytes(
                "lexical",
                "json",
                ps._json_bytes({"keys": list(tokens), "tokens": list(tokens.values())}),
            )
            docstore_kind = "external"
            if isinstance(self.docstore, InMemoryByteStore):
                docstore_kind = "embedded"
                lines = (
                    json.dumps([key, value.decode("utf-8", "surrogatepass")], ensure_ascii=False)
                    for key, value in self.docstore.store.items()
                )
                writer.add_bytes(
                    "docstore", "jsonl", "\n".join(lines).encode("utf-8", "surrogatepass")
                )
            embeddings = getattr(self.vectorstore, "embeddings", None)
            writer.commit(
                {
                    "library_version": _library_version(),
                    "config": {
                        **{name: getattr(self, name) for name in self._SAVED_FIELDS},
                        "rse_params": asdict(self.rse_params) if self.rse_params else None,
                        "custom_splitter": self.splitter is not None,
                    },
                    "enricher": {
                        "class": type(self.enricher).__name__,
                        "repr": repr(self.enricher),
                    },
                    "embedding": {
                        "class": type(embeddings).__name__ if embeddings is not None else None,
                        "model": getattr(embeddings, "model_name", None)
                        or getattr(embeddings, "model", None),
                    },
                    "docstore": {"kind": docstore_kind, "class": type(self.docstore).__name__},
                    "lexical": {
                        "kind": "in_process" if self.lexical_store is None else "external",
                        "class": type(self.lexical_store or self._lexical).__name__,
                    },
                    "vectorstore": ps.save_vectorstore(self.vectorstore, writer),
                    "stats": {"chunks": len(tokens)},
                }
            )
        logger.info("saved index with %d chunks to %s", len(tokens), path)

    @classmethod
    def load(
        cls,
        path: str | os.PathLike[str],
        embedding: Embeddings | None = None,
        *,
        vectorstore: VectorStore | None = None,
        docstore: BaseStore[str, bytes] | None = None,
        **kwargs: Any,
    ) -> RSERetriever:
        """Load a directory written by :meth:`save`.

        ``embedding`` is needed for a saved local vector store (the bundled
        ``LocalEmbeddings`` is used when the index was built with it). Pass
        ``vectorstore`` / ``docstore`` when they were external, and any non-default
        ``enricher``, ``reranker`` or ``splitter``; other keyword arguments override
        saved settings.
        """
        from pathlib import Path

        from langchain_rse import persistence as ps

        directory = Path(path)
        manifest = ps.read_manifest(directory)
        config = dict(manifest["config"])
        if config.pop("custom_splitter", False) and "splitter" not in kwargs:
            raise ValueError("this index was built with a custom splitter; pass splitter=...")
        params = config.pop("rse_params")
        config["rse_params"] = RSEParams(**params) if params else None
        config["weights"] = tuple(config["weights"])
        enricher_class = manifest["enricher"]["class"]
        if "enricher" not in kwargs:
            from langchain_rse import enrichment

            default = getattr(enrichment, enricher_class, None)
            if enricher_class in ("NoEnricher", "HeaderEnricher") and default is not None:
                kwargs["enricher"] = default()
            else:
                logger.warning(
                    "index was built with %s; pass enricher=... to add documents the same way",
                    manifest["enricher"]["repr"],
                )
        if vectorstore is None:
            if embedding is None:
                if manifest["embedding"]["class"] != "LocalEmbeddings":
                    raise ValueError(
                        f"pass embedding=... (the index was built with "
                        f"{manifest['embedding']['class']})"
                    )
                from langchain_rse.embeddings import LocalEmbeddings

                embedding = LocalEmbeddings()
            vectorstore = ps.load_vectorstore(directory, manifest, embedding)
        if docstore is None:
            if manifest["docstore"]["kind"] != "embedded":
                raise ValueError(
                    f"this index keeps its chunks in an external {manifest['docstore']['class']}; "
                    "pass docstore=..."
                )
            docstore = InMemoryByteStore()
            raw = ps.checked_path(directory, manifest, "docstore").read_bytes()
            try:
                pairs = [
                    json.loads(line)
                    for line in raw.decode("utf-8", "surrogatepass").splitlines()
                    if line
                ]
            except (UnicodeDecodeError, json.JSONDecodeError) as exc:
                raise ps.IndexFormatError(f"chunk store file is not valid JSON: {exc}") from None
            docstore.mset([(k, v.encode("utf-8", "surrogatepass")) for k, v in pairs])
        lexical_info = manifest.get("lexical", {"kind": "in_process"})
        if lexical_info["kind"] == "external" and kwargs.get("lexical_store") is None:
            raise ValueError(
                f"this index searches an external lexical store ({lexical_info['class']}); "
                "pass lexical_store=..."
            )
        lexical = ps.load_checked_json(directory, manifest, "lexical")
        retriever = cls(vectorstore=vectorstore, docstore=docstore, **{**config, **kwargs})
        retriever._lexical.set_tokens(dict(zip(lexical["keys"], lexical["tokens"])))
        return retriever

    # ------------------------------------------------------------------ querying

    def _check_mode(self, mode: Any) -> str:
        mode = self.mode if mode is None else mode
        if mode not in ("segments", "chunks"):
            raise ValueError(f"mode must be 'segments' or 'chunks', got {mode!r}")
        return str(mode)

    def _check_query(self, query: Any, k: Any) -> tuple[str, int]:
        """The cleaned query (control characters become spaces) and the effective ``k``."""
        if not isinstance(query, str):
            raise TypeError(f"query must be a string, got {type(query).__name__}")
        if len(query) > self.max_query_chars:
            raise ValueError(
                f"query is {len(query)} characters long; the limit is max_query_chars="
                f"{self.max_query_chars}"
            )
        query = _CONTROL.sub(" ", query).encode("utf-8", "replace").decode("utf-8")
        if not query.strip():
            raise ValueError("query must be a non-empty string (got an empty or blank query)")
        k = self.k if k is None else k
        if isinstance(k, bool) or not isinstance(k, int) or k < 0:
            raise ValueError(f"k must be a non-negative integer, got {k!r}")
        return query, k

    # The protected `_similarity_search_with_relevance_scores` is the public method
    # minus its [0, 1] range warning and threshold filter: fusion only needs an order
    # (RRF) or min-max/σ normalisation, so any monotone score will do.
    @property
    def _branch_k(self) -> int:
        """Candidates fetched from each branch (more when routing filters them afterwards)."""
        if self.document_router is None:
            return self.fetch_k
        return max(self.fetch_k, self.route_fetch_k)

    def _dense(self, query: str) -> list[tuple[Document, float | None]]:
        k = self._branch_k
        with self._vs_lock.read():
            if isinstance(self.vectorstore, InMemoryVectorStore):  # scores are cosines
                return list(self.vectorstore.similarity_search_with_score(query, k=k))
            try:
                return list(self.vectorstore._similarity_search_with_relevance_scores(query, k=k))
            except NotImplementedError:
                docs = self.vectorstore.similarity_search(query, k=k)
                return [(d, None) for d in docs]

    async def _adense(self, query: str) -> list[tuple[Document, float | None]]:
        if self._local_vectorstore():  # in-process: search in a thread, under the lock
            return await asyncio.to_thread(self._dense, query)
        k = self._branch_k
        try:
            return list(
                await self.vectorstore._asimilarity_search_with_relevance_scores(query, k=k)
            )
        except NotImplementedError:
            docs = await self.vectorstore.asimilarity_search(query, k=k)
            return [(d, None) for d in docs]

    def _lexical_search(self, query: str) -> list[tuple[str, float]]:
        if self.lexical_store is None:
            return self._lexical.search(query, self._branch_k)
        hits = self.lexical_store.similarity_search_with_score(query, k=self._branch_k)
        return [(key, float(score)) for doc, score in hits if (key := _key_of(doc)) is not None]

    def _routed(self, hits: Sequence[Document]) -> set[str] | None:
        """The documents ``document_router`` chose, or None (no filter) when it found none."""
        chosen: list[str] = []
        for doc in hits:
            doc_id = doc.metadata.get("doc_id", doc.id)
            if doc_id is not None and str(doc_id) not in chosen:
                chosen.append(str(doc_id))
        if not chosen:
            logger.debug("the document router returned no documents; searching all")
            return None
        return set(chosen[: self.route_documents])

    def _confirmed(self, routed: set[str], fused: Sequence[FusedHit]) -> set[str] | None:
        """The routed documents that the unrouted search agrees with (one of their chunks is
        among its first ``route_check_k`` candidates); None, so no filter, when none is."""
        near = {parse_chunk_key(hit.id)[0] for hit in fused[: self.route_check_k]}
        kept = routed & near
        if not kept:
            logger.debug(
                "routing skipped: no chunk of %s among the top %d candidates",
                sorted(routed),
                self.route_check_k,
            )
            return None
        return kept

    def _fuse(
        self,
        dense: Sequence[list[tuple[Document, float | None]]],
        lexical: Sequence[list[tuple[str, float]]],
        routed: set[str] | None = None,
    ) -> list[_Candidate]:
        """Fuse (dense, lexical) results of each query into candidates, best first; with
        ``routed``, only chunks of those documents."""
        branches: list[list[tuple[str, float | None]]] = []
        texts: dict[str, str] = {}
        for dense_hits, lexical_hits in zip(dense, lexical):
            branch: list[tuple[str, float | None]] = []
            for doc, score in dense_hits:
                key = _key_of(doc)
                if key is None:
                    continue  # not ours (a shared vector store)
                branch.append((key, score))
                texts[key] = doc.page_content
            branches += [branch, list(lexical_hits)]
        weights = list(self.weights) * len(dense)
        fused = fuse(branches, weights, self.fusion, self.rrf_k)
        if routed is not None and self.route_check_k is not None:
            routed = self._confirmed(routed, fused)
        if routed is not None:
            kept = [[h for h in b if parse_chunk_key(h[0])[0] in routed] for b in branches]
            if any(kept):
                fused = fuse(kept, weights, self.fusion, self.rrf_k)
            else:  # not ours, or not found by either branch: a filter would return nothing
                logger.debug("no candidates in the routed documents %s; searching all", routed)
        pool = self.candidate_pool + (len(dense) - 1) * (self.candidate_pool // 2)
        out = []
        for hit in fused[:pool]:
            doc_id, version, idx = parse_chunk_key(hit.id)
            out.append(_Candidate(hit.id, doc_id, version, idx, hit, texts.get(hit.id)))
        return out

    @staticmethod
    def _current(cands: list[_Candidate], metas: dict[str, _DocMeta]) -> list[_Candidate]:
        """Drop candidates of deleted or replaced document versions."""
        return [
            c
            for c in cands
            if (m := metas.get(c.doc_id)) is not None
            and m.version == c.version
            and c.chunk_index < len(m.spans)
        ]

    def _rerank_inputs(
        self, cands: list[_Candidate], bodies: dict[str, _DocBody], metas: dict[str, _DocMeta]
    ) -> list[Document]:
        docs = []
        for c in cands:
            if c.text is None:
                body = bodies[c.doc_id]
                start, end = metas[c.doc_id].spans[c.chunk_index]
                c.text = index_text(body.contexts[c.chunk_index], body.text[start:end])
            docs.append(Document(page_content=c.text, metadata={"chunk_id": chunk_uuid(c.key)}))
        return docs

    def _apply_relevance(
        self, cands: list[_Candidate], results: list[RerankResult] | None
    ) -> list[_Candidate]:
        """Set each candidate's relevance: reranked (best over queries) or from fusion."""
        if results is None:
            if self.relevance == "score":
                top = max(c.fused.score for c in cands) or 1.0
                for c in cands:
                    c.relevance = c.fused.score / top
            else:
                for c, rel in zip(cands, rank_relevance(len(cands), self.params.decay_rate)):
                    c.relevance = float(rel)
            return cands
        kept: dict[int, _Candidate] = {}
        for result in results:
            for idx, score, rel in zip(result.indices, result.scores, result.relevance):
                c = cands[idx]
                if idx not in kept or rel > c.relevance:
                    c.rerank_score, c.relevance = float(score), float(rel)
                kept[idx] = c
        return sorted(kept.values(), key=lambda c: -c.relevance)

    def _results(
        self,
        cands: list[_Candidate],
        metas: dict[str, _DocMeta],
        bodies: dict[str, _DocBody],
        selection: list[tuple[str, int, int, float]],
        mode: str,
        queries: list[str],
        fallback: bool,
    ) -> list[Document]:
        by_key = {(c.doc_id, c.chunk_index): c for c in cands}
        out = []
        for doc_id, start, end, score in selection:
            meta, body = metas[doc_id], bodies[doc_id]
            s, e = meta.spans[start][0], meta.spans[end - 1][1]
            md: dict[str, Any] = dict(meta.metadata)
            md.update(
                doc_id=doc_id,
                start_index=s,
                end_index=e,
                chunk_start=start,
                chunk_end=end,
                score=score,
            )
            if mode == "chunks":
                c = by_key[(doc_id, start)]
                md.update(
                    chunk_index=start,
                    fused_score=c.fused.score,
                    dense_rank=c.fused.ranks[0],
                    lexical_rank=c.fused.ranks[1],
                    context=body.contexts[start].text,
                )
                if c.rerank_score is not None:
                    md["rerank_score"] = c.rerank_score
            if len(queries) > 1:
                # Which queries found this result, and their best rank in either branch.
                hits: dict[str, int] = {}
                for i in range(start, end):
                    hit = by_key.get((doc_id, i))
                    for q_index, query in enumerate(queries):
                        ranks = [r for r in hit.fused.ranks[2 * q_index : 2 * q_index + 2]
                                 if r is not None] if hit else []  # fmt: skip
                        if ranks and min(ranks) < hits.get(query, 1 << 30):
                            hits[query] = min(ranks)
                md.update(queries=list(queries), query_ranks=hits)
            if fallback:
                md["rerank_fallback"] = True
            out.append(Document(page_content=body.text[s:e], metadata=md))
        return out

    def _select(
        self, cands: list[_Candidate], metas: dict[str, _DocMeta], k: int, mode: str, n_queries: int
    ) -> list[tuple[str, int, int, float]]:
        """The chosen (doc_id, chunk_start, chunk_end, score), best first."""
        if mode == "chunks":
            ranked = sorted(cands, key=lambda c: -c.relevance)
            return [(c.doc_id, c.chunk_index, c.chunk_index + 1, c.relevance) for c in ranked[:k]]
        p = self.params
        docs = list(dict.fromkeys(c.doc_id for c in cands))
        position = {d: i for i, d in enumerate(docs)}
        values, offsets = chunk_values(
            [len(metas[d].spans) for d in docs],
            ((position[c.doc_id], c.chunk_index, c.relevance) for c in cands),
            p.irrelevant_chunk_penalty,
        )
        budget = p.max_total_chunks + (n_queries - 1) * p.extra_query_chunks
        segs = best_segments(values, offsets, p.max_segment_chunks, budget, p.min_segment_value)
        return [(docs[s.doc], s.start, s.end, s.value) for s in segs[:k]]

    def _local_vectorstore(self) -> bool:
        from langchain_rse.persistence import vectorstore_kind

        return vectorstore_kind(self.vectorstore) != "external"

    # The query path after search is written once, as a generator that yields its I/O
    # requests; `_drive` and `_adrive` carry them out synchronously or asynchronously.

    def _pipeline(
        self, queries: list[str], cands: list[_Candidate], k: int, mode: str
    ) -> Generator[tuple[str, Any], Any, list[Document]]:
        if not cands:
            return []
        doc_ids = list(dict.fromkeys(c.doc_id for c in cands))
        metas = {m.doc_id: m for m in (yield ("meta", doc_ids)) if m is not None}
        cands = self._current(cands, metas)
        if not cands:
            return []
        bodies: dict[str, _DocBody] = {}
        results: list[RerankResult] | None = None
        fallback = False
        if self.reranker is not None:
            need = [metas[d] for d in dict.fromkeys(c.doc_id for c in cands if c.text is None)]
            bodies.update(zip((m.doc_id for m in need), (yield ("bodies", need))))
            try:
                results = yield ("rerank", (queries, self._rerank_inputs(cands, bodies, metas)))
            except RerankError as exc:
                if self.strict_rerank:
                    raise
                logger.warning("reranker failed (%s); using the fused ranking instead", exc)
                fallback = True
        cands = self._apply_relevance(cands, results)
        selection = self._select(cands, metas, k, mode, len(queries))
        need = [metas[d] for d in dict.fromkeys(s[0] for s in selection) if d not in bodies]
        bodies.update(zip((m.doc_id for m in need), (yield ("bodies", need))))
        return self._results(cands, metas, bodies, selection, mode, queries, fallback)

    def _drive(self, queries: list[str], fused: list[_Candidate], k: int, mode: str,
               callbacks: Any) -> list[Document]:  # fmt: skip
        for _ in range(_READ_ATTEMPTS):
            gen = self._pipeline(queries, list(fused), k, mode)
            try:
                request = next(gen)
                while True:
                    kind, arg = request
                    if kind == "meta":
                        request = gen.send(self._get_meta(arg))
                    elif kind == "bodies":
                        request = gen.send(self._get_bodies(arg))
                    else:
                        try:
                            reply = [self.reranker.rerank(q, arg[1], callbacks=callbacks)  # type: ignore[union-attr]
                                     for q in arg[0]]  # fmt: skip
                        except RerankError as exc:
                            request = gen.throw(exc)
                        else:
                            request = gen.send(reply)
            except StopIteration as done:
                return done.value  # type: ignore[no-any-return]
            except _StaleRead as exc:
                logger.debug("document %s changed during a query; re-reading", exc)
        raise RuntimeError("the chunk store keeps losing documents during this query")

    async def _adrive(self, queries: list[str], fused: list[_Candidate], k: int, mode: str,
                      callbacks: Any) -> list[Document]:  # fmt: skip
        for _ in range(_READ_ATTEMPTS):
            gen = self._pipeline(queries, list(fused), k, mode)
            try:
                request = next(gen)
                while True:
                    kind, arg = request
                    if kind == "meta":
                        request = gen.send(await self._aget_meta(arg))
                    elif kind == "bodies":
                        request = gen.send(await self._aget_bodies(arg))
                    else:
                        try:
                            reply = await asyncio.gather(*(
                                self.reranker.arerank(q, arg[1], callbacks=callbacks)  # type: ignore[union-attr]
                                for q in arg[0]
                            ))  # fmt: skip
                        except RerankError as exc:
                            request = gen.throw(exc)
                        else:
                            request = gen.send(list(reply))
            except StopIteration as done:
                return done.value  # type: ignore[no-any-return]
            except _StaleRead as exc:
                logger.debug("document %s changed during a query; re-reading", exc)
        raise RuntimeError("the chunk store keeps losing documents during this query")

    def _query_set(self, query: str, queries: Any, expansions: list[str]) -> list[str]:
        """The original query first, then extra and expanded queries, deduplicated."""
        extra: list[str] = []
        if queries is not None:
            if isinstance(queries, str) or not isinstance(queries, (list, tuple)):
                raise TypeError("queries must be a list of strings")
            extra = [self._check_query(q, 0)[0] for q in queries]
        out: list[str] = []
        for q in [query, *extra, *expansions]:
            if q.strip().casefold() not in {o.strip().casefold() for o in out}:
                out.append(q)
        return out[: self.max_queries]

    def _get_relevant_documents(
        self,
        query: str,
        *,
        run_manager: CallbackManagerForRetrieverRun,
        k: int | None = None,
        mode: Literal["segments", "chunks"] | None = None,
        queries: list[str] | None = None,
        **kwargs: Any,
    ) -> list[Document]:
        query, k = self._check_query(query, k)
        checked_mode = self._check_mode(mode)
        if k == 0:
            return []
        callbacks = run_manager.get_child()
        expansions = (
            self.query_expander.expand(query, callbacks=callbacks)
            if self.query_expander is not None
            else []
        )
        all_queries = self._query_set(query, queries, expansions)
        config: RunnableConfig = {"callbacks": callbacks}
        routed = None
        if self.document_router is not None:
            routed = self._routed(self.document_router.invoke(query, config))
        dense_search, lexical_search = self._searches
        dense = [dense_search.invoke(q, config) for q in all_queries]
        lexical = [lexical_search.invoke(q, config) for q in all_queries]
        fused = self._fuse(dense, lexical, routed)
        return self._drive(all_queries, fused, k, checked_mode, callbacks)

    async def _aget_relevant_documents(
        self,
        query: str,
        *,
        run_manager: AsyncCallbackManagerForRetrieverRun,
        k: int | None = None,
        mode: Literal["segments", "chunks"] | None = None,
        queries: list[str] | None = None,
        **kwargs: Any,
    ) -> list[Document]:
        query, k = self._check_query(query, k)
        checked_mode = self._check_mode(mode)
        if k == 0:
            return []
        callbacks = run_manager.get_child()
        expansions = (
            await self.query_expander.aexpand(query, callbacks=callbacks)
            if self.query_expander is not None
            else []
        )
        all_queries = self._query_set(query, queries, expansions)
        config: RunnableConfig = {"callbacks": callbacks}
        dense_search, lexical_search = self._searches
        n = len(all_queries)
        router = self.document_router
        found = await asyncio.gather(
            *(dense_search.ainvoke(q, config) for q in all_queries),
            *(lexical_search.ainvoke(q, config) for q in all_queries),
            *([router.ainvoke(query, config)] if router is not None else []),
        )
        routed = self._routed(found[2 * n]) if router is not None else None
        fused = self._fuse(found[:n], found[n : 2 * n], routed)
        return await self._adrive(all_queries, fused, k, checked_mode, callbacks)
