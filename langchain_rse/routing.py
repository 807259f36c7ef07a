"""Document routing: a document-level retriever picks the documents a query is about, and
the chunk search favours their candidates (or keeps only them) — if the unrouted search
agrees (:class:`DocumentRouter` decides whether a route holds).

The router gives each query a :class:`~langchain_rse.query.Route`, the policy the pipeline
applies: :func:`confirm` checks it against the unrouted fused ranking and
:func:`apply_route` boosts the routed documents' chunks in that ranking (or keeps only
theirs); segment selection raises the bar for other documents by the same factor.

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
from typing import Any, Protocol

from langchain_core.callbacks import CallbackManagerForRetrieverRun, Callbacks
from langchain_core.documents import Document
from langchain_core.indexing import DeleteResponse, DocumentIndex, UpsertResponse
from langchain_core.retrievers import BaseRetriever
from langchain_core.runnables import RunnableConfig
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, model_validator

from langchain_rse.filters import Filter, parse, to_dict
from langchain_rse.fusion import Branch, Fused, fused
from langchain_rse.indexing.chunking import doc_id_for, document_leads
from langchain_rse.indexing.records import (
    chunk_key,
    compressed,
    decompressed,
    doc_of,
    in_docs,
)
from langchain_rse.lexical import BM25Index, group_of
from langchain_rse.lexical.tokenizer import tokenize
from langchain_rse.query import Route

__all__ = [
    "DEFAULT_BOOST",
    "NAME_WORD",
    "DocumentRouter",
    "LeadIndex",
    "apply_route",
    "as_router",
    "confirm",
    "query_coverage",
]

DEFAULT_MARGIN = 0.25
"""The confidence margin of :attr:`DocumentRouter.margin` (see ``benchmarks/RESULTS.md``)."""
DEFAULT_MIN_NAMING = 1.25
"""The weight of the name a query must give a lead to route
(:attr:`DocumentRouter.min_naming`): a word no other lead holds and a quarter as much again,
in one name (chosen on CUAD dev's phrasing families, checked on COVID-QA dev and the code
set: ``benchmarks/RESULTS.md``)."""
UNIQUE_TERM = 0.9
"""A query names a document only if it holds a term of its lead this (nearly) unique (see
:meth:`LeadIndex.naming_weight`): among 50 leads, a term one lead holds weighs 1, one two
leads hold 0.72."""
DEFAULT_BOOST = 2.0
"""The default router's boost (chosen on CUAD dev and the Anthropic code set)."""
NAME_WORD = 0.35
"""A query word names a routed document when that document's lead holds it and few other
leads do: its weight (:meth:`LeadIndex.naming_weight`'s, per word) is this or more; among 50
leads, a word at most five of them hold."""
NAME_PAIR = 0.5
"""Two words side by side in a query name a document, whatever their case in the query, when
its lead writes both capitalised side by side (``National Processing``, ``System
Associates``: a name made of common words) and few documents hold both in one chunk: the
pair's weight by the documents' IDF (as :data:`NAME_WORD` weighs words) is this or more;
among 50 documents, at most three. Such a pair weighs as two words no other lead holds
(chosen on CUAD dev's phrasing families, checked on COVID-QA dev and the code set:
``benchmarks/RESULTS.md``)."""
QUESTION_WORDS = (
    "what which who whom whose when where why how do does did will would shall should can "
    "could may might must there here this that these those say said tell about according "
    "consider please quote answer briefly"
)
"""Words that ask but say nothing of what is asked: :meth:`DocumentRouter.focus_query`
focuses only on a text that holds another word."""
_WORD = re.compile(r"[^\W_]+")
"""A word of a query, as the tokenizer reads words."""
_SPACE_BEFORE_PUNCTUATION = re.compile(r"\s+([,;:.?!])")
_STRAY_PUNCTUATION = re.compile(r"[,;:]+(?=[?.!]|$)")
"""A comma, semicolon or colon a cut-out name leaves before a sentence's end or the text's
end (``"the date of the contract, according to the Orion Supply Agreement?"`` would leave
``"the date of the contract,?"``)."""
_BREAK = re.compile(r"[;:?!\n]|\.\s+(?=[A-Z])")
"""Punctuation a name does not run across: a clause or sentence end (not the full stop of
``Inc. and``). Search it between two words up to the second word's first letter, which
tells a sentence end."""

logger = logging.getLogger(__name__)


class TextCounts(Protocol):
    """How many documents hold terms in their whole text (the owning retriever's
    :class:`~langchain_rse.lexical.BM25Index`), among those a filter allows."""

    def group_frequency(
        self, terms: Iterable[str], filter: Filter | None = None
    ) -> tuple[dict[str, int], int]:
        """How many documents hold each analyzed term, and how many documents there are."""
        ...

    def pair_frequency(
        self, pairs: Iterable[tuple[str, str]], filter: Filter | None = None
    ) -> tuple[dict[tuple[str, str], int], int]:
        """How many documents hold both terms of each pair in one chunk, and how many
        documents there are."""
        ...


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
    _capitalised: dict[str, frozenset[tuple[str, str]]] = PrivateAttr(default_factory=dict)
    """Per doc id, the pairs of words its lead writes capitalised side by side (terms)."""
    _text_counts: TextCounts | None = PrivateAttr(default=None)
    """Set by the owning retriever: how many documents hold terms anywhere in their text."""

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
            self._capitalised = {
                i: _capitalised_pairs(_text(packed), stemmer)
                for i, (packed, _) in self._leads.items()
            }

    def add_sources(self, sources: Iterable[Document]) -> None:
        """Index (or replace) the leads of these source documents."""
        self.upsert(document_leads(sources))

    def upsert(self, items: Sequence[Document], /, **kwargs: object) -> UpsertResponse:
        """Add or replace lead documents (their ids are doc ids; their metadata is what a
        search's filter is checked against)."""
        ids = [doc_id_for(d) for d in items]
        metadatas = [dict(d.metadata) for d in items]
        keys = [_key(i) for i in ids]
        with self._lock:
            self._leads.update(
                (i, (_packed(d.page_content), m)) for i, d, m in zip(ids, items, metadatas)
            )
            stemmer = self._bm25.stemmer
            self._capitalised.update(
                (i, _capitalised_pairs(d.page_content, stemmer)) for i, d in zip(ids, items)
            )
            self._bm25.add(
                keys,
                [d.page_content for d in items],
                {group_of(k): m for k, m in zip(keys, metadatas)},
            )
        return UpsertResponse(succeeded=ids, failed=[])

    def delete(self, ids: list[str] | None = None, **kwargs: object) -> DeleteResponse:
        """Remove the leads of these doc ids (unknown ids are ignored)."""
        if ids is None:
            raise ValueError("delete needs a list of document ids")
        with self._lock:
            found = [i for i in ids if self._leads.pop(i, None) is not None]
            for i in found:
                self._capitalised.pop(i, None)
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

    def name_spans(
        self, query: str, doc_ids: Iterable[str], filter: Filter | None = None
    ) -> list[tuple[int, int]]:
        """Where ``query`` names the documents ``doc_ids``: ``(start, end)`` character spans,
        each from a word their leads hold and few other leads do (:data:`NAME_WORD`) to the
        last such word reached through words their leads hold (``and``, ``between``,
        ``Agreement``, a possessive ``'s``), within one clause. ``"The date of the Joint
        Development Agreement between ExxonMobil Research and FuelCell Energy, Inc."`` names
        its contract from ``Joint`` (or ``ExxonMobil``) to ``Energy``. Empty when none of
        the documents is held or no word names them. Under ``filter`` (parsed) every
        count is over the documents it allows: another tenant's documents change no
        weight."""
        return [(start, end) for start, end, _, _ in self._names(query, doc_ids, filter)]

    def lead_terms(self, doc_ids: Iterable[str]) -> set[str]:
        """The terms the leads of ``doc_ids`` hold (none for an unknown id)."""
        held: set[str] = set()
        for doc_id in doc_ids:
            found = self._leads.get(doc_id)
            if found is not None:
                held.update(tokenize(_text(found[0]), self._bm25.stemmer))
        return held

    def _names(
        self, query: str, doc_ids: Iterable[str], filter: Filter | None = None
    ) -> list[tuple[int, int, float, float]]:
        """:meth:`name_spans` with each span's weight (over its distinct terms their leads
        hold, the sum of :meth:`naming_weight`'s term weights) and its heaviest term's. A
        run whose every name word most documents hold in their text (see
        :meth:`use_text_counts`) names nothing; two words their lead writes capitalised
        side by side weigh as two words no other lead holds when few documents hold both
        (:data:`NAME_PAIR`). Every count is over the documents ``filter`` allows."""
        stemmer = self._bm25.stemmer
        doc_ids = list(doc_ids)
        held = self.lead_terms(doc_ids)
        if not held or not self._leads:
            return []
        words = [(m.start(), m.end(), _terms(query, m, stemmer)) for m in _WORD.finditer(query)]
        found, n = self._bm25.group_frequency(
            {t for _, _, terms in words for t in terms & held}, filter
        )  # (a lead is one group: its document)
        if n == 0:
            return []
        weight = {t: _idf_ratio(df, n) for t, df in found.items() if df > 0}
        paired = self._name_pairs(query, doc_ids, filter)
        weight.update((t, 1.0) for t in paired)
        name_words = {t for t, w in weight.items() if w >= NAME_WORD}
        common = self._common_in_texts(name_words - paired, filter)
        spans: list[tuple[int, int, float, float]] = []
        start = end = -1
        terms_in: set[str] = set()
        for s, e, terms in words + [(len(query), len(query), {""})]:  # a last word ends a run
            if start >= 0 and (_BREAK.search(query, end, s + 1) or not terms <= held):
                if terms_in & name_words - common:  # a clause ends, or a word no lead of
                    spans.append(_span(start, end, terms_in, weight))  # theirs holds
                start = -1
            if start < 0:
                terms_in = set()
            terms_in |= terms
            if any(weight.get(t, 0.0) >= NAME_WORD for t in terms):
                start, end = (s if start < 0 else start), e
        return spans

    def check_before_search(self, check: Callable[[], None] | None) -> None:
        """Run ``check`` before each search (the owning retriever sets its shared index's
        generation check; None: none)."""
        self._before_search = check

    def use_text_counts(self, counts: TextCounts | None) -> None:
        """Count how many documents hold terms in their whole text with ``counts`` (the
        owning retriever passes its BM25 index; None: leads only, and no pair names a
        document). A word names a document only when few leads *and* few documents hold it:
        *books* and *records* in one contract's opening do not name it when most contracts'
        audit clauses hold them."""
        self._text_counts = counts

    def _common_in_texts(self, terms: set[str], filter: Filter | None) -> set[str]:
        """Those of ``terms`` that too many of the documents ``filter`` allows hold in
        their text to name one (weight below :data:`NAME_WORD` by the documents' IDF, as
        leads weigh them)."""
        counts = self._text_counts
        if counts is None or not terms:
            return set()
        found, n = counts.group_frequency(terms, filter)
        return {t for t, df in found.items() if df > 0 and _text_weight(df, n) < NAME_WORD}

    def _name_pairs(self, query: str, doc_ids: Iterable[str], filter: Filter | None) -> set[str]:
        """The terms of the pairs of words side by side in ``query`` that the leads of
        ``doc_ids`` write capitalised side by side and few of the documents ``filter``
        allows hold in one chunk (:data:`NAME_PAIR`): ``"in the sponsorship agreement
        with national processing"`` names the contract whose lead says *National
        Processing Company*, though most contracts hold *national* and *processing*."""
        counts = self._text_counts
        capitalised: set[tuple[str, str]] = set()
        for doc_id in doc_ids:
            capitalised |= self._capitalised.get(doc_id, frozenset())
        if counts is None or not capitalised:
            return set()
        stemmer = self._bm25.stemmer
        found = {pair for pair, _ in _word_pairs(query, stemmer) if pair in capitalised}
        if not found:
            return set()
        together, n = counts.pair_frequency(found, filter)
        return {
            t for pair, df in together.items() if _text_weight(df, n) >= NAME_PAIR for t in pair
        }

    def _hits(self, query: str, filter: Filter | None) -> list[tuple[str, float]]:
        """:meth:`hits` without the shared store's generation check (done once per query)."""
        leads = self._leads
        found = ((doc_of(key), score) for key, score in self._bm25.search(query, self.k, filter))
        return [(d, score) for d, score in found if d in leads]

    def naming_weight(self, query: str, doc_id: str, filter: Filter | None = None) -> float:
        """How strongly ``query`` names the document ``doc_id``: the weight of its heaviest
        name (:meth:`name_spans`), the sum over the name's distinct terms that the lead
        holds of ``(the term's IDF over the leads / the IDF of a term that one lead alone
        holds) ** 2``: about 1 for a word no other lead holds (a party's name), little for
        one many leads hold (``contract``, ``date``, ``transmission``). 0 unless a term of
        that name is (nearly) unique to this lead (weight :data:`UNIQUE_TERM` or more). A
        query that names a document by its title or parties scores about one per name word,
        wherever the name stands and however much else the question says; rare words
        scattered over a question that names nothing (``expiration ... last``) are
        several weak names, not one strong one. Under ``filter`` (parsed) the IDFs are
        over the documents it allows."""
        names = self._names(query, [doc_id], filter)
        return max((w for _, _, w, top in names if top >= UNIQUE_TERM), default=0.0)

    def search(self, query: str, filter: Filter | None = None) -> list[Document]:
        """The ``k`` best leads for ``query`` that ``filter`` allows (what ``invoke``
        returns, without a run)."""
        hits = self.hits(query, filter)
        leads = (self._lead(doc_id, bm25_score=score) for doc_id, score in hits)
        return [lead for lead in leads if lead is not None]  # None: deleted since the search


def _idf_ratio(df: int, n: int) -> float:
    """The weight of a term ``df`` of ``n`` (>= 1) documents hold: its IDF (Lucene's) over
    that of a term one document alone holds, squared; how
    :meth:`LeadIndex.naming_weight` weighs lead terms."""
    return (math.log1p((n - df + 0.5) / (df + 0.5)) / math.log1p((n - 0.5) / 1.5)) ** 2


def _text_weight(df: int, n: int) -> float:
    """:func:`_idf_ratio` over the documents' texts; 0 under two documents (a word the
    only document holds says nothing of which document is meant)."""
    return 0.0 if n < 2 else _idf_ratio(df, n)


def _word_pairs(text: str, stemmer: str | None) -> list[tuple[tuple[str, str], bool]]:
    """The pairs of words side by side in ``text`` (a possessive's ``s`` skipped; a
    stopword or a clause break between them parts them), as the terms of the whole words,
    each with whether ``text`` writes both capitalised."""
    words = [
        (m.start(), m.end(), tokenize(m.group(), stemmer)[:1], m.group()[:1].isupper())
        for m in _WORD.finditer(text)
        if not _possessive_s(text, m)
    ]
    return [
        ((a[0], b[0]), up_a and up_b)
        for (_, end, a, up_a), (start, _, b, up_b) in zip(words, words[1:])
        if a and b and not _BREAK.search(text, end, start + 1)
    ]


def _capitalised_pairs(text: str, stemmer: str | None) -> frozenset[tuple[str, str]]:
    """The pairs of words ``text`` writes capitalised side by side (see :func:`_word_pairs`)."""
    return frozenset(pair for pair, capitalised in _word_pairs(text, stemmer) if capitalised)


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
    check_k: int | None = Field(default=50, ge=1)
    """A routed document is kept only if one of its chunks is among the first ``check_k``
    candidates of the unrouted search; when none is, nothing is filtered (the router was
    probably wrong). None: always. 50, not 10: a short name (*Acme's supply agreement*, a
    lower-case partial name) weighs little in the whole question's searches, and at 10
    the check dropped 20 of 283 right possessive routes on CUAD dev (recall at 4k 72.2 ->
    77.7 at 50; COVID-QA and the code set unchanged: ``benchmarks/RESULTS.md``)."""
    sync: bool = False
    """Keep the router in step with the index: adding, replacing and deleting documents
    upserts and deletes their leads there too (the retriever must be a ``DocumentIndex``)."""
    margin: float = Field(default=DEFAULT_MARGIN, ge=0)
    """Route only when the router is sure: with the built-in lead index, the most strongly
    named of its ``k`` documents must be named at least ``1 + margin`` times as strongly as
    the next (:meth:`named`); with another router whose results carry
    ``metadata["bm25_score"]`` (or ``min_naming=0``), the first document's score must be at
    least ``1 + margin`` times the second's. Similar documents a query does not tell apart
    (contracts between the same parties, from one template) are not routed."""
    min_naming: float = Field(default=DEFAULT_MIN_NAMING, ge=0)
    """Route only to a document the query names: of the built-in lead index's ``k``
    documents, the one the query names most strongly is chosen (not the one whose opening
    shares most words with a long question), and its
    :meth:`~langchain_rse.routing.LeadIndex.naming_weight` must be at least this —
    about this many words that few other leads hold in one name of the query (a run of
    words its lead holds), one of them held by its lead alone. The weight does not depend
    on where the name stands or how long the question is, and rare words scattered over a
    question count apart, so ``"Consider the Supply Agreement between Orion Holdings and Lyra
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
    """When the route holds, the query without the words that name the routed documents
    (:meth:`focus_query`: ``"Consider the Supply Agreement between Acme and Beta; The date
    of the contract"`` without ``Supply Agreement between Acme and Beta``, wherever those
    words stand) also searches them, so the words that name the document, which every
    chunk's header repeats, do not decide the ranking inside it. The two extra searches
    (dense and lexical, filtered to the routed documents) are fused with the query's own
    at :attr:`focus_weight` times their weights, and a reranker scores the candidates
    against that text too. Needs the built-in lead index."""
    focus_weight: float = Field(default=2.0, gt=0)
    """How much the focus searches count in the fusion, relative to the query's own: 2,
    the text without the name ranks the routed document's chunks twice as much as the
    whole question, whose name words every chunk's header repeats (chosen on CUAD dev's
    phrasing families, checked on COVID-QA dev, the code set and the docs corpus:
    ``benchmarks/RESULTS.md``)."""

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
    ) -> Route | None:
        """The route of ``query`` (:meth:`policy`): the documents it is routed to
        (:meth:`chosen` of the retriever's hits) among those ``filter`` (parsed) allows, not
        yet confirmed against the unrouted ranking. The built-in lead index is searched
        directly (no run of its own: it is internal); another retriever is invoked as a
        child run under ``config`` (its ``callbacks`` replaced by ``callbacks`` when given),
        with the filter (an ``RSERetriever``) or, under a filter it cannot be given, not at
        all (None: no route)."""
        r = self.retriever
        if callbacks is not None:
            config = RunnableConfig(**{**(config or {}), "callbacks": callbacks})
        if isinstance(r, LeadIndex):
            return self.policy(query, self.named(r, query, r.hits(query, filter), filter))
        if filter is None:
            return self.policy(query, self.chosen(r.invoke(query, config)))
        if _takes_filter(r):
            return self.policy(query, self.chosen(r.invoke(query, config, filter=to_dict(filter))))
        logger.info("routing skipped: %s cannot be given the metadata filter", type(r).__name__)
        return None

    async def aroute(
        self,
        query: str,
        config: RunnableConfig | None = None,
        filter: Filter | None = None,
        *,
        callbacks: Callbacks = None,
    ) -> Route | None:
        """Async :meth:`route` (the built-in lead index is searched in a thread)."""
        r = self.retriever
        if callbacks is not None:
            config = RunnableConfig(**{**(config or {}), "callbacks": callbacks})
        if isinstance(r, LeadIndex):
            return await asyncio.to_thread(self.route, query, None, filter)
        if filter is None:
            return self.policy(query, self.chosen(await r.ainvoke(query, config)))
        if _takes_filter(r):
            chosen = self.chosen(await r.ainvoke(query, config, filter=to_dict(filter)))
            return self.policy(query, chosen)
        logger.info("routing skipped: %s cannot be given the metadata filter", type(r).__name__)
        return None

    def focuses(self, query: str) -> bool:
        """Whether :attr:`focus` may apply to ``query`` before any search (it is on and the
        router is the built-in lead index); :meth:`focus_query` decides once routed."""
        return self.focus and isinstance(self.retriever, LeadIndex)

    def focus_query(self, query: str, routed: set[str], filter: Filter | None = None) -> str | None:
        """``query`` without the words that name the ``routed`` documents
        (:meth:`LeadIndex.name_spans`), wherever they stand; None when :attr:`focus` is off,
        nothing names them, or what is left asks nothing (only question words such as
        ``what``, ``which``, ``the``).

        ``"Consider the Orion Supply Agreement between Orion Holdings and the Buyer; which
        state's laws govern"``, ``"Which state's laws govern the Orion Supply Agreement?"``
        and ``"Orion Holdings's supply agreement: which state's laws govern?"`` all search
        the routed document for what is left (``"which state's laws govern"`` with the
        connecting words and punctuation around the name): the name is found by what the
        question shares with the routed document's lead and few other leads hold, not by
        where it stands in the sentence."""
        r = self.retriever
        if not self.focus or not isinstance(r, LeadIndex):
            return None
        spans = r.name_spans(query, routed, filter)
        if not spans:
            return None
        text = _without(query, _widened(query, spans, r.stemmer, r.lead_terms(routed)))
        if not _asks(text, r.stemmer):
            logger.debug("no focus: %r asks nothing once the name is left out", text)
            return None
        logger.debug("focus: %r searched inside %s", text, sorted(routed))
        return text

    def named(
        self,
        leads: LeadIndex,
        query: str,
        hits: Sequence[tuple[str, float]],
        filter: Filter | None = None,
    ) -> set[str] | None:
        """The documents among the lead index's ``hits`` that ``query`` names: the one with
        the heaviest name (:meth:`LeadIndex.naming_weight`), when that weighs at least
        :attr:`min_naming` and ``1 + margin`` times the next document's, so the name decides
        the route, not how much of a long question happens to match another lead; None
        when no document is named so. With ``min_naming`` 0, the first hit, as
        :meth:`chosen_ids` picks it."""
        if self.min_naming <= 0:
            return self.chosen_ids(hits)
        weights = sorted(
            ((leads.naming_weight(query, d, filter), -i, d) for i, (d, _) in enumerate(hits)),
            reverse=True,
        )
        if not weights or weights[0][0] < self.min_naming:
            logger.debug("routing skipped: the query names none of %s", [d for d, _ in hits])
            return None
        if len(weights) > 1 and weights[0][0] < (1.0 + self.margin) * weights[1][0]:
            logger.debug(
                "routing skipped: the query names %s and %s about as strongly (%.3g, %.3g)",
                weights[0][2],
                weights[1][2],
                weights[0][0],
                weights[1][0],
            )
            return None
        return {d for w, _, d in weights[: self.documents] if w >= self.min_naming}

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

    def policy(self, query: str, routed: set[str] | None) -> Route | None:
        """The route of ``query`` to the ``routed`` documents under this router's settings
        (None: no route): their chunks' fused scores multiplied by ``1 + boost`` (only their
        chunks with ``boost=inf``), to be confirmed by :attr:`check_k`, focused when
        :meth:`focuses`."""
        if routed is None:
            return None
        focus = self.focus_weight if self.focuses(query) else 0.0
        return Route(frozenset(routed), 1.0 + self.boost, self.check_k, focus)

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
            "focus_weight": self.focus_weight,
            "min_naming": self.min_naming,
            "min_coverage": self.min_coverage,
        }


def as_router(value: object) -> object:
    """A bare retriever as a :class:`DocumentRouter` with its defaults (the field validator
    of ``RSERetriever.router``); anything else unchanged."""
    return DocumentRouter(retriever=value) if isinstance(value, BaseRetriever) else value


def _takes_filter(retriever: BaseRetriever) -> bool:
    """Whether a router retriever can be given a metadata filter: its retrieval method
    names a ``filter`` parameter (an ``RSERetriever``'s does)."""
    method = type(retriever)._get_relevant_documents
    return "filter" in inspect.signature(method).parameters


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


# ---------------------------------------------------------------- the route applied


def confirm(route: Route, ranking: Fused) -> Route | None:
    """``route`` confirmed against the unrouted ``ranking`` (:meth:`Route.confirmed
    <langchain_rse.query.Route.confirmed>`): the routed documents it agrees with, None when
    there are none (the router was probably wrong)."""
    if route.check_k is None:
        return route
    held = route.confirmed([doc_of(key) for key in ranking.ranked_ids(route.check_k)])
    if held is None:
        logger.debug(
            "routing skipped: no chunk of %s among the top %d candidates",
            sorted(route.docs),
            route.check_k,
        )
    return held


def apply_route(
    route: Route | None, ranking: Fused, branches: Sequence[Branch], weights: Sequence[float]
) -> tuple[Fused, Route | None]:
    """``ranking`` (the fusion of ``branches`` with ``weights``) with ``route`` applied, once
    :func:`confirm` holds it, and the route that holds (None: the ranking unchanged). A soft
    route multiplies its documents' chunks' scores by its factor and sorts again; a
    keep-only route fuses their chunks alone (when the branches found none of them, the
    route does not hold: a filter would return nothing)."""
    if route is not None:
        route = confirm(route, ranking)
    if route is None:
        return ranking, None
    docs = route.docs
    if not route.keeps_only:
        return ranking.boosted(lambda keys: in_docs(keys, docs), route.factor), route
    kept = [[h for h in b if doc_of(h[0]) in docs] for b in branches]
    if any(kept):
        return fused(kept, weights), route
    logger.debug("no candidates in the routed documents %s; searching all", set(docs))
    return ranking, None


def _without(query: str, spans: Sequence[tuple[int, int]]) -> str:
    """``query`` with ``spans`` cut out, whitespace runs made one space, stray punctuation
    dropped (leading, or left before a sentence's end)."""
    kept, at = [], 0
    for start, end in spans:
        kept.append(query[at:start])
        at = end
    kept.append(query[at:])
    text = _SPACE_BEFORE_PUNCTUATION.sub(r"\1", " ".join(" ".join(kept).split()))
    return _STRAY_PUNCTUATION.sub("", text).lstrip(",;:. ")


def _widened(
    query: str, spans: Sequence[tuple[int, int]], stemmer: str | None, held: set[str]
) -> list[tuple[int, int]]:
    """``spans`` grown, within the clause, over the words next to them that say nothing
    (stop words, :data:`QUESTION_WORDS`, ``between``: ``"In the"``, ``"according to the"``;
    a possessive's ``'s``) and over the capitalized words the routed leads hold, across a
    comma too (the name's own ``, Inc.``, ``Co-Branding Agreement``): ``"Consider the Orion
    Supply Agreement between Orion Holdings, Inc.; the date"`` and ``"Orion Holdings's
    Supply Agreement: the date"`` keep ``"the date"``."""
    asking = set(tokenize(f"{QUESTION_WORDS} between among", stemmer))
    empty: dict[int, int] = {}
    named: dict[int, int] = {}
    for m in _WORD.finditer(query):
        terms = set(tokenize(m.group(), stemmer))
        if terms <= asking:
            empty[m.start()] = m.end()
        elif m.group()[0].isupper() and terms <= held:
            named[m.start()] = m.end()
    ends = {**empty, **named}
    starts = {e: b for b, e in ends.items()}
    grown = []
    for start, end in spans:
        while True:
            before = query[:start].rstrip(" \t,-")
            b = starts.get(len(before))
            if b is None or _BREAK.search(query, len(before), start):
                break
            if "," in query[len(before) : start] and b not in named:
                break  # only a name's own word across a comma
            start = b
        while True:
            after = len(query) - len(query[end:].lstrip(" \t,-"))
            e = ends.get(after)
            if e is None or _BREAK.search(query, end, after):
                break
            if "," in query[end:after] and after not in named:
                break
            end = e
        if query[end : end + 1] == "." and end in named.values():
            end += 1  # an abbreviation's full stop (Inc.)
        grown.append((start, end))
    return grown


def _asks(text: str, stemmer: str | None) -> bool:
    """Whether ``text`` holds a term other than those of :data:`QUESTION_WORDS`."""
    asking = set(tokenize(QUESTION_WORDS, stemmer))
    return any(t not in asking for t in tokenize(text, stemmer))


def _terms(query: str, m: re.Match[str], stemmer: str | None) -> set[str]:
    """The terms of the word ``m`` of ``query``; none for the ``s`` of a possessive."""
    return set() if _possessive_s(query, m) else set(tokenize(m.group(), stemmer))


def _possessive_s(text: str, m: re.Match[str]) -> bool:
    """Whether the word ``m`` of ``text`` is the ``s`` of a possessive."""
    return m.group() in ("s", "S") and text[m.start() - 1 : m.start()] in ("'", "\u2019")


def _span(
    start: int, end: int, terms: set[str], weight: dict[str, float]
) -> tuple[int, int, float, float]:
    """A name's span, the weight of its terms and its heaviest term's."""
    weights = [weight.get(t, 0.0) for t in terms]
    return start, end, sum(weights), max(weights, default=0.0)
