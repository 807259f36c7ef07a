"""The two search branches: dense (any ``VectorStore``) and lexical (the in-process BM25
index or an external lexical store). Each returns ``(chunk key, score)`` pairs, best first.

Each search, and the document route, is an *internal* child run in LangChain's callbacks
(a chain run named ``dense_search``, ``lexical_search`` or ``rse.route``, never a
retriever run): its inputs are the query and the filter, its outputs ids and scores only —
of the documents the filter allows — never document text (see :func:`child_run`).
The protected ``_similarity_search_with_relevance_scores`` is the public method minus its
[0, 1] range warning and threshold filter: fusion only needs an order (RRF) or a
normalisation, so any monotone score will do.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol, TypedDict, TypeVar

from langchain_core.callbacks import AsyncCallbackManager, CallbackManager, Callbacks
from langchain_core.documents import Document
from langchain_core.runnables import RunnableConfig
from langchain_core.vectorstores import InMemoryVectorStore, VectorStore

from langchain_rse.filters import (
    Filter,
    FilterError,
    Translator,
    both,
    matches,
    parse,
    search_kwargs,
    to_dict,
)
from langchain_rse.indexing.records import chunk_key, parse_chunk_key
from langchain_rse.indexing.recordstore import ReadWriteLock
from langchain_rse.integrations import vectorstore_kind
from langchain_rse.integrations.faiss import FaissStore, one_thread
from langchain_rse.lexical import BM25Index
from langchain_rse.query import DenseResult, Hit, Route

__all__ = [
    "SearchBranches",
    "SearchRequest",
    "achild_run",
    "child_run",
    "is_local",
    "key_of",
    "ls_params",
    "sync_only",
]

logger = logging.getLogger(__name__)


def key_of(chunk: Document) -> str | None:
    """The chunk key of a search hit written by this retriever; None for foreign documents."""
    m = chunk.metadata
    if "doc_id" not in m or "chunk_index" not in m or "doc_version" not in m:
        return None
    return chunk_key(str(m["doc_id"]), str(m["doc_version"]), int(m["chunk_index"]))


def is_local(vectorstore: VectorStore) -> bool:
    """An in-process store (FAISS, in-memory) that must not be searched while written."""
    return vectorstore_kind(vectorstore) != "external"


def _keyed(
    hits: Sequence[tuple[Document, float | None]], f: Filter | None
) -> tuple[list[Hit], dict[str, str]]:
    """The hits written by this retriever that ``f`` allows (each chunk carries its
    document's scalar metadata and ``doc_id``), as chunk keys, and their texts. A store
    may filter less than asked (a partial ``filter_translator``): what it let through
    never reaches a callback, a trace or the candidates."""
    out: list[Hit] = []
    texts: dict[str, str] = {}
    for doc, score in hits:
        key = key_of(doc)
        if key is not None and matches(f, doc.metadata):  # not ours (a shared store) otherwise
            out.append((key, score))
            if doc.page_content:  # the default store keeps no text: read from the records
                texts[key] = doc.page_content
    return out, texts


def ls_params(vectorstore: VectorStore) -> dict[str, str]:
    """LangSmith's retriever parameters that describe ``vectorstore`` and its embeddings."""
    params = {"ls_vector_store_provider": type(vectorstore).__name__}
    embeddings = getattr(vectorstore, "embeddings", None)
    if embeddings is not None:
        params["ls_embedding_provider"] = type(embeddings).__name__
        model = getattr(embeddings, "model", None) or getattr(embeddings, "model_name", None)
        if isinstance(model, str):
            params["ls_embedding_model"] = model
    return params


@contextmanager
def _one_faiss_thread(vectorstore: VectorStore) -> Iterator[None]:
    """LangChain's ``FAISS`` searched on one OpenMP thread, as :class:`FaissStore` is (see
    :mod:`langchain_rse.integrations.faiss`); no change for other stores."""
    faiss = sys.modules.get("faiss")  # a FAISS index exists only once faiss is imported
    if faiss is None or not isinstance(getattr(vectorstore, "index", None), faiss.Index):
        yield
        return
    with one_thread():
        yield


def sync_only(vectorstore: VectorStore) -> bool:
    """A store whose client is synchronous only, so its async search methods fail.

    ``langchain_postgres.PGVector`` on a sync engine (``async_mode`` False) asserts in
    every ``a*`` method instead of falling back to a thread as ``VectorStore`` does.
    """
    return getattr(vectorstore, "async_mode", None) is False


Found = tuple[list[DenseResult], list[Sequence[Hit]], "Route | None"]
"""Each query's dense and lexical results, and the router's route (None: no route)."""
Focused = tuple[str, DenseResult, Sequence[Hit]]
"""A focus search: the focus text, its dense and its lexical results."""


class SearchRequest(TypedDict):
    """The input of a branch: one query, and the filter pushed down into the search."""

    query: str
    filter: Filter | None


def _dense_kwargs(
    vs: VectorStore, f: Filter | None, translator: Translator | None, k: int
) -> dict[str, Any]:
    kwargs = search_kwargs(vs, f, translator)
    if f is not None and hasattr(vs, "index") and hasattr(vs.index, "ntotal"):
        # FAISS filters after fetching `fetch_k` (20) neighbours: fetch them all, so a
        # selective filter still gets k results.
        kwargs.setdefault("fetch_k", max(k, int(vs.index.ntotal)))
    return kwargs


def _within(f: Filter | None, docs: set[str]) -> Filter:
    """``f`` and "the chunk belongs to one of ``docs``"."""
    ids = sorted(docs)
    inside = parse({"doc_id": ids[0] if len(ids) == 1 else {"$in": ids}})
    out = both(f, inside)
    assert out is not None
    return out


class Router(Protocol):
    """What the searches ask of a document router
    (:class:`~langchain_rse.routing.DocumentRouter`)."""

    def route(
        self,
        query: str,
        config: RunnableConfig | None = None,
        filter: Filter | None = None,
        *,
        callbacks: Callbacks = None,
    ) -> Route | None: ...

    async def aroute(
        self,
        query: str,
        config: RunnableConfig | None = None,
        filter: Filter | None = None,
        *,
        callbacks: Callbacks = None,
    ) -> Route | None: ...

    def focus_query(
        self, query: str, routed: set[str], filter: Filter | None = None
    ) -> str | None: ...


@dataclass
class SearchBranches:
    """The dense and lexical searches of one retriever configuration."""

    vectorstore: VectorStore
    lexical: BM25Index
    lexical_store: VectorStore | None
    lock: ReadWriteLock
    k: int
    translator: Translator | None = None
    """A custom filter translation, for stores :mod:`langchain_rse.filters` does not know."""
    before_lexical: Callable[[], None] | None = None
    """Called before each in-process lexical search (a shared index's generation check)."""

    def dense(self, request: SearchRequest, callbacks: Callbacks = None) -> DenseResult:
        vs, k, query = self.vectorstore, self.k, request["query"]
        if isinstance(vs, FaissStore):  # the default store: chunk keys and scores only
            with self.lock.read():
                return DenseResult(vs.ranked(query, k, request["filter"]))
        f = request["filter"]
        kw = _dense_kwargs(vs, f, self.translator, k)
        with self.lock.read(), _one_faiss_thread(vs):
            if isinstance(vs, InMemoryVectorStore):  # no relevance function; scores are cosines
                found = list(vs.similarity_search_with_score(query, k, **kw))
                return DenseResult(*_keyed(found, f))
            hits: list[tuple[Document, float | None]]
            try:
                hits = list(vs._similarity_search_with_relevance_scores(query, k=k, **kw))
            except NotImplementedError:
                hits = [(d, None) for d in vs.similarity_search(query, k=k, **kw)]
        return DenseResult(*_keyed(hits, f))

    async def adense(self, request: SearchRequest, callbacks: Callbacks = None) -> DenseResult:
        if self.lock.enabled or sync_only(self.vectorstore):
            # in process (under the lock), or a client without async search: in a thread
            return await asyncio.to_thread(self.dense, request)
        vs, k, query, f = self.vectorstore, self.k, request["query"], request["filter"]
        kw = _dense_kwargs(vs, f, self.translator, k)
        hits: list[tuple[Document, float | None]]
        try:
            hits = list(await vs._asimilarity_search_with_relevance_scores(query, k=k, **kw))
        except NotImplementedError:
            hits = [(d, None) for d in await vs.asimilarity_search(query, k=k, **kw)]
        return DenseResult(*_keyed(hits, f))

    def search(
        self,
        queries: list[str],
        f: Filter | None,
        router: Router | None = None,
        callbacks: Callbacks = None,
    ) -> Found:
        """Both branches for every query, then ``router``'s route for the first (the
        original) query, in turn, each an internal child run under ``callbacks``
        (:func:`child_run`). The route sees only what ``f`` allows."""
        requests = [SearchRequest(query=q, filter=f) for q in queries]
        dense: list[DenseResult] = []
        lexical: list[Sequence[Hit]] = []
        for r in requests:  # (a loop, not a comprehension: no frame of its own)
            dense.append(
                child_run(callbacks, "dense_search", _inputs(r), _dense_outputs, self.dense, r)
            )
        for r in requests:
            lexical.append(
                child_run(
                    callbacks, "lexical_search", _inputs(r), _hit_outputs, self.lexical_search, r
                )
            )
        route = None
        if router:
            route = child_run(
                callbacks,
                "rse.route",
                _inputs(requests[0]),
                _route_outputs,
                router.route,
                queries[0],
                None,
                f,
            )
        return dense, lexical, route

    async def asearch(
        self,
        queries: list[str],
        f: Filter | None,
        router: Router | None = None,
        callbacks: Callbacks = None,
    ) -> Found:
        """Async :meth:`search`: every search at once, each an internal child run."""
        requests = [SearchRequest(query=q, filter=f) for q in queries]
        n = len(requests)
        found: list[Any] = await asyncio.gather(
            *(
                achild_run(callbacks, "dense_search", _inputs(r), _dense_outputs, self.adense, r)
                for r in requests
            ),
            *(
                achild_run(
                    callbacks, "lexical_search", _inputs(r), _hit_outputs, self.alexical_search, r
                )
                for r in requests
            ),
            *(
                [
                    achild_run(
                        callbacks,
                        "rse.route",
                        _inputs(requests[0]),
                        _route_outputs,
                        router.aroute,
                        queries[0],
                        None,
                        f,
                    )
                ]
                if router
                else []
            ),
        )
        return list(found[:n]), list(found[n : 2 * n]), found[2 * n] if router else None

    def focus(
        self,
        query: str,
        routed: set[str],
        f: Filter | None,
        router: Router,
        callbacks: Callbacks = None,
    ) -> Focused | None:
        """The text of ``router.focus_query(query, routed, f)`` (the query without the words
        that name the routed documents, weighed among those ``f`` allows) and both
        branches for it, filtered to those documents; None when there is no such text (see
        ``DocumentRouter.focus``)."""
        text = router.focus_query(query, routed, f)
        within = None if text is None else self._filterable(_within(f, routed))
        if text is None or within is None:
            return None
        dense, lexical, _ = self.search([text], within, None, callbacks)
        return text, dense[0], lexical[0]

    async def afocus(
        self,
        query: str,
        routed: set[str],
        f: Filter | None,
        router: Router,
        callbacks: Callbacks = None,
    ) -> Focused | None:
        """Async :meth:`focus`."""
        text = router.focus_query(query, routed, f)
        within = None if text is None else self._filterable(_within(f, routed))
        if text is None or within is None:
            return None
        dense, lexical, _ = await self.asearch([text], within, None, callbacks)
        return text, dense[0], lexical[0]

    def _filterable(self, f: Filter) -> Filter | None:
        """``f`` when both stores can take it, else None (and a log line): focus needs a
        ``doc_id`` filter, a query without one does not, so it must not fail for lack of it."""
        try:
            search_kwargs(self.vectorstore, f, self.translator)
            if self.lexical_store is not None:
                search_kwargs(self.lexical_store, f, self.translator)
        except FilterError as exc:
            logger.info("no focus search: %s", exc)
            return None
        return f

    async def alexical_search(
        self, request: SearchRequest, callbacks: Callbacks = None
    ) -> Sequence[Hit]:
        """Async :meth:`lexical_search` (in a thread)."""
        return await asyncio.to_thread(self.lexical_search, request)

    def lexical_search(self, request: SearchRequest, callbacks: Callbacks = None) -> Sequence[Hit]:
        f, query = request["filter"], request["query"]
        if self.lexical_store is None:
            if self.before_lexical is not None:
                self.before_lexical()
            return self.lexical.search(query, self.k, f)
        kw = search_kwargs(self.lexical_store, f, self.translator)
        hits = self.lexical_store.similarity_search_with_score(query, k=self.k, **kw)
        return _keyed([(doc, float(score)) for doc, score in hits], f)[0]


T = TypeVar("T")


def child_run(
    callbacks: Callbacks,
    name: str,
    inputs: dict[str, Any],
    outputs: Callable[[Any], dict[str, Any]],
    call: Callable[..., T],
    *args: object,
) -> T:
    """``call(*args, callbacks=child callbacks)`` as an internal child run under ``callbacks``: a
    chain run named ``name`` whose handlers see ``inputs`` and ``outputs(result)``, never
    the result itself (which may hold document text)."""
    run = CallbackManager.configure(callbacks).on_chain_start(None, inputs, name=name)
    try:
        result = call(*args, callbacks=run.get_child())
    except BaseException as exc:
        run.on_chain_error(exc)
        raise
    run.on_chain_end(outputs(result))
    return result


async def achild_run(
    callbacks: Callbacks,
    name: str,
    inputs: dict[str, Any],
    outputs: Callable[[Any], dict[str, Any]],
    call: Callable[..., Awaitable[T]],
    *args: object,
) -> T:
    """Async :func:`child_run`."""
    run = await AsyncCallbackManager.configure(callbacks).on_chain_start(None, inputs, name=name)
    try:
        result = await call(*args, callbacks=run.get_child())
    except BaseException as exc:
        await run.on_chain_error(exc)
        raise
    await run.on_chain_end(outputs(result))
    return result


def _inputs(request: SearchRequest) -> dict[str, Any]:
    f = request["filter"]
    return {"query": request["query"], "filter": None if f is None else to_dict(f)}


def _hit_outputs(hits: Sequence[Hit]) -> dict[str, Any]:
    """A branch's hits as its run shows them: ``[doc id, chunk index, score]``, best first."""
    return {"hits": [[*parse_chunk_key(key)[::2], score] for key, score in hits]}


def _dense_outputs(result: DenseResult) -> dict[str, Any]:
    return _hit_outputs(result.hits)


def _route_outputs(route: Route | None) -> dict[str, Any]:
    return {"documents": None if route is None else sorted(route.docs)}
