"""Relevant Segment Extraction (RSE): chunk relevance → chunk values → best segments.

Pure numpy, no I/O.

* Each candidate chunk has a relevance in [0, 1]: a calibrated reranker score, or
  ``exp(-rank / decay_rate)`` of its 0-based rank in the fused list when there is
  no reranker (:func:`rank_relevance`).
* Its value is ``relevance - irrelevant_chunk_penalty``; every other chunk of a
  candidate document is worth ``-irrelevant_chunk_penalty`` (:func:`chunk_values`).
* :func:`best_segments` picks segments greedily, and each pick is exact: it takes
  the run of consecutive chunks of one document with the highest total value among
  all runs that are at most ``max_segment_chunks`` long, overlap no picked segment
  and fit the remaining ``max_total_chunks`` budget; it stops when the best run is
  worth less than ``min_segment_value``. This is the formulation of dsRAG's RSE,
  computed from prefix sums: a run's value never changes, so the picks are the runs
  worth at least the floor taken best first and skipped when they overlap a pick or
  no longer fit the budget; one sort (of the best few hundred runs, usually) instead
  of a brute force over all runs per pick. A run of several chunks is picked only if it
  starts on a chunk worth 0 or more and ends on one worth more than 0, so only those are
  valued: a few per retrieved chunk, however long the documents (with a floor of 0 or
  below, every lone chunk too).
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
from langchain_core.documents import Document

from langchain_rse.indexing.chunking import PAGE_OFFSETS, page_range

if TYPE_CHECKING:
    from langchain_rse.indexing.records import Body, DocRecord
    from langchain_rse.query import Candidate, Route

__all__ = [
    "PRESETS",
    "RSEParams",
    "Segment",
    "best_segments",
    "by_best_chunk",
    "choose_segments",
    "chunk_values",
    "get_preset",
    "keep_dense_first",
    "preset_for_chunk_size",
    "merge_touching",
    "rank_relevance",
    "segment_documents",
]


@dataclass(frozen=True)
class RSEParams:
    """Parameters of segment extraction (counts are in chunks)."""

    max_segment_chunks: int = 15
    """Longest segment, in chunks."""
    max_total_chunks: int = 30
    """Budget over all returned segments, in chunks."""
    min_segment_value: float = 0.5
    """A segment worth less than this is not returned."""
    irrelevant_chunk_penalty: float = 0.18
    """Subtracted from every chunk's relevance; the price of including a chunk."""
    decay_rate: float = 30.0
    """Rank→relevance decay when there is no reranker: ``exp(-rank / decay_rate)``."""
    extra_query_chunks: int = 5
    """Budget added to ``max_total_chunks`` for each query beyond the first."""
    decay_chars: float = 200.0
    """With a context budget (``max_chars``), the rank decay is at least ``max_chars /
    decay_chars``: a larger budget reaches further down the fused ranking instead of
    stopping where the preset's floor stops a small one (0: the preset's ``decay_rate``
    always)."""
    keep_dense_first: bool = True
    """Without a reranker and with ``k`` > 1, the chunk the dense search ranks first always
    comes back (:func:`keep_dense_first`): BM25, fusion and segment packing add to the
    embedding's best answer but never crowd it out."""
    merge_touching: bool = True
    """Return segments that touch (one ends where another of the same document starts)
    as one: a relevant passage longer than ``max_segment_chunks`` comes back whole when
    its parts are picked (:func:`merge_touching`)."""

    def __post_init__(self) -> None:
        if self.max_segment_chunks < 1:
            raise ValueError(f"max_segment_chunks must be >= 1, got {self.max_segment_chunks}")
        if self.max_total_chunks < 1:
            raise ValueError(f"max_total_chunks must be >= 1, got {self.max_total_chunks}")
        if not 0 <= self.irrelevant_chunk_penalty <= 1:
            raise ValueError(
                f"irrelevant_chunk_penalty must be in [0, 1], got {self.irrelevant_chunk_penalty}"
            )
        if self.decay_rate <= 0:
            raise ValueError(f"decay_rate must be positive, got {self.decay_rate}")

    def with_overrides(self, **overrides: float | int) -> RSEParams:
        """A copy with some fields replaced."""
        return replace(self, **overrides)  # type: ignore[arg-type]


PRESETS: dict[str, RSEParams] = {
    # dsRAG's "balanced" parameters, the prior art.
    "balanced": RSEParams(15, 30, 0.5, 0.18, 30.0),
    # Short, high-confidence segments.
    "precision": RSEParams(4, 12, 0.6, 0.25, 10.0),
    # Long segments, generous budget: for questions whose answer spans sections.
    "find_all": RSEParams(40, 60, 0.4, 0.15, 40.0),
    # The default pipeline (document routing, 300-character chunks): runs of up
    # to 3 chunks, joined when they touch, up to 24 chunks in all; chosen on half a of the
    # CUAD dev split, checked on half b (benchmarks/RESULTS.md).
    "default": RSEParams(3, 24, 0.2, 0.2, 20.0),
    # The default for 600-character chunks (the default chunk size until 2026-12-02).
    "long_chunks": RSEParams(2, 12, 0.3, 0.3, 10.0),
    # The default before document routing (RRF 1:1, no routing): the best of the sweeps on
    # the CUAD dev split without a reranker.
    "unrouted": RSEParams(4, 12, 0.2, 0.3, 10.0),
    # The best of the sweeps on the CUAD dev split with a reranker (the offline
    # EmbeddingReranker, min-max calibrated with rank decay 20): 2-chunk segments and a
    # lower per-chunk price (decay_rate is unused when a reranker gives the relevance).
    "reranked": RSEParams(2, 12, 0.2, 0.2, 10.0),
}


LONG_CHUNKS_FROM = 600
"""Chunk size (characters) from which ``preset=None`` picks ``"long_chunks"``."""


def preset_for_chunk_size(chunk_size: int) -> str:
    """The preset tuned for ``chunk_size``: ``"default"`` (300-character chunks) below
    :data:`LONG_CHUNKS_FROM` characters, ``"long_chunks"`` (600) from there on."""
    return "long_chunks" if chunk_size >= LONG_CHUNKS_FROM else "default"


def get_preset(name: str) -> RSEParams:
    """The named preset; a ``ValueError`` lists the known names."""
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown RSE preset {name!r}; known: {sorted(PRESETS)}") from None


class Segment(NamedTuple):
    """A run ``[start, end)`` of chunks of document ``doc`` (indices into the inputs)."""

    doc: int
    start: int
    end: int
    value: float


def rank_relevance(n: int, decay_rate: float) -> np.ndarray:
    """Relevance of ranks ``0..n-1`` when only a ranking is known: ``exp(-rank/decay)``."""
    return np.exp(-np.arange(n, dtype=np.float64) / decay_rate)


def chunk_values(
    num_chunks: Sequence[int],
    hits: Iterable[tuple[int, int, float]],
    irrelevant_chunk_penalty: float,
) -> tuple[np.ndarray, np.ndarray]:
    """Values of every chunk of the candidate documents, flattened.

    ``num_chunks[d]`` is the chunk count of candidate document ``d``; ``hits`` are
    ``(doc, chunk_index, relevance)``; a chunk hit twice keeps its best relevance.
    Returns ``(values, offsets)`` with document ``d`` at ``values[offsets[d]:offsets[d+1]]``.
    """
    counts = np.asarray(num_chunks, dtype=np.int64)
    offsets = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    relevance = np.zeros(int(offsets[-1]), dtype=np.float64)
    found = hits if isinstance(hits, list) else list(hits)
    if found:
        docs, idx, rel = (np.asarray(x) for x in zip(*found))
        outside = (idx < 0) | (idx >= counts[docs])
        if outside.any():
            at = int(np.argmax(outside))
            raise IndexError(f"chunk {idx[at]} out of range for document {docs[at]}")
        np.maximum.at(relevance, offsets[docs] + idx, rel.astype(np.float64))
    return relevance - irrelevant_chunk_penalty, offsets


def best_segments(
    values: np.ndarray,
    offsets: np.ndarray,
    max_segment_chunks: int,
    max_total_chunks: int,
    min_segment_value: float,
    sizes: np.ndarray | None = None,
    max_size: int | None = None,
) -> list[Segment]:
    """Greedy-exact segment search (see the module docstring); best first.

    With ``sizes`` (each chunk's length in characters, flattened like ``values``) and
    ``max_size``, the picks' total size also stays within ``max_size``: a run that no longer
    fits is skipped like one that overlaps a pick, so smaller runs still fill the rest.
    """
    values = np.asarray(values, dtype=np.float64)
    offsets = np.asarray(offsets, dtype=np.int64)
    n = values.size
    budget = int(max_total_chunks)
    if n == 0 or budget <= 0:
        return []
    prefix = np.zeros(n + 1)
    np.cumsum(values, out=prefix[1:])
    room = None if max_size is None or sizes is None else int(max_size)
    if room is not None:
        size_prefix = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(np.asarray(sizes, dtype=np.int64), out=size_prefix[1:])
        size_at = size_prefix.tolist()
    cap = min(int(max_segment_chunks), budget, n)
    # A run longer than one chunk that starts on a negative chunk, or ends on a chunk worth
    # at most 0, is never picked: the run without that chunk is worth more (or as much, and
    # comes first), and whatever rules it out rules the longer one out too. So runs start
    # on chunks worth 0 or more (on any chunk when a lone negative one can make the floor);
    # runs[r, l - 1] is the run of l chunks from chunk first[r], -inf where it is left out or
    # would cross its document's end. Leaving them out leaves the picks as they are.
    first = np.flatnonzero(values >= 0) if min_segment_value > 0 else np.arange(n)
    ends = first[:, None] + np.arange(1, cap + 1)
    inside = ends <= offsets[np.searchsorted(offsets, first, side="right")][:, None]
    np.minimum(ends, n, out=ends)
    ok = inside & (values[ends - 1] > 0)
    ok[:, 0] = inside[:, 0]
    ok[:, 1:] &= (values[first] >= 0)[:, None]
    runs = np.where(ok, prefix[ends] - prefix[first][:, None], -np.inf)
    # Runs never change value; a pick only rules out the runs that overlap it or no longer
    # fit the budget. So the greedy picks are the runs worth at least the floor, in the order
    # best value, then first start, then shortest (start-major runs, sorted stably), that are
    # still allowed when their turn comes. They are sorted a batch of the best at a time:
    # most searches end within the first.
    flat = runs.ravel()
    worthy = np.flatnonzero(flat >= min_segment_value)
    worth = flat[worthy]
    taken = bytearray(n)
    firsts, starts = offsets.tolist(), first.tolist()
    segments: list[Segment] = []
    while worthy.size and budget > 0 and room != 0:
        head = np.ones(worthy.size, dtype=bool)
        batch = 4 * cap * budget
        if batch < worthy.size:  # the best `batch` runs and every run tied with the last
            head = worth >= -np.partition(-worth, batch - 1)[batch - 1]
        order = worthy[head][np.argsort(-worth[head], kind="stable")]
        worthy, worth = worthy[~head], worth[~head]
        rows, lengths = np.divmod(order, cap)
        for row, length, v in zip(rows.tolist(), (lengths + 1).tolist(), flat[order].tolist()):
            i = starts[row]
            if length > budget or taken.find(1, i, i + length) != -1:
                continue
            if room is not None:
                size = size_at[i + length] - size_at[i]
                if size > room:
                    continue
                room -= size
            taken[i : i + length] = b"\x01" * length
            doc = bisect_right(firsts, i) - 1
            start = i - firsts[doc]
            segments.append(Segment(doc, start, start + length, v))
            budget -= length
            if budget == 0 or room == 0:
                break
    return segments


def merge_touching(segments: Sequence[Segment]) -> list[Segment]:
    """``segments`` with each group of touching segments of one document joined into one
    run worth their total, best first (ties: in the order of each run's first segment in
    ``segments``, which come best first).

    :func:`best_segments` caps each pick at ``max_segment_chunks``; a longer passage whose
    every chunk is relevant is then picked as several adjacent runs, and returning them as
    one segment gives the reader the passage whole, in order.
    """
    run_of = list(range(len(segments)))  # each segment's run: its first segment by position
    last = -1
    for i in sorted(range(len(segments)), key=segments.__getitem__):  # by document, start
        seg, before = segments[i], segments[last]
        if last >= 0 and before.doc == seg.doc and before.end == seg.start:
            run_of[i] = run_of[last]
        last = i
    runs: dict[int, list[Any]] = {}  # in the order of each run's best segment
    for seg, run in zip(segments, run_of):
        if (joined := runs.get(run)) is None:
            runs[run] = list(seg)
        else:
            joined[1], joined[2] = min(joined[1], seg.start), max(joined[2], seg.end)
            joined[3] += seg.value
    return sorted((Segment(*r) for r in runs.values()), key=lambda g: -g.value)


def by_best_chunk(
    segments: Sequence[Segment], values: np.ndarray, offsets: np.ndarray
) -> list[Segment]:
    """``segments`` ordered by the value of their best chunk (ties: as given): the segment
    holding the top-ranked chunk comes first, however long the others are. Total value
    decides which segments :func:`best_segments` picks; a reader (and a budget cut) wants
    the most relevant text first, and a run of several middling chunks can be worth more
    in total than one exact hit."""
    if not segments:
        return []
    firsts = offsets.tolist()
    bounds = [firsts[g.doc] + x for g in segments for x in (g.start, g.end)]
    best = np.maximum.reduceat(np.append(values, -np.inf), bounds)[::2].tolist()
    return [segments[i] for i in sorted(range(len(segments)), key=lambda i: -best[i])]


# ---------------------------------------------------------------- one query's segments


Selection = list[tuple[str, int, int, float]]
"""Chosen ``(doc_id, chunk_start, chunk_end, score)``, best first."""


def choose_segments(
    s: Any,
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
        sizes = np.fromiter(
            (n for d in docs for n in _strides(metas[d].spans)), np.int64, len(values)
        )
        segs = best_segments(
            values,
            offsets,
            p.max_segment_chunks,
            len(values),
            p.min_segment_value,
            sizes,
            s.max_chars,
        )
    if p.merge_touching:
        segs = merge_touching(segs)
    if route is not None and not math.isinf(route.factor):
        bar = route.factor * p.min_segment_value
        segs = [g for g in segs if docs[g.doc] in route.docs or g.value >= bar]
    segs = by_best_chunk(segs, values, offsets)
    if p.keep_dense_first and not s.rerank and s.k > 1:
        segs = keep_dense_first(s, segs, cands, metas, docs, values, offsets)
    return [(docs[g.doc], g.start, g.end, g.value) for g in segs[: s.k]]


def keep_dense_first(
    s: Any,
    segs: list[Segment],
    cands: list[Candidate],
    metas: dict[str, DocRecord],
    docs: list[str],
    values: np.ndarray,
    offsets: np.ndarray,
) -> list[Segment]:
    """``segs`` holding the chunk the query's dense search ranked first.

    Fusion, a route's boost and segment packing may add text around it and before it,
    but not crowd it out: when no segment holds it, it comes back as a segment of its own
    (if it fits the context budget), and the others follow while they fit ``k`` and the
    budget. (Without a reranker only: a reranker's relevance outranks the dense order,
    and may return nothing; and with ``k`` > 1: a single result is RSE's best.)"""
    first = next((c for c in cands if c.ranks[0] == 1), None)
    if first is None:
        return segs
    d, i = docs.index(first.doc_id), first.chunk_index
    if any(g.doc == d and g.start <= i < g.end for g in segs):
        return segs

    def length(g: Segment) -> int:
        spans = metas[docs[g.doc]].spans
        return spans[g.end - 1][1] - spans[g.start][0]

    kept = [Segment(d, i, i + 1, float(values[offsets[d] + i]))]
    room = None if s.max_chars is None else s.max_chars - length(kept[0])
    if room is not None and room < 0:  # a budget smaller than the chunk
        return segs
    for g in segs:
        if len(kept) == s.k:
            break
        if room is not None:
            if length(g) > room:
                continue
            room -= length(g)
        kept.append(g)
    if s.params.merge_touching:
        kept = merge_touching(kept)
    return by_best_chunk(kept, values, offsets)


def _strides(spans: Sequence[tuple[int, int]]) -> list[int]:
    """What each chunk adds to a segment's length: from its start to its end or the next
    chunk's start, whichever is later (so a run's strides add up to at least its text,
    however the chunks overlap or leave gaps)."""
    nexts = [b for b, _ in spans[1:]] + [0]
    return [max(e, n) - b for (b, e), n in zip(spans, nexts)]


def segment_documents(
    s: Any,
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
        md.update(
            doc_id=doc_id,
            start_index=first,
            end_index=last,
            chunk_start=start,
            chunk_end=end,
            score=score,
        )
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
    s: Any, by_key: dict[tuple[str, int], Candidate], doc_id: str, start: int, end: int
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
