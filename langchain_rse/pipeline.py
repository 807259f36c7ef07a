"""The query path, written once as a sans-I/O generator.

:func:`retrieve` asks for the searches, fuses the branches' hits into candidates, then
:func:`run_pipeline` *yields* each I/O it needs — ``("meta", doc_ids)``, ``("bodies",
records)``, ``("rerank", (queries, docs))`` — and receives the answer;
:func:`langchain_rse.sansio.drive` carries the requests out synchronously and
:func:`~langchain_rse.sansio.adrive` asynchronously, so both paths share every line of
the logic.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from langchain_core.documents import Document

from langchain_rse.bodies import Body
from langchain_rse.chunking import chunk_uuid, doc_of, in_docs, parse_chunk_key
from langchain_rse.enrichment import index_text
from langchain_rse.filters import Filter, both, matches, parse
from langchain_rse.fusion import CODE_CORPUS, FusionMethod, fused, quotes_code
from langchain_rse.pages import PAGE_OFFSETS, page_range
from langchain_rse.records import DocRecord, StaleRead
from langchain_rse.rerank import RerankError, RerankResult
from langchain_rse.routing import DocumentRouter
from langchain_rse.sansio import Request
from langchain_rse.search import DenseResult, Hit
from langchain_rse.segments import (
    RSEParams,
    best_segments,
    by_best_chunk,
    chunk_values,
    merge_touching,
    rank_relevance,
)
from langchain_rse.validation import query_set

__all__ = [
    "Candidate",
    "QuerySettings",
    "Replaced",
    "Route",
    "StaleRead",
    "Trace",
    "handlers",
    "retrieve",
    "run_pipeline",
]

logger = logging.getLogger(__name__)

READ_ATTEMPTS = 3
"""Times a query re-reads (or searches again) when documents change under it."""


class Replaced(Exception):
    """Documents whose every candidate is of a version replaced since the search: the
    query searches again (``versions``: their ``(doc_id, version)``)."""

    def __init__(self, versions: set[tuple[str, str]]) -> None:
        super().__init__(", ".join(sorted(d for d, _ in versions)))
        self.versions = versions


@dataclass(slots=True)
class Candidate:
    """A fused candidate chunk on its way to RSE."""

    key: str
    doc_id: str
    version: str
    chunk_index: int
    score: float
    """Fused score."""
    ranks: list[int]
    """1-based rank in each fused branch (each query's dense, then lexical); 0: not in it."""
    text: str | None = None  # enriched index text, when the dense branch returned it
    relevance: float = 0.0
    rerank_score: float | None = None


@dataclass(frozen=True)
class QuerySettings:
    """What one retrieval needs from the retriever's configuration."""

    k: int
    mode: str
    queries: list[str]
    weights: tuple[float, float]
    fusion: FusionMethod
    rrf_k: float
    candidate_pool: int
    relevance: str
    params: RSEParams
    rerank: bool
    strict_rerank: bool
    filter: Filter | None = None
    """Checked on every candidate's document metadata, whatever the stores returned."""
    max_chars: int | None = None
    """Most characters of text returned in all (the context budget); None: the preset's
    chunk budget alone."""
    trace: bool = False
    """Also yield ``("trace", Trace)`` before returning (for ``RSERetriever.explain``)."""
    rerank_queries: list[str] | None = None
    """What the reranker scores against, when not ``queries`` (with focus: also the focus
    text)."""

    @classmethod
    def of(
        cls,
        r: Any,
        query: str,
        k: int,
        mode: Any,
        queries: Any,
        expansions: list[str],
        f: Any,
        trace: bool = False,
        max_chars: int | None = None,
    ) -> QuerySettings:
        """The settings of one call of retriever ``r`` (its fields, narrowed by the call's
        ``mode``, extra ``queries`` and ``filter``)."""
        mode = r.mode if mode is None else mode
        if mode not in ("segments", "chunks"):
            raise ValueError(f"mode must be 'segments' or 'chunks', got {mode!r}")
        return cls(
            k=k,
            mode=mode,
            queries=query_set(query, queries, expansions, r.max_queries, r.max_query_chars),
            weights=fusion_weights(r, query),
            fusion=r.fusion,
            rrf_k=r.rrf_k,
            candidate_pool=r.candidate_pool,
            relevance=r.relevance,
            params=r.params,
            rerank=r.reranker is not None,
            strict_rerank=r.strict_rerank,
            filter=both(parse(r.filter) if r.filter else None, parse(f) if f else None),
            trace=trace,
            max_chars=max_chars,
        )


def fusion_weights(r: Any, query: str) -> tuple[float, float]:
    """Retriever ``r``'s fusion weights for ``query``: ``code_weights`` when it quotes code,
    ``code_corpus_weights`` when the corpus is code, else ``weights``."""
    if r.code_weights and quotes_code(query):
        return r.code_weights  # type: ignore[no-any-return]
    corpus = r.code_corpus_weights
    if corpus and corpus != r.weights and r._lexical.identifier_density() >= CODE_CORPUS:
        return corpus  # type: ignore[no-any-return]
    return r.weights  # type: ignore[no-any-return]


@dataclass(frozen=True)
class Trace:
    """What one retrieval saw: current candidates with their relevance, the documents'
    records, the selection and the bodies read (at least those of selected documents)."""

    candidates: list[Candidate]
    metas: dict[str, DocRecord]
    selection: list[tuple[str, int, int, float]]
    bodies: dict[str, Body]


@dataclass(frozen=True)
class Route:
    """The documents a query was routed to, when the route holds, and the factor their
    chunks' fused scores were multiplied by (``inf``: only their chunks are candidates)."""

    docs: frozenset[str]
    factor: float


# ---------------------------------------------------------------- stages (pure)


def branches_of(
    dense: Sequence[DenseResult], lexical: Sequence[Sequence[Hit]]
) -> tuple[list[Sequence[Hit]], dict[str, str]]:
    """The fused branches in order (each query's dense, then lexical, hits) and the texts
    the dense branches returned."""
    branches: list[Sequence[Hit]] = []
    texts: dict[str, str] = {}
    for d, lex in zip(dense, lexical):
        branches += [d.hits, lex]
        texts.update(d.texts)
    return branches, texts


def confirmed_route(
    s: QuerySettings,
    dense: Sequence[DenseResult],
    lexical: Sequence[Sequence[Hit]],
    routed: set[str] | None,
    router: DocumentRouter | None,
) -> set[str] | None:
    """The routed documents the unrouted ranking agrees with (see
    :meth:`DocumentRouter.confirmed`), None when there are none."""
    if routed is None or router is None:
        return None
    branches, _ = branches_of(dense, lexical)
    ranking = fused(branches, list(s.weights) * len(dense), s.fusion, s.rrf_k)
    return router.confirmed(routed, ranking.ranked_ids(router.check_k))


def candidates(
    s: QuerySettings,
    dense: Sequence[DenseResult],
    lexical: Sequence[Sequence[Hit]],
    routed: set[str] | None = None,
    router: DocumentRouter | None = None,
    confirmed: bool = False,
) -> tuple[list[Candidate], Route | None]:
    """Fuse (dense, lexical) hits of each query into candidates, best first; with
    ``routed``, the chunks of those documents boosted, or only those chunks (if the
    unrouted ranking agrees; ``confirmed``: ``routed`` was checked already). Also the
    route that holds, if one does. Branches beyond those of ``s.queries`` (the focus
    searches) are fused with the same weights but do not widen the candidate pool."""
    branches, texts = branches_of(dense, lexical)
    weights = list(s.weights) * len(dense)
    ranking = fused(branches, weights, s.fusion, s.rrf_k)
    pool = s.candidate_pool + (len(s.queries) - 1) * (s.candidate_pool // 2)
    route = None
    if routed is not None and router is not None and not confirmed:
        routed = router.confirmed(routed, ranking.ranked_ids(router.check_k))
    if routed is not None and router is not None and not math.isinf(router.boost):
        factor = 1.0 + router.boost
        ranking = ranking.boosted_first(pool, lambda keys: in_docs(keys, routed), factor)
        route = Route(frozenset(routed), factor)
    elif routed is not None:
        kept = [[h for h in b if doc_of(h[0]) in routed] for b in branches]
        if any(kept):
            ranking = fused(kept, weights, s.fusion, s.rrf_k)
            route = Route(frozenset(routed), math.inf)
        else:  # not ours, or not found by either branch: a filter would return nothing
            logger.debug("no candidates in the routed documents %s; searching all", routed)
    at = ranking.order[:pool]  # the first `pool` of the ranking, read as columns
    scores, ranks = ranking.scores[at].tolist(), ranking.ranks[:, at].T.tolist()
    text = texts.get if texts else lambda key: None  # the dense branch returned no texts
    return [
        Candidate(key, *parse_chunk_key(key), score, rank, text(key))
        for key, score, rank in zip(ranking.ranked_ids(pool), scores, ranks)
    ], route


def current(
    cands: list[Candidate], metas: dict[str, DocRecord], f: Filter | None = None
) -> list[Candidate]:
    """Drop candidates of deleted or replaced document versions, and of documents the
    filter rejects (a store that ignored or mistranslated it costs results, never leaks).
    The filter sees a document's metadata with its ``doc_id``, as the chunks' do."""
    live = {  # each document's current version and chunk count, if the filter takes it
        d: (m.version, len(m.spans))
        for d, m in metas.items()
        if f is None or matches(f, {**m.metadata, "doc_id": d})
    }
    return [
        c
        for c in cands
        if (v := live.get(c.doc_id)) is not None and v[0] == c.version and c.chunk_index < v[1]
    ]


def rerank_inputs(
    cands: list[Candidate], bodies: dict[str, Body], metas: dict[str, DocRecord]
) -> list[Document]:
    """The candidates' enriched texts, tagged with their chunk ids."""
    docs = []
    for c in cands:
        if c.text is None:
            body = bodies[c.doc_id]
            start, end = metas[c.doc_id].spans[c.chunk_index]
            c.text = index_text(body.contexts[c.chunk_index], body.slice(start, end))
        docs.append(Document(page_content=c.text, metadata={"chunk_id": chunk_uuid(c.key)}))
    return docs


def apply_relevance(
    s: QuerySettings, cands: list[Candidate], results: list[RerankResult] | None
) -> list[Candidate]:
    """Set each candidate's relevance: reranked (best over queries) or from fusion."""
    if results is None:
        if s.relevance == "score":
            top = max(c.score for c in cands) or 1.0
            for c in cands:
                c.relevance = c.score / top
        else:
            decay = s.params.decay_rate
            if s.max_chars is not None and s.params.decay_chars > 0:
                decay = max(decay, s.max_chars / s.params.decay_chars)
            for c, rel in zip(cands, rank_relevance(len(cands), decay).tolist()):
                c.relevance = rel
        return cands
    kept: dict[int, Candidate] = {}
    for result in results:
        for idx, score, rel in zip(result.indices, result.scores, result.relevance):
            c = cands[idx]
            if idx not in kept or rel > c.relevance:
                c.rerank_score, c.relevance = float(score), float(rel)
            kept[idx] = c
    return sorted(kept.values(), key=lambda c: -c.relevance)


Selection = list[tuple[str, int, int, float]]
"""Chosen ``(doc_id, chunk_start, chunk_end, score)``, best first."""


def select(
    s: QuerySettings,
    cands: list[Candidate],
    metas: dict[str, DocRecord],
    route: Route | None = None,
) -> Selection:
    """The top-k chunks, or the best RSE segments. While a soft ``route`` holds, a segment
    of a document outside it must be worth ``route.factor`` times ``min_segment_value``:
    the bar rises by the factor the routed documents' chunks were favoured by."""
    if s.mode == "chunks":
        ranked, room = sorted(cands, key=lambda c: -c.relevance), s.max_chars
        chosen: Selection = []
        for c in ranked:
            if len(chosen) == s.k:
                break
            if room is not None:
                start, end = metas[c.doc_id].spans[c.chunk_index]
                if end - start > room:
                    continue
                room -= end - start
            chosen.append((c.doc_id, c.chunk_index, c.chunk_index + 1, c.relevance))
        return chosen
    p = s.params
    docs = list(dict.fromkeys([c.doc_id for c in cands]))
    position = {d: i for i, d in enumerate(docs)}
    values, offsets = chunk_values(
        [len(metas[d].spans) for d in docs],
        [(position[c.doc_id], c.chunk_index, c.relevance) for c in cands],
        p.irrelevant_chunk_penalty,
    )
    if s.max_chars is None:  # the preset's budget, in chunks
        budget = p.max_total_chunks + (len(s.queries) - 1) * p.extra_query_chunks
        segs = best_segments(values, offsets, p.max_segment_chunks, budget, p.min_segment_value)
    else:  # the caller's budget, in characters
        sizes = np.fromiter((n for d in docs for n in _strides(metas[d].spans)), np.int64,
                            len(values))  # fmt: skip
        segs = best_segments(values, offsets, p.max_segment_chunks, len(values),
                             p.min_segment_value, sizes, s.max_chars)  # fmt: skip
    if p.merge_touching:
        segs = merge_touching(segs)
    if route is not None and not math.isinf(route.factor):
        bar = route.factor * p.min_segment_value
        segs = [g for g in segs if docs[g.doc] in route.docs or g.value >= bar]
    segs = by_best_chunk(segs, values, offsets)
    return [(docs[g.doc], g.start, g.end, g.value) for g in segs[: s.k]]


def _strides(spans: Sequence[tuple[int, int]]) -> list[int]:
    """What each chunk adds to a segment's length: from its start to its end or the next
    chunk's start, whichever is later (so a run's strides add up to at least its text,
    however the chunks overlap or leave gaps)."""
    nexts = [b for b, _ in spans[1:]] + [0]
    return [max(e, n) - b for (b, e), n in zip(spans, nexts)]


def results(
    s: QuerySettings,
    cands: list[Candidate],
    metas: dict[str, DocRecord],
    bodies: dict[str, Body],
    selection: Selection,
    fallback: bool,
) -> list[Document]:
    """The returned ``Document``\\ s: exact slices of the source, with their metadata."""
    keyed = s.mode == "chunks" or len(s.queries) > 1  # chunk metadata, or query ranks
    by_key = {(c.doc_id, c.chunk_index): c for c in cands} if keyed else {}
    out = []
    for doc_id, start, end, score in selection:
        meta, body = metas[doc_id], bodies[doc_id]
        first, last = meta.spans[start][0], meta.spans[end - 1][1]
        md: dict[str, Any] = dict(meta.metadata)
        md.update(doc_id=doc_id, start_index=first, end_index=last, chunk_start=start,
                  chunk_end=end, score=score)  # fmt: skip
        offsets = md.pop(PAGE_OFFSETS, None)
        if offsets:  # a source with pages: the segment's pages, 1-based and inclusive
            md["page_start"], md["page_end"] = page_range(offsets, first, last)
        if s.mode == "chunks":
            c = by_key[(doc_id, start)]
            md.update(
                chunk_index=start,
                fused_score=c.score,
                dense_rank=c.ranks[0] or None,
                lexical_rank=c.ranks[1] or None,
                context=body.contexts[start].text,
            )
            if c.rerank_score is not None:
                md["rerank_score"] = c.rerank_score
        if len(s.queries) > 1:
            md.update(
                queries=list(s.queries), query_ranks=_query_ranks(s, by_key, doc_id, start, end)
            )
        if fallback:
            md["rerank_fallback"] = True
        out.append(Document(page_content=body.slice(first, last), metadata=md))
    return out


def _query_ranks(
    s: QuerySettings, by_key: dict[tuple[str, int], Candidate], doc_id: str, start: int, end: int
) -> dict[str, int]:
    """Which queries found a result, and their best rank in either branch."""
    hits: dict[str, int] = {}
    for i in range(start, end):
        hit = by_key.get((doc_id, i))
        if hit is None:
            continue
        for q_index, query in enumerate(s.queries):
            ranks = [r for r in hit.ranks[2 * q_index : 2 * q_index + 2] if r]
            if ranks and min(ranks) < hits.get(query, 1 << 30):
                hits[query] = min(ranks)
    return hits


# ---------------------------------------------------------------- the generator


def replaced(
    before: list[Candidate], after: list[Candidate], metas: dict[str, DocRecord]
) -> set[tuple[str, str]]:
    """``(doc_id, version)`` of the candidates of documents that kept none of their
    candidates (``after``: the current ones) because the document has another version now."""
    kept = {c.doc_id for c in after}
    return {
        (c.doc_id, c.version)
        for c in before
        if c.doc_id not in kept
        and (m := metas.get(c.doc_id)) is not None
        and m.version != c.version
    }


def run_pipeline(
    s: QuerySettings,
    cands: list[Candidate],
    route: Route | None = None,
    seen: set[tuple[str, str]] | None = None,
) -> Generator[Request, Any, list[Document]]:
    """Records → current candidates → rerank → relevance → selection → documents. With
    ``seen``, :class:`Replaced` is raised when a document's candidates are all of a version
    replaced since the search, unless ``seen`` holds them (versions that a search
    finds again are leftovers that ``vacuum`` removes, not a replace under way)."""
    if not cands:
        return []
    doc_ids = list(dict.fromkeys([c.doc_id for c in cands]))
    metas = {m.doc_id: m for m in (yield ("meta", doc_ids)) if m is not None}
    found, cands = cands, current(cands, metas, s.filter)
    if seen is not None and (new := replaced(found, cands, metas) - seen):
        raise Replaced(new)
    if not cands:
        return []
    bodies: dict[str, Body] = {}
    reranked: list[RerankResult] | None = None
    fallback = False
    if s.rerank:
        need = [metas[d] for d in dict.fromkeys(c.doc_id for c in cands if c.text is None)]
        bodies.update(zip((m.doc_id for m in need), (yield ("bodies", need))))
        try:
            queries = s.rerank_queries or s.queries
            reranked = yield ("rerank", (queries, rerank_inputs(cands, bodies, metas)))
        except RerankError as exc:
            if s.strict_rerank:
                raise
            logger.warning("reranker failed (%s); using the fused ranking instead", exc)
            fallback = True
    cands = apply_relevance(s, cands, reranked)
    selection = select(s, cands, metas, route)
    need = [metas[d] for d in dict.fromkeys(g[0] for g in selection) if d not in bodies]
    bodies.update(zip((m.doc_id for m in need), (yield ("bodies", need))))
    if s.trace:
        yield ("trace", Trace(cands, metas, selection, bodies))
    return results(s, cands, metas, bodies, selection, fallback)


# ---------------------------------------------------------------- the whole query


def _retrying(
    s: QuerySettings,
    cands: list[Candidate],
    route: Route | None,
    seen: set[tuple[str, str]] | None = None,
) -> Generator[Request, Any, list[Document]]:
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


def retrieve(
    s: QuerySettings, router: DocumentRouter | None
) -> Generator[Request, Any, list[Document]]:
    """Search → fuse → :func:`run_pipeline`: one retrieval after its settings are made.
    ``("search", s)`` is answered with ``(dense, lexical, routed)``: each query's branch
    results and the routed documents (``None`` without a route). When a route holds and
    the router focuses, ``("focus", (query, routed, filter))`` is answered with the query's
    clauses other than the one naming the document (the focus text) and their dense and
    lexical results inside the routed documents, or None (see ``DocumentRouter.focus``);
    a reranker then scores the candidates against the focus text too.

    When a document was replaced between the search and the read of its pointer, so
    that none of its candidates is current, the query searches again (up to
    :data:`READ_ATTEMPTS` times): it returns the old or the new version, not nothing."""
    seen: set[tuple[str, str]] = set()
    for attempt in range(READ_ATTEMPTS):
        settings, found = yield from _search(s, router)
        last = attempt == READ_ATTEMPTS - 1
        try:
            return (yield from _retrying(settings, *found, None if last else seen))
        except Replaced as exc:
            logger.debug("documents %s were replaced during a query; searching again", exc)
            seen |= exc.versions
    raise AssertionError("unreachable: the last attempt does not raise Replaced")


def _search(
    s: QuerySettings, router: DocumentRouter | None
) -> Generator[Request, Any, tuple[QuerySettings, tuple[list[Candidate], Route | None]]]:
    """The searches and fusion of :func:`retrieve`: the settings (with the focus text as
    a rerank query, when focused) and the candidates with their route."""
    dense, lexical, routed = yield ("search", s)
    confirmed = False
    if routed is not None and router is not None and router.focuses(s.queries[0]):
        routed, confirmed = confirmed_route(s, dense, lexical, routed, router), True
        if routed is not None:
            extra = yield ("focus", (s.queries[0], routed, s.filter))
            if extra is not None:  # the query's other clauses, inside the routed documents
                text, focus_dense, focus_lexical = extra
                dense, lexical = [*dense, focus_dense], [*lexical, focus_lexical]
                s = dataclasses.replace(s, rerank_queries=[*s.queries, text])
    return s, candidates(s, dense, lexical, routed, router, confirmed)


THROWN = (RerankError, StaleRead)
"""Handler errors raised inside the pipeline, which recovers from them (a failed rerank
falls back to the fused ranking; a stale read reads again)."""


def handlers(records: Any, reranker: Any, callbacks: Any, traces: Any, asynchronous: bool
             ) -> dict[str, Callable[[Any], Any]]:  # fmt: skip
    """The handlers of :func:`run_pipeline`'s requests: record reads, the reranker (when
    one is configured; several queries rerank concurrently on the async path) and the
    ``explain`` trace list (when one is being kept)."""
    out: dict[str, Callable[[Any], Any]] = (
        {"meta": records.apointers, "bodies": records.abodies}
        if asynchronous
        else {"meta": records.pointers, "bodies": records.bodies}
    )
    if reranker is not None and asynchronous:

        async def rerank(arg: Any) -> list[Any]:
            replies = (reranker.arerank(q, arg[1], callbacks=callbacks) for q in arg[0])
            return list(await asyncio.gather(*replies))

        out["rerank"] = rerank
    elif reranker is not None:
        out["rerank"] = lambda a: [reranker.rerank(q, a[1], callbacks=callbacks) for q in a[0]]
    if traces is not None and asynchronous:

        async def append(trace: Any) -> None:
            traces.append(trace)

        out["trace"] = append
    elif traces is not None:
        out["trace"] = traces.append
    return out
