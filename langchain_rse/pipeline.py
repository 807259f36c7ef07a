"""The query path, written once as a sans-I/O generator.

:func:`retrieval` checks a call and returns a generator that *yields* each I/O it needs as
a typed request (:class:`Expand`, :class:`Search`, :class:`Focus`, :class:`ReadPointers`,
:class:`ReadBodies`, :class:`Rerank`, :class:`Report`, :class:`Settled`) and receives the
answer.
:func:`~langchain_rse.driver.drive` answers the requests synchronously and
:func:`~langchain_rse.driver.adrive` awaits them, with the handlers :func:`handlers` binds,
so the sync and async paths share every line of logic. The write path
(:mod:`langchain_rse.indexing.steps`) is driven the same way.

One query: expand → search → fuse → read records → rerank → relevance → segments → exact
slices of the source (``docs/architecture.md``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import re
from collections.abc import Generator, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from functools import partial
from typing import NamedTuple, Protocol, cast

from langchain_core.callbacks import Callbacks
from langchain_core.documents import Document

from langchain_rse.driver import Handlers, adrive, drive
from langchain_rse.enrichment import index_text
from langchain_rse.explain import TRACES, Trace, tracing
from langchain_rse.filters import Filter, Translator, both, matches, parse
from langchain_rse.fusion import branches_of, candidates, fused, quotes_code
from langchain_rse.indexing.records import Body, Pointer, StaleRead, chunk_uuid
from langchain_rse.indexing.recordstore import ReadWriteLock, RecordStore
from langchain_rse.lexical import BM25Index
from langchain_rse.query import Candidate, Route
from langchain_rse.rerank import BaseReranker, RerankError, RerankResult
from langchain_rse.routing import DocumentRouter, apply_route, confirm, query_coverage
from langchain_rse.search import Focused, Found, SearchBranches
from langchain_rse.segments import (
    RSEParams,
    choose_segments,
    fit_segments,
    rank_relevance,
    segment_documents,
)

__all__ = [
    "MAX_MAX_CHARS",
    "MAX_QUERIES",
    "MAX_QUERY_CHARS",
    "Expand",
    "Focus",
    "QuerySettings",
    "ReadBodies",
    "ReadPointers",
    "Report",
    "Rerank",
    "Search",
    "Settled",
    "Trace",
    "handlers",
    "retrieval",
    "tracing",
]

logger = logging.getLogger(__name__)

READ_ATTEMPTS = 3
"""Times a query re-reads (or runs its retrieval again) when documents change under it."""
CANDIDATE_POOL = 50
"""Fused candidates kept for reranking and RSE (half as many more per extra query)."""
MAX_QUERIES = 6
"""Most queries searched for one retrieval (original + ``queries=`` + expansions)."""
MAX_QUERY_CHARS = 8192
"""Longer queries are rejected with a ``ValueError`` (``max_query_chars``)."""
CODE_WEIGHTS_EQUAL = True
"""A query that quotes code gives BM25 (exact identifiers) the dense branch's weight."""

_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


class Expand(NamedTuple):
    """Rewrite ``query`` into more search queries (the query expander) → ``list[str]``."""

    query: str


class Search(NamedTuple):
    """Both branches for every query, the route of the first → ``(dense, lexical, route)``."""

    queries: list[str]
    filter: Filter | None


class Focus(NamedTuple):
    """The focus search inside the ``routed`` documents → ``(text, dense, lexical)`` or None."""

    query: str
    routed: set[str]
    filter: Filter | None


class ReadPointers(NamedTuple):
    """The documents' pointers → ``list[Pointer | None]``."""

    doc_ids: list[str]


class ReadBodies(NamedTuple):
    """The bodies of these versions → ``list[Body]`` (:class:`StaleRead` when one is gone)."""

    pointers: list[Pointer]


class Rerank(NamedTuple):
    """Rerank ``documents`` against each query → ``list[RerankResult]`` (or RerankError)."""

    queries: list[str]
    documents: list[Document]


class Settled(NamedTuple):
    """Run ``steps`` (a query's last attempt) while no write swaps a pointer or removes a
    version (in process) → their result."""

    steps: Steps


class Report(NamedTuple):
    """Hand ``explain`` what the query saw → None (a no-op unless it listens)."""

    trace: Trace


Request = tuple[object, ...]
"""One of the requests above (each a ``NamedTuple``)."""
Steps = Generator[Request, object, list[Document]]
"""A retrieval generator: it yields requests, is sent their answers (each of the type its
request names) and returns the documents."""

THROWN = (RerankError, StaleRead)
"""Handler errors raised inside the generator (failed rerank: fused ranking; stale: re-read)."""


def clean_query(query: object, max_chars: int = MAX_QUERY_CHARS) -> str:
    """The query with control characters as spaces; ``TypeError`` / ``ValueError`` for a
    query that is not a string, is blank, or is longer than ``max_chars``."""
    if not isinstance(query, str):
        raise TypeError(f"query must be a string, got {type(query).__name__}")
    if len(query) > max_chars:
        raise ValueError(
            f"query is {len(query)} characters long; the limit is max_query_chars={max_chars}"
        )
    query = _CONTROL.sub(" ", query).encode("utf-8", "replace").decode("utf-8")
    if not query.strip():
        raise ValueError("query must be a non-empty string (got an empty or blank query)")
    return query


def check_k(k: object) -> int:
    """``k`` as a non-negative int, else ``ValueError``."""
    if isinstance(k, bool) or not isinstance(k, int) or k < 0:
        raise ValueError(f"k must be a non-negative integer, got {k!r}")
    return k


MIN_MAX_CHARS = 100
"""The smallest context budget accepted: below it hardly a chunk fits."""

MAX_MAX_CHARS = 1_000_000_000
"""The largest context budget accepted (a billion characters: more than any call returns)."""


def check_max_chars(value: object) -> int | None:
    """A context budget: None or an int from :data:`MIN_MAX_CHARS` to :data:`MAX_MAX_CHARS`,
    else ``ValueError``."""
    if value is None:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or not MIN_MAX_CHARS <= value <= MAX_MAX_CHARS
    ):
        shown = repr(value) if not isinstance(value, int) or value < 10**30 else "a larger one"
        raise ValueError(
            f"max_chars must be an integer from {MIN_MAX_CHARS} to {MAX_MAX_CHARS:,} or None, "
            f"got {shown}"
        )
    return value


def query_set(
    query: str, queries: object, expansions: list[str], max_queries: int, max_chars: int
) -> list[str]:
    """The original query first, then extra (``queries=``) and expanded queries, each
    checked, without case-insensitive duplicates, at most ``max_queries``."""
    extra: list[str] = []
    if queries is not None:
        if isinstance(queries, str) or not isinstance(queries, (list, tuple)):
            raise TypeError("queries must be a list of strings")
        extra = [clean_query(q, max_chars) for q in queries]
    out: list[str] = []
    seen: set[str] = set()
    for q in [query, *extra, *expansions]:
        key = q.strip().casefold()
        if key not in seen:
            seen.add(key)
            out.append(q)
    return out[:max_queries]


INVOKE_ARGS = ("k", "mode", "queries", "filter", "max_chars")
"""The keyword arguments ``invoke`` accepts besides ``config``."""


def check_invoke_args(unknown: Mapping[str, object]) -> None:
    """``TypeError`` naming unknown ``invoke`` keywords (``top_k=`` is not ``k=``)."""
    if unknown:
        raise TypeError(
            f"RSERetriever got unexpected argument(s) {', '.join(sorted(unknown))}; "
            f"it accepts {', '.join(INVOKE_ARGS)} (and config)"
        )


def query_weights(weights: tuple[float, float], query: str) -> tuple[float, float]:
    """The fusion weights for ``query``: ``weights``, with the lexical weight raised to the
    dense one when the query quotes code (see :data:`CODE_WEIGHTS_EQUAL`)."""
    dense, lexical = weights
    if CODE_WEIGHTS_EQUAL and lexical > 0 and quotes_code(query):
        return dense, max(dense, lexical)
    return weights


@dataclass(frozen=True)
class QuerySettings:
    """What one retrieval needs from the retriever's configuration."""

    k: int
    mode: str
    queries: list[str]
    weights: tuple[float, float]
    candidate_pool: int
    params: RSEParams
    rerank: bool
    strict_rerank: bool
    filter: Filter | None = None
    """Checked on every candidate's document metadata, whatever the stores returned."""
    max_chars: int | None = None
    """Most characters returned in all (the context budget); None: the preset's chunk budget."""
    rerank_queries: list[str] | None = None
    """What the reranker scores against, when not ``queries`` (with focus: the focus text too)."""

    @classmethod
    def of(
        cls,
        r: RetrievalSettings,
        query: str,
        k: int,
        mode: object,
        queries: object,
        expansions: list[str],
        f: object,
        max_chars: int | None = None,
    ) -> QuerySettings:
        """The settings of one call of retriever ``r`` (its fields, narrowed by the call's)."""
        mode = r.mode if mode is None else mode
        if mode not in ("segments", "chunks"):
            raise ValueError(f"mode must be 'segments' or 'chunks', got {mode!r}")
        call_filter = parse(f) if f else None
        return cls(
            k=k,
            mode=mode,
            queries=query_set(query, queries, expansions, MAX_QUERIES, MAX_QUERY_CHARS),
            weights=query_weights(r.weights, query),
            candidate_pool=CANDIDATE_POOL,
            params=r.params,
            rerank=r.reranker is not None,
            strict_rerank=getattr(r.reranker, "strict", False),
            filter=both(parse(r.filter), call_filter) if r.filter else call_filter,
            max_chars=max_chars,
        )


@dataclass(frozen=True)
class RetrievalSettings:
    """What a retrieval reads of the retriever's settings
    (:class:`~langchain_rse.retriever.RSERetriever` builds it for each call)."""

    k: int
    mode: str
    max_chars: int | None
    weights: tuple[float, float]
    params: RSEParams
    filter: Mapping[str, object] | None
    reranker: BaseReranker | None
    router: DocumentRouter | None
    query_expander: Expander | None
    external_lexical: bool
    """A lexical store searches instead of the in-process BM25 index."""
    fetch_k: int
    """Candidates fetched from each branch."""
    filter_translator: Translator | None = None
    """A custom filter translation for the vector store."""


class Expander(Protocol):
    """What a query expander (:class:`~langchain_rse.expansion.QueryExpander`) answers."""

    def expand(self, query: str, *, callbacks: Callbacks = None) -> list[str]: ...

    async def aexpand(self, query: str, *, callbacks: Callbacks = None) -> list[str]: ...


class Replaced(Exception):
    """Documents whose every candidate is of a version replaced since the search: the
    retrieval runs again (``versions``: their ``(doc_id, version)``)."""

    def __init__(self, versions: set[tuple[str, str]]) -> None:
        super().__init__(", ".join(sorted(d for d, _ in versions)))
        self.versions = versions


def live_candidates(
    cands: list[Candidate], pointers: dict[str, Pointer], f: Filter | None = None
) -> list[Candidate]:
    """Drop candidates of deleted or replaced document versions, and of documents the
    filter rejects (a store that mistranslated it costs results, never leaks)."""
    live = {  # each document's current version and chunk count, if the filter takes it
        d: (m.version, len(m.spans))
        for d, m in pointers.items()
        if f is None or matches(f, {**m.metadata, "doc_id": d})
    }
    return [
        c
        for c in cands
        if (v := live.get(c.doc_id)) is not None and v[0] == c.version and c.chunk_index < v[1]
    ]


def rerank_inputs(
    cands: list[Candidate], bodies: dict[str, Body], pointers: dict[str, Pointer]
) -> list[Document]:
    """The candidates' enriched texts, tagged with their chunk ids."""
    docs = []
    for c in cands:
        if c.text is None:
            body = bodies[c.doc_id]
            start, end = pointers[c.doc_id].spans[c.chunk_index]
            c.text = index_text(body.contexts[c.chunk_index], body.slice(start, end))
        docs.append(Document(page_content=c.text, metadata={"chunk_id": chunk_uuid(c.key)}))
    return docs


def apply_relevance(
    s: QuerySettings, cands: list[Candidate], reranked: list[RerankResult] | None
) -> list[Candidate]:
    """Set each candidate's relevance: reranked (best over queries), else
    ``exp(-rank / decay)`` of its fused rank (``decay_rate``, at least ``max_chars /
    decay_chars`` with a context budget)."""
    if reranked is None:
        decay = s.params.decay_rate
        if s.max_chars is not None and s.params.decay_chars > 0:
            decay = max(decay, s.max_chars / s.params.decay_chars)
        for c, rel in zip(cands, rank_relevance(len(cands), decay).tolist()):
            c.relevance = rel
        return cands
    kept: dict[int, Candidate] = {}
    for result in reranked:
        for idx, score, rel in zip(result.indices, result.scores, result.relevance):
            c = cands[idx]
            if idx not in kept or rel > c.relevance:
                c.rerank_score, c.relevance = float(score), float(rel)
            kept[idx] = c
    return sorted(kept.values(), key=lambda c: -c.relevance)


def replaced(
    before: list[Candidate], after: list[Candidate], pointers: dict[str, Pointer]
) -> set[tuple[str, str]]:
    """``(doc_id, version)`` of candidates whose documents kept none in ``after`` (the current
    ones) because they have another version now."""
    kept = {c.doc_id for c in after}
    return {
        (c.doc_id, c.version)
        for c in before
        if c.doc_id not in kept
        and (m := pointers.get(c.doc_id)) is not None
        and m.version != c.version
    }


def run_pipeline(
    s: QuerySettings,
    cands: list[Candidate],
    route: Route | None = None,
    seen: set[tuple[str, str]] | None = None,
) -> Steps:
    """Records → current candidates → rerank → relevance → selection → documents. With
    ``seen``, :class:`Replaced` when a document's candidates are all of a version replaced
    since the search and not in ``seen`` (versions found again are leftovers)."""
    if not cands:
        return []
    doc_ids = list(dict.fromkeys([c.doc_id for c in cands]))
    read = cast("list[Pointer | None]", (yield ReadPointers(doc_ids)))
    pointers = {p.doc_id: p for p in read if p is not None}
    found, cands = cands, live_candidates(cands, pointers, s.filter)
    if seen is not None and (new := replaced(found, cands, pointers) - seen):
        raise Replaced(new)
    if not cands:
        return []
    bodies: dict[str, Body] = {}
    reranked: list[RerankResult] | None = None
    fallback = False
    if s.rerank:
        need = [pointers[d] for d in dict.fromkeys(c.doc_id for c in cands if c.text is None)]
        bodies.update(zip((m.doc_id for m in need), cast("list[Body]", (yield ReadBodies(need)))))
        try:
            queries = s.rerank_queries or s.queries
            request = Rerank(queries, rerank_inputs(cands, bodies, pointers))
            reranked = cast("list[RerankResult]", (yield request))
        except RerankError as exc:
            if s.strict_rerank:
                raise
            logger.warning("reranker failed (%s); using the fused ranking instead", exc)
            fallback = True
    cands = apply_relevance(s, cands, reranked)
    selection = choose_segments(s, cands, pointers, route)
    need = [pointers[d] for d in dict.fromkeys(g[0] for g in selection) if d not in bodies]
    bodies.update(zip((m.doc_id for m in need), cast("list[Body]", (yield ReadBodies(need)))))
    texts = {d: bodies[d].text for d in dict.fromkeys(g[0] for g in selection)}
    chosen = fit_segments(s, cands, pointers, texts, selection)
    yield Report(Trace(cands, pointers, chosen, bodies))
    return segment_documents(s, cands, pointers, bodies, chosen, fallback)


def _retrying(
    s: QuerySettings,
    cands: list[Candidate],
    route: Route | None,
    seen: set[tuple[str, str]] | None = None,
) -> Steps:
    """:func:`run_pipeline`, started again when a document changed under it."""
    for _ in range(READ_ATTEMPTS):
        try:
            return (yield from run_pipeline(s, list(cands), route, seen))
        except StaleRead as exc:
            logger.debug("document %s changed during a query; re-reading", exc)
    raise RuntimeError(
        "the record store keeps losing documents during this query; if this persists, "
        "a document's pointer names a version whose body is gone: run vacuum()"
    )


def retrieval(
    r: RetrievalSettings,
    lexical: BM25Index,
    query: object,
    k: object,
    mode: object,
    queries: object,
    filter: object,
    max_chars: object,
    unknown: Mapping[str, object],
) -> Steps:
    """Check one call of retriever ``r`` (at once), and return its retrieval: an
    :class:`Expand` when a query expander is set, then :func:`retrieve` (``lexical``: its
    in-process BM25 index, for :func:`abstains`)."""
    check_invoke_args(unknown)
    query, k = clean_query(query), check_k(r.k if k is None else k)
    max_chars = check_max_chars(r.max_chars if max_chars is None else max_chars)

    def steps() -> Steps:
        if k == 0 or abstains(r, lexical, query):
            return []
        expansions: list[str] = []
        if r.query_expander is not None:
            expansions = cast("list[str]", (yield Expand(query)))
        s = QuerySettings.of(r, query, k, mode, queries, expansions, filter, max_chars)
        return (yield from retrieve(s))

    return steps()


def abstains(r: RetrievalSettings, lexical: BM25Index, query: str) -> bool:
    """Whether retriever ``r`` returns nothing for ``query``: its in-process BM25 index
    ``lexical`` holds too little of the query's words (the router's ``min_coverage``,
    :func:`query_coverage`)."""
    router = r.router
    if router is None or router.min_coverage <= 0 or r.external_lexical:
        return False
    coverage = query_coverage(lexical, query)
    if coverage < router.min_coverage:
        logger.debug("abstained: the index holds %.2f of the query's weight", coverage)
        return True
    return False


def retrieve(s: QuerySettings) -> Steps:
    """Search → fuse → :func:`run_pipeline`. When a route holds and the router focuses,
    :class:`Focus` adds the query's other clauses searched inside the routed documents.

    A document replaced between the search and the read of its pointer: the retrieval runs
    again. Those attempts hold nothing, so writers never wait for queries; a writer that
    replaces within each of them could starve the query, so the last of the
    :data:`READ_ATTEMPTS` is :class:`Settled`: no pointer swap or cleanup of this process
    runs during it (over an in-process record store), and it reads the old version or the
    new one, never nothing."""
    seen: set[tuple[str, str]] = set()
    for _ in range(READ_ATTEMPTS - 1):
        try:
            return (yield from _attempt(s, seen))
        except Replaced as exc:
            logger.debug("documents %s were replaced during a query; retrieving again", exc)
            seen |= exc.versions
    return cast("list[Document]", (yield Settled(_attempt(s, None))))


def _attempt(s: QuerySettings, seen: set[tuple[str, str]] | None) -> Steps:
    """One attempt at the retrieval: the searches, fusion and :func:`run_pipeline`
    (:class:`Replaced` with ``seen``: see :func:`run_pipeline`)."""
    settings, found = yield from _search_and_fuse(s)
    return (yield from _retrying(settings, *found, seen))


def _search_and_fuse(
    s: QuerySettings,
) -> Generator[Request, object, tuple[QuerySettings, tuple[list[Candidate], Route | None]]]:
    """The searches and fusion of :func:`retrieve`: the settings (with the focus text as
    a rerank query, when focused) and the candidates with the route that holds. The
    router's route (:class:`~langchain_rse.query.Route`) is confirmed against the fused
    ranking, focused, then applied to it (:func:`~langchain_rse.routing.apply_route`)."""
    dense, lexical, route = cast(Found, (yield Search(s.queries, s.filter)))
    branches, texts = branches_of(dense, lexical)
    weights = list(s.weights) * len(dense)
    ranking = fused(branches, weights)
    if route is not None and route.focus:
        route = confirm(route, ranking)
        if route is not None:
            extra = cast("Focused | None", (yield Focus(s.queries[0], set(route.docs), s.filter)))
            if extra is not None:  # the query without its name, inside the routed documents
                text, focus_dense, focus_lexical = extra
                branches += [focus_dense.hits, focus_lexical]
                texts.update(focus_dense.texts)
                weights += [route.focus * w for w in s.weights]
                ranking = fused(branches, weights)
                s = dataclasses.replace(s, rerank_queries=[*s.queries, text])
    ranking, route = apply_route(route, ranking, branches, weights)
    pool = s.candidate_pool + (len(s.queries) - 1) * (s.candidate_pool // 2)
    return s, (candidates(ranking, pool, texts, keep_first=bool(branches[0])), route)


def handlers(
    branches: SearchBranches,
    router: DocumentRouter | None,
    records: RecordStore,
    expander: Expander | None,
    reranker: BaseReranker | None,
    swaps: ReadWriteLock,
    callbacks: Callbacks,
    asynchronous: bool,
) -> Handlers:
    """The handlers of one retrieval over these parts of an index (child runs under
    ``callbacks``; ``swaps``: the writer's lock a query's last attempt holds shared)."""
    traces = TRACES.get()
    report = traces.append if traces is not None else lambda _: None
    a = asynchronous
    out: Handlers = {
        Search: partial(
            branches.asearch if a else branches.search, router=router, callbacks=callbacks
        ),
        ReadPointers: records.apointers if a else records.pointers,
        ReadBodies: records.abodies if a else records.bodies,
        Report: report,
    }
    if router is not None:  # (a query focuses only with a router)
        out[Focus] = partial(
            branches.afocus if a else branches.focus, router=router, callbacks=callbacks
        )
    if expander is not None:
        out[Expand] = partial(expander.aexpand if a else expander.expand, callbacks=callbacks)
    if reranker is not None:
        out[Rerank] = partial(_arerank if a else _rerank, reranker, callbacks)
    out[Settled] = partial(_asettled, swaps, out) if a else partial(_settled, swaps, out)
    return out


def _give_back(taking: asyncio.Future[None], hold: AbstractContextManager[None]) -> None:
    """Give back a hold whose taking finished after its query was cancelled."""
    if not taking.cancelled() and taking.exception() is None:
        hold.__exit__(None, None, None)


def _settled(swaps: ReadWriteLock, handlers: Handlers, steps: Steps) -> list[Document]:
    """``steps`` driven while ``swaps`` is held shared."""
    with swaps.read():
        return drive(steps, handlers, THROWN)


async def _asettled(swaps: ReadWriteLock, handlers: Handlers, steps: Steps) -> list[Document]:
    """Async :func:`_settled` (the hold is taken in a thread, and always given back)."""
    hold = swaps.read()
    taking = asyncio.ensure_future(asyncio.to_thread(hold.__enter__))
    try:
        await asyncio.shield(taking)
    except asyncio.CancelledError:  # the thread still takes it: give it back then
        taking.add_done_callback(lambda t: _give_back(t, hold))
        raise
    try:
        return await adrive(steps, handlers, THROWN)
    finally:
        hold.__exit__(None, None, None)


def _rerank(
    reranker: BaseReranker, callbacks: Callbacks, queries: list[str], docs: list[Document]
) -> list[RerankResult]:
    return [reranker.rerank(q, docs, callbacks=callbacks) for q in queries]


async def _arerank(
    reranker: BaseReranker, callbacks: Callbacks, queries: list[str], docs: list[Document]
) -> list[RerankResult]:
    return list(
        await asyncio.gather(*(reranker.arerank(q, docs, callbacks=callbacks) for q in queries))
    )
