"""Document routing: a document-level retriever picks the documents a query is about, and
the chunk search favours their candidates (or keeps only them) — if the unrouted search
agrees (:class:`DocumentRouter` decides whether a route holds).

Most retrieval errors on long-document corpora are chunks from the wrong document: a clause
of the right kind from another contract (Reuter et al. 2025, LegalBench-RAG).
:class:`LeadIndex`, the built-in document-level retriever, holds one short *lead* per
document — for a contract its name, parties and date; for a report its title and abstract —
searched with BM25 and kept in step with the chunks by the retriever.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import math
import re
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from langchain_core.callbacks import CallbackManagerForRetrieverRun, Callbacks
from langchain_core.documents import Document
from langchain_core.indexing import DeleteResponse, DocumentIndex, UpsertResponse
from langchain_core.retrievers import BaseRetriever
from langchain_core.runnables import RunnableConfig
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, model_validator

from langchain_rse.filters import Filter, matches, parse, to_dict
from langchain_rse.indexing.chunking import doc_id_for, document_leads
from langchain_rse.indexing.records import (
    chunk_key,
    compressed,
    decompressed,
    doc_of,
    parse_chunk_key,
)
from langchain_rse.lexical import BM25Index, group_of
from langchain_rse.lexical.tokenizer import tokenize

__all__ = [
    "DEFAULT_BOOST",
    "MAX_CLAUSES",
    "DocumentRouter",
    "LeadIndex",
    "as_router",
    "query_clauses",
    "query_coverage",
]

DEFAULT_MARGIN = 0.25
"""The confidence margin of :attr:`DocumentRouter.margin` (see ``benchmarks/RESULTS.md``)."""
DEFAULT_MIN_NAMING = 1.5
"""The name weight a query must give a lead to route (:attr:`DocumentRouter.min_naming`):
a word no other lead holds and half as much again (chosen on CUAD dev's phrasing families,
checked on COVID-QA dev and the code set: ``benchmarks/RESULTS.md``)."""
UNIQUE_TERM = 0.9
"""A query names a document only if it holds a term of its lead this (nearly) unique (see
:meth:`LeadIndex.naming_weight`): among 50 leads, a term one lead holds weighs 1, one two
leads hold 0.72."""
DEFAULT_BOOST = 2.0
"""The default router's boost (chosen on CUAD dev and the Anthropic code set)."""
MAX_CLAUSES = 8
"""Clauses (and comma-separated parts of a naming question) of one query that routing
weighs: the first ones, where a question names its document. The rest stay in the focus
text but are not searched one by one, so a query of thousands of clauses (``17; 17; ...``)
costs as much as one of eight."""

logger = logging.getLogger(__name__)

_CLAUSE_END = re.compile(r";|(?<=[.?!])\s+(?=[A-Z])|\n")
"""Where a query's clauses end: a semicolon, a sentence end before a capital letter (not
the full stop of ``Inc. and``), a line break."""


def query_clauses(query: str) -> list[str]:
    """The clauses of ``query`` (see ``_CLAUSE_END``), stripped, empty ones dropped:
    ``"Consider the Supply Agreement between Acme and Beta; The date of the contract"``
    has two."""
    return [c for c in (part.strip() for part in _CLAUSE_END.split(query)) if c]


class LeadIndex(DocumentIndex):
    """An in-process BM25 index of document leads, as a LangChain ``DocumentIndex``.

    It holds one short text per document (:func:`~langchain_rse.indexing.chunking.document_leads`:
    ``metadata["title"]`` and the first 2,000 characters) and is rebuilt from the record
    store when another worker changed it. Results carry ``metadata["doc_id"]`` and
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
    """Per doc id, the lead's text (compressed: only ``get`` and ``invoke`` read it), metadata."""
    _lock: threading.Lock = PrivateAttr(default_factory=threading.Lock)
    _before_search: Callable[[], None] | None = PrivateAttr(default=None)
    """Set by the owning retriever: its shared index's generation check."""

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
            bm25.add(
                keys,
                [_text(packed) for packed, _ in self._leads.values()],
                {group_of(k): m for k, (_, m) in zip(keys, self._leads.values())},
            )
            self._bm25 = bm25

    def add_sources(self, sources: Iterable[Document]) -> None:
        """Index (or replace) the leads of these source documents."""
        self.upsert(document_leads(sources))

    def upsert(self, items: Sequence[Document], /, **kwargs: object) -> UpsertResponse:
        """Add or replace lead documents (their ids are doc ids; their metadata is what a
        search's filter is checked against)."""
        ids = [doc_id_for(d) for d in items]
        metas = [dict(d.metadata) for d in items]
        keys = [_key(i) for i in ids]
        with self._lock:
            self._leads.update(
                (i, (_packed(d.page_content), m)) for i, d, m in zip(ids, items, metas)
            )
            self._bm25.add(
                keys, [d.page_content for d in items], {group_of(k): m for k, m in zip(keys, metas)}
            )
        return UpsertResponse(succeeded=ids, failed=[])

    def delete(self, ids: list[str] | None = None, **kwargs: object) -> DeleteResponse:
        """Remove the leads of these doc ids (unknown ids are ignored)."""
        if ids is None:
            raise ValueError("delete needs a list of document ids")
        with self._lock:
            found = [i for i in ids if self._leads.pop(i, None) is not None]
            self._bm25.delete([_key(i) for i in found])
        return DeleteResponse(num_deleted=len(found), succeeded=found, failed=[])

    def get(self, ids: Sequence[str], /, **kwargs: object) -> list[Document]:
        """The leads of these doc ids (unknown ids are skipped)."""
        return [lead for i in ids if (lead := self._lead(i)) is not None]

    def _lead(self, doc_id: str, **extra: object) -> Document | None:
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
        before = self._before_search  # a private attribute: read once
        if before is not None:
            before()
        return self._hits(query, filter)

    def part_scores(self, parts: list[str], routed: set[str], f: Filter | None) -> list[float]:
        """Each part of a query's best lead score among the ``routed`` documents (0: no
        match), searching the leads ``f`` allows (no generation check: the query's search
        made it)."""
        return [max((s for d, s in self._hits(p, f) if d in routed), default=0.0) for p in parts]

    def check_before_search(self, check: Callable[[], None] | None) -> None:
        """Run ``check`` before each search (the owning retriever sets its shared index's
        generation check; None: none)."""
        self._before_search = check

    def _hits(self, query: str, filter: Filter | None) -> list[tuple[str, float]]:
        """:meth:`hits` without the shared store's generation check (done once per query)."""
        leads = self._leads
        allowed = None if filter is None else (lambda metadata: matches(filter, metadata))
        found = ((doc_of(key), score) for key, score in self._bm25.search(query, self.k, allowed))
        return [(d, score) for d, score in found if d in leads]

    def naming_weight(self, query: str, doc_id: str) -> float:
        """How strongly ``query`` names the document ``doc_id``: over the query's distinct
        terms that its lead holds, the sum of each term's weight, ``(its IDF over the leads
        / the IDF of a term that one lead alone holds) ** 2``: about 1 for a word no other
        lead holds (a party's name), little for one many leads hold (``contract``,
        ``date``, ``transmission``). 0 unless one of the terms is (nearly) unique to this
        lead (weight :data:`UNIQUE_TERM` or more). A query that names a document by its
        title or parties scores about one per name word, wherever the name stands and
        however much else the question says."""
        found = self._leads.get(doc_id)
        n = len(self._leads)
        if found is None or n == 0:
            return 0.0
        held = set(tokenize(_text(found[0]), self._bm25.stemmer)) & set(
            tokenize(query, self._bm25.stemmer)
        )
        unique = math.log1p((n - 0.5) / 1.5)  # the IDF of a term one lead alone holds
        weights = [(w / unique) ** 2 for w in self._bm25.idf(held).values()]
        return sum(weights) if max(weights, default=0.0) >= UNIQUE_TERM else 0.0

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


class DocumentRouter(BaseModel):
    """Routes each query to the documents it names.

    ``retriever`` is any LangChain retriever whose results carry ``metadata["doc_id"]`` (or
    an ``id``) of indexed documents. The default, :meth:`leads`, is the retriever's own
    :class:`~langchain_rse.routing.LeadIndex` (BM25 over each document's title and
    opening, kept in step with the index) with a soft ``boost``: the chosen document's
    chunks are favoured, the others still compete. Any retriever can be used instead, e.g.
    an ``RSERetriever`` in chunks mode over :func:`~langchain_rse.indexing.chunking.document_leads`
    with dense search too::

        leads = RSERetriever(vectorstore=InMemoryVectorStore(emb), mode="chunks",
                             enricher=NoEnricher())
        retriever = RSERetriever(vectorstore=vs, router=DocumentRouter(retriever=leads, sync=True))

    Pass ``router=None`` to turn routing off.

    Under a metadata filter (a retriever bound to a tenant, or ``invoke(filter=...)``) the
    router sees only what the filter allows: the built-in lead index applies it before its
    top ``k``, an ``RSERetriever`` router is invoked with it (:func:`document_leads` carry
    the documents' scalar metadata), and any other router retriever, which cannot be given
    the filter, is not asked at all (no route: a document outside the filter must neither
    take the route nor be seen by that retriever's callbacks).
    """

    model_config = ConfigDict(arbitrary_types_allowed=True, extra="forbid", frozen=True)

    retriever: BaseRetriever
    """The document-level retriever."""
    documents: int = Field(default=1, ge=1)
    """Documents kept: the first ``documents`` distinct doc ids it returns."""
    check_k: int | None = Field(default=10, ge=1)
    """A routed document is kept only if one of its chunks is among the first ``check_k``
    candidates of the unrouted search; when none is, nothing is filtered (the router was
    probably wrong: on CUAD the check recovers most misrouted queries). None: always."""
    sync: bool = False
    """Keep the router in step with the index: adding, replacing and deleting documents
    upserts and deletes their leads there too (the retriever must be a ``DocumentIndex``)."""
    margin: float = Field(default=DEFAULT_MARGIN, ge=0)
    """Route only when the router is sure: where its results carry
    ``metadata["bm25_score"]`` (the built-in lead index does), the first document's score
    must be at least ``1 + margin`` times the second's. Similar documents a query does not
    tell apart (contracts from one template, asked about an order number) are not routed."""
    min_naming: float = Field(default=DEFAULT_MIN_NAMING, ge=0)
    """Route only to a document the query names: the built-in lead index's first document
    must have a :meth:`~langchain_rse.routing.LeadIndex.naming_weight` of at least this —
    about this many words of the query that few other leads hold, one of them held by its
    lead alone. The weight does not depend on where the name stands or how long the
    question is, so ``"Consider the Supply Agreement between Orion Holdings and Lyra
    Trading; the date of the contract"``, ``"What is the date of the Supply Agreement
    between Orion Holdings and Lyra Trading?"`` and ``"orion holdings' supply agreement
    with lyra: its date"`` route alike, and a question that names no document (``"The
    date of the contract"``, or ``"...infected from their mother?"`` that shares one word
    with *Mother-to-Child Transmission of HIV-1*) routes nowhere. One distinctive word
    alone (``"the Orion agreement"``) weighs about 1: set 1.0 to route on it (more wrong
    routes on COVID-QA and the code set). 0: any first document routes."""
    min_coverage: float = Field(default=0.0, ge=0.0, le=1.0)
    """Abstain: a query whose words the retriever's BM25 index barely holds
    (:func:`~langchain_rse.routing.query_coverage` below this) is about no indexed document,
    and the retriever returns nothing for it, so an agent asking about lasagna over
    contracts is told nothing was found. Off (0) by default: on the dev corpora no threshold
    empties 90% of off-topic questions while emptying at most 2% of the answerable ones on
    every corpus (0.7: 72 / 89 / 59% of 110 off-topic questions emptied on CUAD / the code
    set / COVID-QA, 0 / 1.2 / 2.5% of the answerable; a misspelt or rare word costs
    coverage: ``benchmarks/RESULTS.md``). Needs the in-process BM25 index (ignored with a
    ``lexical_store``) and a router (``router=None``: never abstains)."""
    boost: float = Field(default=math.inf, gt=0)
    """How strongly the chosen documents are favoured: their chunks' fused scores are
    multiplied by ``1 + boost`` (chunks of other documents keep theirs), and in segments
    mode a segment of another document must be worth ``1 + boost`` times the preset's
    ``min_segment_value`` (strong passages elsewhere still come back, weak ones do not).
    ``inf``: only their chunks are kept (a filter)."""
    focus: bool = True
    """When the route holds and the query has several clauses (:func:`query_clauses`), the
    clauses other than the one that names the document (the one the routed document's lead
    matches best) also search the routed document: a question such as ``"Consider the
    Supply Agreement between Acme and Beta; The date of the contract"`` ranks that
    contract's chunks by ``"The date of the contract"`` too, so the words that name the
    document, which every chunk's header repeats, do not decide the ranking inside it.
    The two extra searches (dense and lexical, filtered to the routed documents) are fused
    with the query's own, with the same weights, and a reranker scores the candidates
    against that text too. A naming clause that is itself a question keeps what it asks
    (:meth:`focus_query`). Needs the built-in lead index."""

    @classmethod
    def leads(cls, boost: float = DEFAULT_BOOST, **kwargs: Any) -> DocumentRouter:
        """The default router: a new built-in :class:`~langchain_rse.routing.LeadIndex`,
        kept in step with the index (``sync=True``), with a soft ``boost``."""
        return cls(retriever=LeadIndex(), sync=True, boost=boost, **kwargs)

    @model_validator(mode="after")
    def _check(self) -> DocumentRouter:
        if self.sync and not isinstance(self.retriever, DocumentIndex):
            raise ValueError(
                "sync=True needs a router retriever that is a LangChain DocumentIndex "
                f"(e.g. an RSERetriever), got {type(self.retriever).__name__}"
            )
        return self

    def route(
        self,
        query: str,
        config: RunnableConfig | None = None,
        filter: Filter | None = None,
        *,
        callbacks: Callbacks = None,
    ) -> set[str] | None:
        """The documents ``query`` is routed to (:meth:`chosen` of the retriever's hits)
        among those ``filter`` (parsed) allows. The built-in lead index is searched directly
        (no run of its own: it is internal); another retriever is invoked as a child run
        under ``config`` (its ``callbacks`` replaced by ``callbacks`` when given), with the
        filter (an ``RSERetriever``) or, under a filter it cannot be given, not at all
        (None: no route)."""
        r = self.retriever
        if callbacks is not None:
            config = RunnableConfig(**{**(config or {}), "callbacks": callbacks})
        if isinstance(r, LeadIndex):
            return self.named(r, query, self.chosen_ids(r.hits(query, filter)))
        if filter is None:
            return self.chosen(r.invoke(query, config))
        if _takes_filter(r):
            return self.chosen(r.invoke(query, config, filter=to_dict(filter)))
        logger.info("routing skipped: %s cannot be given the metadata filter", type(r).__name__)
        return None

    async def aroute(
        self,
        query: str,
        config: RunnableConfig | None = None,
        filter: Filter | None = None,
        *,
        callbacks: Callbacks = None,
    ) -> set[str] | None:
        """Async :meth:`route` (the built-in lead index is searched in a thread)."""
        r = self.retriever
        if callbacks is not None:
            config = RunnableConfig(**{**(config or {}), "callbacks": callbacks})
        if isinstance(r, LeadIndex):
            return await asyncio.to_thread(self.route, query, None, filter)
        if filter is None:
            return self.chosen(await r.ainvoke(query, config))
        if _takes_filter(r):
            return self.chosen(await r.ainvoke(query, config, filter=to_dict(filter)))
        logger.info("routing skipped: %s cannot be given the metadata filter", type(r).__name__)
        return None

    def focuses(self, query: str) -> bool:
        """Whether :attr:`focus` applies to ``query`` (the built-in lead index, and several
        clauses or one question in parts: ``"In the Orion Supply Agreement, which law
        governs?"``), before any search."""
        return (
            self.focus
            and isinstance(self.retriever, LeadIndex)
            and _focusable(query_clauses(query))
        )

    def focus_query(self, query: str, routed: set[str], filter: Filter | None = None) -> str | None:
        """``query`` without the clause that names the ``routed`` documents (the clause
        whose lead-index score for them is highest, searching the leads ``filter`` allows),
        or None when :meth:`focuses` is false or no clause matches their leads. Only the
        first :data:`MAX_CLAUSES` clauses (and parts) are weighed, and the leads are searched
        as the route that gave ``routed`` saw them (no generation check of their own).

        A naming clause that is itself a question (it ends in ``?``) keeps what it asks: it
        is split at its commas, and the parts that their leads match better than the last
        part (the one that asks) name the documents and are dropped (``"In the Orion Supply
        Agreement, between Orion Holdings and the Buyer, which law governs? Answer
        briefly."`` is focused to ``"which law governs? Answer briefly."``); where no part
        names them (``"What was 3M's capital expenditure in 2018? Round to two
        decimals."``), there is no focus, as the other clause is an instruction. A query that
        is one such question is focused the same way (``"In the Orion Supply Agreement,
        which law governs?"`` to ``"which law governs?"``)."""
        r = self.retriever
        clauses = query_clauses(query)
        if not self.focus or not isinstance(r, LeadIndex) or not _focusable(clauses):
            return None
        naming = _naming(r, clauses[:MAX_CLAUSES], routed, filter)
        if naming is None:
            return None
        rest = clauses[naming]
        if rest.endswith("?"):
            parts = [p for p in (p.strip() for p in rest.split(",")) if p]
            weighed = [*parts[: MAX_CLAUSES - 1], parts[-1]] if len(parts) > MAX_CLAUSES else parts
            scores = r.part_scores(weighed, routed, filter)
            scores[-1:-1] = [scores[-1]] * (len(parts) - len(weighed))  # the rest: kept
            keep = [p for p, score in zip(parts, scores) if score <= scores[-1]]
            if len(keep) == len(parts):
                logger.debug("no focus: the question %r names the document", rest)
                return None
            clauses[naming] = " ".join(keep)
        else:
            del clauses[naming]
        text = " ".join(clauses)
        logger.debug("focus: %r searched inside %s", text, sorted(routed))
        return text

    def named(self, leads: LeadIndex, query: str, chosen: set[str] | None) -> set[str] | None:
        """The ``chosen`` documents that ``query`` names (:attr:`min_naming`), None when
        none is."""
        if chosen is None or self.min_naming <= 0:
            return chosen
        named = {d for d in chosen if leads.naming_weight(query, d) >= self.min_naming}
        if not named:
            logger.debug("routing skipped: the query does not name %s", sorted(chosen))
            return None
        return named

    def chosen(self, hits: Sequence[Document]) -> set[str] | None:
        """The documents the router chose, or None (no filter) when it found none."""
        return self.chosen_ids(
            [(d.metadata.get("doc_id", d.id), d.metadata.get("bm25_score")) for d in hits]
        )

    def chosen_ids(self, hits: Sequence[tuple[Any, Any]]) -> set[str] | None:
        """:meth:`chosen` from ``(doc id, BM25 score or None)`` pairs, best first."""
        scores = [score for _, score in hits[:2]]
        if len(scores) == 2 and all(isinstance(x, (int, float)) for x in scores):
            first, second = scores
            if first < (1.0 + self.margin) * second:
                logger.debug(
                    "routing skipped: the router's first two documents score %.3g and %.3g",
                    first,
                    second,
                )
                return None
        chosen: list[str] = []
        for doc_id, _ in hits:
            if doc_id is not None and str(doc_id) not in chosen:
                chosen.append(str(doc_id))
        if not chosen:
            logger.debug("the document router returned no documents; searching all")
            return None
        return set(chosen[: self.documents])

    def confirmed(self, routed: set[str], ranked_keys: Sequence[str]) -> set[str] | None:
        """The routed documents the unrouted ranking agrees with (one of their chunks is
        among its first ``check_k``); None, so no filter, when none is."""
        if self.check_k is None:
            return routed
        near = {parse_chunk_key(key)[0] for key in ranked_keys[: self.check_k]}
        kept = routed & near
        if not kept:
            logger.debug(
                "routing skipped: no chunk of %s among the top %d candidates",
                sorted(routed),
                self.check_k,
            )
            return None
        return kept

    def sync_leads(self, sources: Sequence[Document], removed: Sequence[str]) -> None:
        """Upsert the leads of (re)indexed documents, delete removed ones (``sync=True``)."""
        if not self.sync or not isinstance(self.retriever, DocumentIndex):
            return
        if sources:
            self.retriever.upsert(document_leads(sources))
        if removed:
            self.retriever.delete(list(removed))

    def settings(self) -> dict[str, Any]:
        """The saved settings (the retriever itself is saved by its owner)."""
        return {
            "documents": self.documents,
            "check_k": self.check_k,
            "sync": self.sync,
            "boost": self.boost,
            "margin": self.margin,
            "focus": self.focus,
            "min_naming": self.min_naming,
            "min_coverage": self.min_coverage,
        }


def as_router(value: object) -> object:
    """A bare retriever as a :class:`DocumentRouter` with its defaults (the field validator
    of ``RSERetriever.router``); anything else unchanged."""
    return DocumentRouter(retriever=value) if isinstance(value, BaseRetriever) else value


def _focusable(clauses: list[str]) -> bool:
    """Whether a query of these clauses can be focused: several clauses, or one question in
    comma-separated parts."""
    return len(clauses) > 1 or (
        len(clauses) == 1 and clauses[0].endswith("?") and "," in clauses[0]
    )


def _takes_filter(retriever: BaseRetriever) -> bool:
    """Whether a router retriever can be given a metadata filter: its retrieval method
    names a ``filter`` parameter (an ``RSERetriever``'s does)."""
    method = type(retriever)._get_relevant_documents
    return "filter" in inspect.signature(method).parameters


def _naming(leads: LeadIndex, parts: list[str], routed: set[str], f: Filter | None) -> int | None:
    """The index of the part of a query whose lead-index score for the ``routed``
    documents is highest, or None when none matches their leads."""
    scores = leads.part_scores(parts, routed, f)
    best = max(range(len(parts)), key=scores.__getitem__)
    return best if scores[best] > 0 else None


def query_coverage(index: BM25Index, query: str) -> float:
    """How much of ``query`` the words of ``index`` hold, from 0 to 1: over the query's
    distinct terms, the IDF weight of those some chunk holds over the weight of all, a term
    no chunk holds weighing as much as the rarest held one (a term one chunk holds). Words
    every chunk has (``what``, ``the``) weigh little; a question about lasagna over contracts
    holds its rare words nowhere and scores low; a question the index can answer, however
    phrased, mostly uses words it holds. 1 for a query with no terms or an empty index.
    (:attr:`DocumentRouter.min_coverage` abstains below a threshold.)"""
    terms = set(tokenize(query, index.stemmer))
    n = len(index)
    if not terms or n == 0:
        return 1.0
    idf = index.idf(terms)
    held, missing = sum(idf.values()), len(terms) - len(idf)
    total = held + missing * math.log1p((n - 0.5) / 1.5)
    return held / total if total > 0 else 1.0
