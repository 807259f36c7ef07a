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
* :func:`fit_segments` then turns the chosen chunk runs into characters, within the
  budget: gaps of up to two chunks bridged, ends moved to sentence or line boundaries, fragments
  grown or left out, ends carried on to their paragraph's end (the text is passed in; still
  no I/O).
"""

from __future__ import annotations

import math
import re
from bisect import bisect_right
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, NamedTuple, Protocol, cast

import numpy as np
from langchain_core.documents import Document
from numpy.typing import NDArray

from langchain_rse.indexing.chunking import PAGE_OFFSETS, page_range

if TYPE_CHECKING:
    from langchain_rse.indexing.records import Body, Pointer
    from langchain_rse.query import Candidate, Route

Floats = NDArray[np.float64]
Ints = NDArray[np.int64]

__all__ = [
    "PRESETS",
    "RSEParams",
    "Segment",
    "best_segments",
    "by_best_chunk",
    "Chosen",
    "choose_segments",
    "chunk_values",
    "fit_segments",
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
    bridge_chunks: int = 2
    """Two returned segments of one document at most this many chunks apart come back as
    one, across the gap, when the gap's characters fit the context budget: an answer
    between two relevant passages is not left out (:func:`fit_segments`; 0: never)."""
    snap_chars: int = 150
    """How far (characters) a segment's start or end may move to a sentence or line
    boundary (not a line break inside a sentence of wrapped prose), so that it does not
    begin or stop mid-phrase: outward when the budget has room, else inward, never past the
    dense search's first chunk (0: exact chunk ends)."""
    min_result_chars: int = 100
    """A shorter result (a bare heading, a few words) is grown forward, then backward, to at
    least this many characters and the next sentence or line end, within the budget;
    when it cannot be, it is left out, unless it is its whole document or holds the dense
    search's first chunk (0: off)."""
    headed_segment_chunks: int | None = None
    """Longest segment in a document with line headings (Markdown, reStructuredText,
    AsciiDoc): documentation whose answers are paragraphs with their lead-in (None: the
    same as ``max_segment_chunks``; never shorter than it)."""
    paragraph_chars: int = 300
    """How far (characters) a result that stops inside a paragraph may go on to the
    paragraph's end (a blank line, or the text's end) when the budget has room left after
    every result is placed: an answer is not cut off before its last sentences (0: off)."""

    def __post_init__(self) -> None:
        if self.max_segment_chunks < 1:
            raise ValueError(f"max_segment_chunks must be >= 1, got {self.max_segment_chunks}")
        if self.headed_segment_chunks is not None and self.headed_segment_chunks < 1:
            raise ValueError(
                f"headed_segment_chunks must be >= 1, got {self.headed_segment_chunks}"
            )
        if self.max_total_chunks < 1:
            raise ValueError(f"max_total_chunks must be >= 1, got {self.max_total_chunks}")
        if not 0 <= self.irrelevant_chunk_penalty <= 1:
            raise ValueError(
                f"irrelevant_chunk_penalty must be in [0, 1], got {self.irrelevant_chunk_penalty}"
            )
        if self.decay_rate <= 0:
            raise ValueError(f"decay_rate must be positive, got {self.decay_rate}")
        for name in ("bridge_chunks", "snap_chars", "min_result_chars", "paragraph_chars"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")

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
    # CUAD dev split, checked on half b; up to 5 in documents with headings, chosen on the
    # Flask docs, checked on Starlette's (benchmarks/RESULTS.md).
    "default": RSEParams(3, 24, 0.2, 0.2, 20.0, headed_segment_chunks=5),
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


class SegmentSettings(Protocol):
    """What segment selection reads from a query's settings
    (:class:`~langchain_rse.pipeline.QuerySettings`)."""

    @property
    def k(self) -> int: ...

    @property
    def mode(self) -> str: ...

    @property
    def queries(self) -> list[str]: ...

    @property
    def params(self) -> RSEParams: ...

    @property
    def rerank(self) -> bool: ...

    @property
    def max_chars(self) -> int | None: ...


class Segment(NamedTuple):
    """A run ``[start, end)`` of chunks of document ``doc`` (indices into the inputs)."""

    doc: int
    start: int
    end: int
    value: float


def rank_relevance(n: int, decay_rate: float) -> Floats:
    """Relevance of ranks ``0..n-1`` when only a ranking is known: ``exp(-rank/decay)``."""
    return np.exp(-np.arange(n, dtype=np.float64) / decay_rate)


def chunk_values(
    num_chunks: Sequence[int],
    hits: Iterable[tuple[int, int, float]],
    irrelevant_chunk_penalty: float,
) -> tuple[Floats, Ints]:
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
    values: Floats,
    offsets: Ints,
    max_segment_chunks: int,
    max_total_chunks: int,
    min_segment_value: float,
    sizes: Ints | None = None,
    max_size: int | None = None,
    doc_caps: Ints | None = None,
) -> list[Segment]:
    """Greedy-exact segment search (see the module docstring); best first.

    With ``doc_caps``, the longest run in document ``d`` is ``doc_caps[d]`` chunks instead
    of ``max_segment_chunks``. With ``sizes`` (each chunk's length in characters, flattened
    like ``values``) and ``max_size``, the picks' total size also stays within
    ``max_size``: a run that no longer fits is skipped like one that overlaps a pick, so
    smaller runs still fill the rest.
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
    longest = int(max_segment_chunks) if doc_caps is None else int(np.max(doc_caps))
    cap = min(longest, budget, n)
    # A run longer than one chunk that starts on a negative chunk, or ends on a chunk worth
    # at most 0, is never picked: the run without that chunk is worth more (or as much, and
    # comes first), and whatever rules it out rules the longer one out too. So runs start
    # on chunks worth 0 or more (on any chunk when a lone negative one can make the floor);
    # runs[r, l - 1] is the run of l chunks from chunk first[r], -inf where it is left out or
    # would cross its document's end. Leaving them out leaves the picks as they are.
    first = np.flatnonzero(values >= 0) if min_segment_value > 0 else np.arange(n)
    ends = first[:, None] + np.arange(1, cap + 1)
    doc_of_first = np.searchsorted(offsets, first, side="right") - 1
    inside = ends <= offsets[doc_of_first + 1][:, None]
    if doc_caps is not None:  # each document's own longest run
        inside &= np.arange(1, cap + 1) <= np.asarray(doc_caps)[doc_of_first][:, None]
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
    runs: dict[int, Segment] = {}  # in the order of each run's best segment
    for seg, run in zip(segments, run_of):
        if (joined := runs.get(run)) is None:
            runs[run] = seg
        else:
            start, end = min(joined.start, seg.start), max(joined.end, seg.end)
            runs[run] = Segment(joined.doc, start, end, joined.value + seg.value)
    return sorted(runs.values(), key=lambda g: -g.value)


def by_best_chunk(segments: Sequence[Segment], values: Floats, offsets: Ints) -> list[Segment]:
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
    s: SegmentSettings,
    cands: list[Candidate],
    pointers: dict[str, Pointer],
    route: Route | None = None,
) -> Selection:
    """The top-k chunks, or the best RSE segments. While a soft ``route`` holds, a segment
    of a document outside it must be worth ``route.segment_factor`` times
    ``min_segment_value``: the bar rises by the factor the routed documents' chunks were
    favoured by."""
    if s.mode == "chunks":
        ranked, room = sorted(cands, key=lambda c: -c.relevance), s.max_chars
        chosen: Selection = []
        for c in ranked:
            if len(chosen) == s.k:
                break
            if room is not None:
                start, end = pointers[c.doc_id].spans[c.chunk_index]
                if end - start > room:
                    continue
                room -= end - start
            chosen.append((c.doc_id, c.chunk_index, c.chunk_index + 1, c.relevance))
        return chosen
    p = s.params
    docs = list(dict.fromkeys([c.doc_id for c in cands]))
    position = {d: i for i, d in enumerate(docs)}
    values, offsets = chunk_values(
        [len(pointers[d].spans) for d in docs],
        [(position[c.doc_id], c.chunk_index, c.relevance) for c in cands],
        p.irrelevant_chunk_penalty,
    )
    caps = None
    if p.headed_segment_chunks is not None and p.headed_segment_chunks > p.max_segment_chunks:
        caps = np.array(
            [p.headed_segment_chunks if pointers[d].headed else p.max_segment_chunks for d in docs]
        )
    if s.max_chars is None:  # the preset's budget, in chunks
        budget = p.max_total_chunks + (len(s.queries) - 1) * p.extra_query_chunks
        segs = best_segments(
            values, offsets, p.max_segment_chunks, budget, p.min_segment_value, doc_caps=caps
        )
    else:  # the caller's budget, in characters
        sizes = np.fromiter(
            (n for d in docs for n in _strides(pointers[d].spans)), np.int64, len(values)
        )
        segs = best_segments(
            values,
            offsets,
            p.max_segment_chunks,
            len(values),
            p.min_segment_value,
            sizes,
            s.max_chars,
            caps,
        )
    if p.merge_touching:
        segs = merge_touching(segs)
    if route is not None and route.segment_factor is not None:
        bar = route.segment_factor * p.min_segment_value
        segs = [g for g in segs if docs[g.doc] in route.docs or g.value >= bar]
    segs = by_best_chunk(segs, values, offsets)
    if p.keep_dense_first and not s.rerank and s.k > 1:
        segs = keep_dense_first(s, segs, cands, pointers, docs, values, offsets)
    return [(docs[g.doc], g.start, g.end, g.value) for g in segs[: s.k]]


def keep_dense_first(
    s: SegmentSettings,
    segs: list[Segment],
    cands: list[Candidate],
    pointers: dict[str, Pointer],
    docs: list[str],
    values: Floats,
    offsets: Ints,
) -> list[Segment]:
    """The first ``k`` of ``segs``, holding the chunk the query's dense search ranked first.

    Fusion, a route's boost and segment packing may add text around it and before it,
    but not crowd it out: a segment that holds it but ranks below ``k`` takes the place of
    the last one above; when no segment holds it, it comes back as a segment of its own (if
    it fits the context budget), and the others follow while they fit ``k`` and the budget;
    those that touch it are joined to it only when the text between them fits too.
    (Without a reranker only: a reranker's relevance outranks the dense order, and may
    return nothing; and with ``k`` > 1: a single result is RSE's best.)"""
    first = next((c for c in cands if c.ranks[0] == 1), None)
    if first is None or first.doc_id not in docs:
        return segs[: s.k]
    d, i = docs.index(first.doc_id), first.chunk_index
    holder = next((g for g in segs if g.doc == d and g.start <= i < g.end), None)
    if holder is not None:  # the segments fit the budget together, so any of them do
        if segs.index(holder) < s.k:
            return segs[: s.k]
        return by_best_chunk([holder, *segs[: s.k - 1]], values, offsets)
    kept = [Segment(d, i, i + 1, float(values[offsets[d] + i]))]
    room = None if s.max_chars is None else s.max_chars - _text_chars(kept, pointers, docs)
    if room is not None and room < 0:  # a budget smaller than the chunk
        return segs[: s.k]
    for g in segs:
        if len(kept) == s.k:
            break
        if room is not None:
            if _text_chars([g], pointers, docs) > room:
                continue
            room -= _text_chars([g], pointers, docs)
        kept.append(g)
    if s.params.merge_touching:  # joined across the gaps between them when those fit too
        merged = merge_touching(kept)
        if s.max_chars is None or _text_chars(merged, pointers, docs) <= s.max_chars:
            kept = merged
    return by_best_chunk(kept, values, offsets)


def _text_chars(segs: Sequence[Segment], pointers: dict[str, Pointer], docs: list[str]) -> int:
    """The characters ``segs`` return: each from its first chunk's start to its last's end."""
    total = 0
    for g in segs:
        spans = pointers[docs[g.doc]].spans
        total += spans[g.end - 1][1] - spans[g.start][0]
    return total


def _strides(spans: Sequence[tuple[int, int]]) -> list[int]:
    """What each chunk adds to a segment's length: from its start to its end or the next
    chunk's start, whichever is later (so a run's strides add up to at least its text,
    however the chunks overlap or leave gaps)."""
    nexts = [b for b, _ in spans[1:]] + [0]
    return [max(e, n) - b for (b, e), n in zip(spans, nexts)]


class Chosen(NamedTuple):
    """A returned result: chunks ``[chunk_start, chunk_end)`` of ``doc_id`` and the exact
    characters ``[start_index, end_index)`` of its source it returns."""

    doc_id: str
    chunk_start: int
    chunk_end: int
    score: float
    start_index: int
    end_index: int


def fit_segments(
    s: SegmentSettings,
    cands: list[Candidate],
    pointers: dict[str, Pointer],
    texts: dict[str, str],
    selection: Selection,
) -> list[Chosen]:
    """The characters each chosen segment returns (``texts``: each chosen document's text).

    In chunks mode, each chunk's own span. In segments mode, from the chunks' spans,
    within ``max_chars`` (every character added is charged to what the picks left over):

    1. **Bridging** (``bridge_chunks``): two segments of one document at most that many
       chunks apart become one across the gap, best pair first, when the gap fits the
       room left, or fits once results ranked below both are left out.
    2. **Snapping** (``snap_chars``): a start or end inside a sentence moves out to the
       nearest sentence or line boundary when that fits, else in (within the first or
       last chunk, never into the dense search's first chunk); the line breaks of wrapped
       prose are inside sentences (:func:`_wraps`).
    3. **No fragments** (``min_result_chars``): a shorter result grows forward, then
       backward, to that length and a boundary; one that cannot is left out unless it is
       its whole document, or holds the dense search's first chunk (then the lowest
       ranked results make room for it).
    4. **Paragraph ends** (``paragraph_chars``): then, best result first, one that stops
       inside a paragraph goes on to its end when that is near and fits the room left
       (never at another result's cost).

    Results stay exact slices and never overlap; the order is the selection's (a bridged
    pair takes the better place)."""
    p = s.params
    pieces = []
    for rank, (doc_id, first, last, value) in enumerate(selection):
        spans = pointers[doc_id].spans
        pieces.append(_Piece(rank, doc_id, spans[first][0], spans[last - 1][1], value, first, last))
    if s.mode == "chunks" or not pieces:
        return [_chosen(g, pointers) for g in pieces]
    protect = _dense_first_span(s, cands, pointers)
    room = math.inf if s.max_chars is None else s.max_chars - sum(g.end - g.start for g in pieces)
    while room < 0 and pieces:  # never expected: the picks fit; drop the last unprotected
        at = next(
            (j for j in range(len(pieces) - 1, -1, -1) if not _holds(pieces[j], protect)),
            len(pieces) - 1,
        )
        room += pieces[at].end - pieces[at].start
        del pieces[at]
    if p.bridge_chunks > 0:
        room = _bridge(pieces, pointers, p.bridge_chunks, room, protect)
    order = sorted(pieces, key=lambda g: (not _holds(g, protect), g.rank))
    for g in order:
        if g not in pieces:  # left out to make room
            continue
        text = texts[g.doc_id]
        lo, hi = _room_around(pieces, g, len(text))
        keep_from, keep_to = g.end, g.start  # how far in its ends may move
        if protect is not None and _holds(g, protect):
            keep_from, keep_to = protect[1], protect[2]
        if p.snap_chars > 0:
            room = _snap(g, text, lo, hi, keep_from, keep_to, p.snap_chars, room)
        if p.min_result_chars > 0 and g.end - g.start < p.min_result_chars:
            room = _grow(
                pieces, g, text, lo, hi, p.min_result_chars, max(p.snap_chars, 1), room, protect
            )
    if p.paragraph_chars > 0:
        for g in (g for g in order if g in pieces):
            text = texts[g.doc_id]
            _, hi = _room_around(pieces, g, len(text))
            room = _to_paragraph_end(g, text, hi, p.paragraph_chars, room)
    return [_chosen(g, pointers) for g in sorted(pieces, key=lambda g: g.rank)]


@dataclass(eq=False)
class _Piece:
    """A result being fitted: ``rank`` in the selection, characters ``[start, end)``."""

    rank: int
    doc_id: str
    start: int
    end: int
    value: float
    first: int
    """The chosen chunks ``[first, last)``."""
    last: int


def _chosen(g: _Piece, pointers: dict[str, Pointer]) -> Chosen:
    """``g`` with its chunks: the chosen ones, and those its moved ends reach into."""
    spans = pointers[g.doc_id].spans
    first, last = g.first, g.last
    if g.start != spans[first][0]:
        first = min(bisect_right([e for _, e in spans], g.start), len(spans) - 1)
    if g.end != spans[last - 1][1]:
        last = max(first + 1, bisect_right([b for b, _ in spans], g.end - 1))
    return Chosen(g.doc_id, first, min(last, len(spans)), g.value, g.start, g.end)


def _dense_first_span(
    s: SegmentSettings, cands: list[Candidate], pointers: dict[str, Pointer]
) -> tuple[str, int, int] | None:
    """``(doc_id, start, end)`` of the dense search's first chunk, when the rule keeps it."""
    if not (s.params.keep_dense_first and not s.rerank and s.k > 1):
        return None
    first = next((c for c in cands if c.ranks[0] == 1), None)
    if first is None or first.doc_id not in pointers:
        return None
    start, end = pointers[first.doc_id].spans[first.chunk_index]
    return first.doc_id, start, end


def _holds(g: _Piece, span: tuple[str, int, int] | None) -> bool:
    return span is not None and g.doc_id == span[0] and g.start <= span[1] and span[2] <= g.end


def _room_around(pieces: list[_Piece], g: _Piece, n: int) -> tuple[int, int]:
    """How far ``g`` may grow: to its neighbours in its document, or the text's ends."""
    lo, hi = 0, n
    for h in pieces:
        if h is not g and h.doc_id == g.doc_id:
            if h.end <= g.start:
                lo = max(lo, h.end)
            elif h.start >= g.end:
                hi = min(hi, h.start)
    return lo, hi


def _bridge(
    pieces: list[_Piece],
    pointers: dict[str, Pointer],
    most: int,
    room: float,
    protect: tuple[str, int, int] | None,
) -> float:
    """Join neighbours of one document at most ``most`` chunks apart, best pair first, when
    the gap fits ``room`` or fits once results ranked below both (never the one holding the
    dense search's first chunk) are left out: text between two relevant passages is worth
    more than the last passage in. The room left."""
    tried: set[tuple[int, int]] = set()
    while True:
        pairs = []
        by_doc: dict[str, list[_Piece]] = {}
        for g in pieces:
            by_doc.setdefault(g.doc_id, []).append(g)
        for group in by_doc.values():
            group.sort(key=lambda g: g.start)
            starts = [b for b, _ in pointers[group[0].doc_id].spans]
            for x, y in zip(group, group[1:]):
                between = bisect_right(starts, y.start - 1) - bisect_right(starts, x.end - 1)
                if between <= most and (id(x), id(y)) not in tried:
                    pairs.append((min(x.rank, y.rank), x, y))
        if not pairs:
            return room
        _, x, y = min(pairs, key=lambda t: t[0])
        tried.add((id(x), id(y)))
        gap, worst = y.start - x.end, max(x.rank, y.rank)
        below = sorted(
            (g for g in pieces if g.rank > worst and not _holds(g, protect)),
            key=lambda g: -g.rank,
        )
        dropped: list[_Piece] = []
        while gap > room and below:
            dropped.append(below.pop(0))
            room += dropped[-1].end - dropped[-1].start
        if gap > room:  # it cannot fit: put back what was taken out
            room -= sum(g.end - g.start for g in dropped)
            continue
        for g in dropped:
            pieces.remove(g)
        room -= gap
        x.end, x.last, x.rank, x.value = y.end, y.last, min(x.rank, y.rank), x.value + y.value
        pieces.remove(y)


_INLINE_BLANKS = " \t\r\f\v"
"""Blanks inside a line."""
_TERMINALS = ".!?…。！？"
_CLOSERS = "\"'”’)]»"
_END = re.compile(r"[.!?…。！？][\"'”’)\]»]*|\n")
"""Where a sentence or line may end: after a terminal (and closing quotes), before a newline."""
_START = re.compile(r"(?:\n|[.!?…。！？][\"'”’)\]»]*\s)\s*")
"""Where a sentence or line may start: after a newline or a sentence end, past blanks."""
_PROSE_WORD = re.compile(r"[^\W\d_]+[,.;:!?]?")
"""A plain word (letters, one punctuation mark after): what lines of prose are made of."""
_WRAP_LAST = re.compile(r"[^\W\d_][,;:]?$")
_WRAP_NEXT = re.compile(r"[ \t]*(?::[a-z]+(?::[a-z]+)?:)?[`*_\"'(\[]*([^\W\d_])")
"""The next line's first letter, past inline markup that opens it (a reST role, literal
quotes, emphasis, a bracket)."""
_COMMENT = re.compile(r"\s*(?:#|//|/\*|\*|--|;|%)")
_WRAP_WORDS = 6
_WRAP_CHARS = 30
_WRAP_MAX_CHARS = 200
"""A longer line was not hard-wrapped (prose wraps at 60-100 columns)."""


def _wraps(text: str, newline: int) -> bool:
    """Whether the line break at ``newline`` falls inside a sentence: hard-wrapped prose
    (reStructuredText, Markdown, plain text at 72-80 columns) whose line ends in a word (or
    a comma, semicolon or colon after it) and whose next line goes on with a lower-case
    letter (after any inline markup: ``:data:`session```, ````g.user````). The line must
    read as prose (at least six plain words, 30 to 200 characters, not opened by a comment
    marker), so that the line ends of code, lists of names and comments followed by code
    stay ends."""
    start = text.rfind("\n", max(newline - _WRAP_MAX_CHARS - 1, 0), newline) + 1
    if start == 0 and newline > _WRAP_MAX_CHARS:
        return False
    line = text[start:newline].rstrip()
    if len(line.strip()) < _WRAP_CHARS or not _WRAP_LAST.search(line) or _COMMENT.match(line):
        return False
    nxt = _WRAP_NEXT.match(text, newline + 1)
    if nxt is None or not nxt.group(1).islower():
        return False
    return sum(bool(_PROSE_WORD.fullmatch(w)) for w in line.split()) >= _WRAP_WORDS


def _is_end(text: str, i: int) -> bool:
    """Whether a result may end at ``i``: the text's end, a line's end (only blanks before
    the newline) unless the line wraps mid-sentence (:func:`_wraps`), or a sentence's end
    (a terminal and closers, then a blank)."""
    n = len(text)
    if i >= n:
        return True
    if i <= 0:
        return False
    j = i
    while j < n and text[j] in _INLINE_BLANKS:
        j += 1
    if j == n:
        return True
    if text[j] == "\n" and not _wraps(text, j):
        return True
    if not text[i].isspace():
        return False
    j = i
    while j > 0 and text[j - 1] in _CLOSERS:
        j -= 1
    return j > 0 and text[j - 1] in _TERMINALS


def _is_start(text: str, i: int) -> bool:
    """Whether a result may start at ``i``: the text's start, a line's first non-blank
    unless the line before wraps into it mid-sentence (:func:`_wraps`), or a sentence's
    first character."""
    if i <= 0:
        return True
    j = i
    while j > 0 and text[j - 1] in _INLINE_BLANKS:
        j -= 1
    if j == 0:
        return True
    if text[j - 1] == "\n" and not _wraps(text, j - 1):
        return True
    if j == i:  # no blank before i: mid-word
        return False
    while j > 0 and text[j - 1] in _CLOSERS:
        j -= 1
    return j > 0 and text[j - 1] in _TERMINALS


def _ends(text: str, lo: int, hi: int) -> list[int]:
    """Positions in ``(lo, hi]`` where a result may end, in order."""
    found = [m.start() if m.group() == "\n" else m.end() for m in _END.finditer(text, lo, hi + 1)]
    if hi >= len(text):
        found.append(len(text))
    return [i for i in found if lo < i <= hi and _is_end(text, i)]


def _starts(text: str, lo: int, hi: int) -> list[int]:
    """Positions in ``[lo, hi)`` where a result may start, in order."""
    found = [0] if lo <= 0 else []
    found += [m.end() for m in _START.finditer(text, max(lo - 2, 0), hi)]
    return [
        i
        for i in found
        if lo <= i < hi and i < len(text) and not text[i].isspace() and _is_start(text, i)
    ]


_BLANKS = re.compile(r"\s*")


def _whole(text: str, start: int, end: int) -> bool:
    """Whether ``text[start:end]`` is the whole text but for blanks around it."""
    lead, trail = _BLANKS.match(text), _BLANKS.match(text, end)
    return bool(lead and trail and lead.end() >= start and trail.end() == len(text))


def _word_end(text: str, i: int, hi: int) -> int:
    """The end of the word at ``i`` (at most ``hi``): a result grown to a length stops
    between words when no sentence or line ends near."""
    while i < hi and not text[i].isspace() and not text[i - 1].isspace():
        i += 1
    return i


def _snap(
    g: _Piece, text: str, lo: int, hi: int, keep_from: int, keep_to: int, reach: int, room: float
) -> float:
    """Move ``g``'s ends to boundaries: out within ``reach`` when it fits ``room``, else in
    (never past ``keep_to`` for the end or ``keep_from`` for the start); the room left."""
    if not _is_end(text, g.end):
        out = _ends(text, g.end, min(hi, g.end + reach))
        back = _ends(text, max(g.start, keep_to, g.end - reach), g.end - 1)
        if out and out[0] - g.end <= room:
            room -= out[0] - g.end
            g.end = out[0]
        elif back and back[-1] > g.start:
            room += g.end - back[-1]
            g.end = back[-1]
    if not _is_start(text, g.start):
        out = _starts(text, max(lo, g.start - reach), g.start)
        fwd = _starts(text, g.start + 1, min(keep_from, g.start + reach, g.end - 1) + 1)
        if out and g.start - out[-1] <= room:
            room -= g.start - out[-1]
            g.start = out[-1]
        elif fwd and fwd[0] < g.end:
            room += fwd[0] - g.start
            g.start = fwd[0]
    return room


def _grow(
    pieces: list[_Piece],
    g: _Piece,
    text: str,
    lo: int,
    hi: int,
    least: int,
    reach: int,
    room: float,
    protect: tuple[str, int, int] | None,
) -> float:
    """Grow ``g`` to ``least`` characters and a boundary (forward, then backward), or leave it
    out; the room left (see :func:`fit_segments`)."""
    if _whole(text, g.start, g.end):
        return room
    end = g.end
    if end - g.start < least:
        want = min(g.start + least, hi)
        end = next(iter(_ends(text, want - 1, min(hi, want + reach))), _word_end(text, want, hi))
    start = g.start
    if end - start < least:
        want = max(end - least, lo)
        start = next(iter(_starts(text, max(lo, want - reach), want + 1)[::-1]), want)
    cost = (end - start) - (g.end - g.start)
    if end - start < least and not _whole(text, start, end):
        if _holds(g, protect):  # as long as it can be; it stays
            cost = 0
            start, end = g.start, g.end
        else:
            pieces.remove(g)
            return room + (g.end - g.start)
    held = _holds(g, protect)
    while cost > room and held:  # the lowest ranked others make room
        others = [h for h in pieces if h is not g]
        if not others:
            break
        last = max(others, key=lambda h: h.rank)
        room += last.end - last.start
        pieces.remove(last)
    if cost > room:
        if held:
            return room
        pieces.remove(g)
        return room + (g.end - g.start)
    g.start, g.end = start, end
    return room - cost


_BLANK_RUN = f"[{_INLINE_BLANKS}]*"
_BLANK_LINE = re.compile(_BLANK_RUN + r"\n")
"""The rest of a line that is empty (but for blanks)."""
_BLANK_TO_END = re.compile(r"\s*\Z")
_PARAGRAPH_END = re.compile(_BLANK_RUN + r"\n" + _BLANK_RUN + r"\n|\s*\Z")
"""What follows a paragraph's end: blanks up to an empty line, or to the text's end."""


def _paragraph_end_after(text: str, start: int, limit: int) -> int | None:
    """The first paragraph end in ``(start, limit]`` (``start`` not being one): the last
    non-blank before an empty line, or before the text's end."""
    j = text.find("\n", start)
    while j != -1:
        i = j
        while i > start and text[i - 1] in _INLINE_BLANKS:
            i -= 1
        if i > limit:
            break
        if _BLANK_LINE.match(text, j + 1):
            return i
        j = text.find("\n", j + 1)
    if _BLANK_TO_END.match(text, limit):  # the text's last non-blank
        i = limit
        while i > start and text[i - 1].isspace():
            i -= 1
        return i
    return None


def _to_paragraph_end(g: _Piece, text: str, hi: int, reach: int, room: float) -> float:
    """Carry ``g``'s end on to its paragraph's end when that is at most ``reach`` further,
    not past ``hi``, and fits ``room``; the room left."""
    if _PARAGRAPH_END.match(text, g.end):
        return room
    end = _paragraph_end_after(text, g.end, min(hi, g.end + reach))
    if end is not None and end - g.end <= room:
        room -= end - g.end
        g.end = end
    return room


def segment_documents(
    s: SegmentSettings,
    cands: list[Candidate],
    pointers: dict[str, Pointer],
    bodies: dict[str, Body],
    chosen: list[Chosen],
    fallback: bool,
) -> list[Document]:
    """The returned ``Document``\\ s: exact slices of the source, with their metadata."""
    keyed = s.mode == "chunks" or len(s.queries) > 1  # chunk metadata, or query ranks
    by_key = {(c.doc_id, c.chunk_index): c for c in cands} if keyed else {}
    out = []
    for doc_id, start, end, score, first, last in chosen:
        pointer, body = pointers[doc_id], bodies[doc_id]
        md: dict[str, object] = dict(pointer.metadata)
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
            md["page_start"], md["page_end"] = page_range(cast("list[int]", offsets), first, last)
        if s.mode == "chunks":
            c = by_key[(doc_id, start)]
            md.update(
                chunk_index=start,
                fused_score=c.fused_score,
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
    s: SegmentSettings, by_key: dict[tuple[str, int], Candidate], doc_id: str, start: int, end: int
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
