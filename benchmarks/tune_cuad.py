"""Parameter sweeps for RSE on the CUAD dev split, fast.

``bench_cuad.py`` runs the real retriever; a sweep over hundreds of configurations
would re-run the same dense and BM25 searches each time. Here both searches run once
per query (over the same chunks and vectors the retriever indexed), and each
configuration replays the retriever's query path with the library's own pure functions
(``fuse``, ``rank_relevance``, ``chunk_values``, ``best_segments``). ``--verify``
checks that the replay returns exactly what ``RSERetriever.invoke`` returns.

Prototypes of ideas the library does not have yet are marked ``proto`` in the output:

* ``dense_scores``: give fusion the dense cosine scores. ``InMemoryVectorStore`` does not
  implement relevance scores, so the retriever passes ``None`` and the score-based
  fusions fall back to ``1/rank`` for the dense branch.
* ``route``: restrict retrieval to the top document(s) before RSE. ``"mass"``: the
  documents with the most fused relevance among the candidates; ``"title"``: a
  document-level search (BM25 + dense, fused) over each document's opening text
  (its title, parties and date for a contract). Each branch is then searched again
  within the chosen documents (``refetch``).
* ``relevance="score"``: relevance from the fused score (``score / best score``) instead
  of the rank.

Usage::

    python benchmarks/tune_cuad.py --chunk-size 600 --enricher none --grid all
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import re
import time
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

import numpy as np
from common import (
    CACHE_DIR,
    CachedEmbeddings,
    Span,
    base_embeddings,
    cut_at_budget,
    fmt_table,
    log,
    recall_precision,
)
from cuad_data import (
    DEFAULT_CONTRACTS,
    DEFAULT_SEED,
    CuadSubset,
    build_retriever,
    halves,
    lead_title,
    load_cuad,
    make_enricher,
)
from langchain_core.embeddings import FakeEmbeddings
from langchain_core.vectorstores import InMemoryVectorStore
from langchain_core.vectorstores.utils import _cosine_similarity

from langchain_rse import RSERetriever
from langchain_rse.chunking import DEFAULT_CHUNK_SIZE, chunk_key
from langchain_rse.fusion import fuse
from langchain_rse.lexical import BM25Index
from langchain_rse.rerank import EmbeddingReranker
from langchain_rse.routing import DEFAULT_BOOST
from langchain_rse.segments import (
    RSEParams,
    Segment,
    best_segments,
    chunk_values,
    get_preset,
    merge_touching,
)

BUDGETS = (1000, 2000, 4000, 8000)
BASE_PARAMS = RSEParams(4, 12, 0.2, 0.3, 10.0, merge_touching=False)
"""The library's "default" preset when these sweeps ran (pinned: the preset may change)."""
TUNED_PARAMS = (
    RSEParams(2, 12, 0.3, 0.3, 10.0, merge_touching=False),  # best with 600-character chunks
    RSEParams(4, 24, 0.3, 0.1, 10.0, merge_touching=False),  # best with 300-character chunks
)
"""The winners of the sweeps (with dense-only fusion and title routing)."""
COS_RANGES = ((0.82, 0.90), (0.84, 0.90), (0.86, 0.92))
"""Cosine -> relevance calibrations tried (e5-small cosines: chunk median ~0.80,
top-1 ~0.90, gold chunks ~0.86 on CUAD)."""
FETCH_KS = (10, 20, 50, 100, 200, 400)
"""The fetch_k values a sweep may use."""
ROUTED: dict[str, Any] = {"route": "soft", "doc_source": "bm25", "route_check": 10,
                          "fetch_k": 200, "weights": (4.0, 1.0), "doc_boost": 2.0,
                          "doc_margin": 0.25}  # fmt: skip
"""The library's routing and fusion in :class:`Config` terms: lead routing (BM25 over the
leads, a soft boost of 2, the margin and agreement checks), fusion 4:1 (the library's
default until session 10, now 2:1) fetching 200 per branch."""
LIBRARY: dict[str, Any] = {**ROUTED, "order": "best"}
"""The library's default query path: :data:`ROUTED`, segments in the order of their best
chunk (with ``off_route_floor=3``: the bar)."""


@dataclass(frozen=True)
class Config:
    """One point of the sweep; defaults are the library defaults."""

    mode: Literal["segments", "chunks", "dense", "bm25"] = "segments"
    params: RSEParams = field(default_factory=lambda: BASE_PARAMS)
    fusion: Literal["rrf", "relative_score", "dist_based"] = "rrf"
    weights: tuple[float, float] = (1.0, 1.0)
    rrf_k: float = 60.0
    fetch_k: int = 50
    candidate_pool: int = 50
    dense_scores: bool = False  # proto
    route: Literal["none", "mass", "title", "title_filter", "soft"] = "none"  # proto
    doc_boost: float = 1.0
    """``route="soft"``: fused scores of the top document's chunks are multiplied by
    ``1 + doc_boost`` (no filter); ``inf`` is the hard filter."""
    doc_margin: float = 0.0
    """Route only when the top lead's BM25 score is at least ``1 + doc_margin`` times the
    second's (``doc_source="bm25"``)."""
    doc_source: Literal["fused", "bm25", "dense"] = "fused"
    """The document ranking: lead BM25 + lead dense fused, or one of them."""
    route_docs: int = 1  # proto
    route_check: int | None = None  # title_filter: keep the route only if the unrouted top
    # route_check candidates hold a chunk of it (the library's route_check_k)
    relevance: Literal["rank", "score", "cosine", "cosine_rank", "gap"] = "rank"  # proto
    """``"gap"``: rank relevance times where the chunk's cosine sits between the last
    fetched dense hit's (0) and the best (1); chunks dense did not fetch get 0."""
    gap_power: float = 1.0
    cos_lo: float = 0.78  # proto: cosine mapped to relevance 0 ...
    cos_hi: float = 0.90  # ... and to relevance 1
    order: Literal["value", "density", "best"] = "value"  # proto: segments by value, value
    # per chunk, or the value of their best chunk
    rerank: Literal["none", "embedding"] = "none"
    """``"embedding"``: the library's ``EmbeddingReranker`` (cosine of the indexed vectors)."""
    calibration: Literal["sigmoid", "minmax", "identity"] = "minmax"
    sig_center: float = 0.84
    sig_temp: float = 0.02
    rank_decay: float | None = 20.0
    """``calibration`` .. ``rank_decay``: the reranker's (defaults: ``EmbeddingReranker``'s)."""
    pack: bool = False  # proto
    rel_floor: float = 0.0  # proto
    """Drop segments worth less than ``rel_floor`` times the best segment (a per-query stop)."""
    route_only: bool | Literal["cands"] = False  # proto
    off_route_floor: float = 1.0  # proto
    focus: Literal["none", "global", "within", "lexical_within"] = "none"  # proto
    """``route="soft"``: when the route holds, the query's clauses other than the one that
    names a document (:func:`focus_text`) rank the routed document's chunks too, as two more
    fused branches: ``"global"`` keeps their hits in the global top ``fetch_k`` that fall in
    the routed document, ``"within"`` searches inside it (the library's ``focus``),
    ``"lexical_within"`` searches dense globally and BM25 inside."""
    focus_weights: tuple[float, float] = (4.0, 1.0)
    """``route="soft"``: when the route holds, a segment of another document must be worth
    ``off_route_floor`` times ``min_segment_value``."""
    """``route="soft"``: when the route holds, drop segments of other documents."""
    """Fit each budget (:func:`pack`: best segments that fit, then the next-best
    chunks) instead of cutting one best-first list at each budget."""
    name: str = ""
    """Shown instead of the RSE parameters (e.g. a preset name)."""

    def label(self) -> str:
        base = Config()
        parts = [self.mode]
        for key, value in asdict(self).items():
            if key in ("mode", "params", "name") or value == getattr(base, key):
                continue
            parts.append(f"{key}={value}")
        if self.name:
            parts.append(self.name)
        elif self.mode == "segments":
            p = self.params
            parts.append(
                f"seg={p.max_segment_chunks} tot={p.max_total_chunks} "
                f"min={p.min_segment_value:g} pen={p.irrelevant_chunk_penalty:g} "
                f"decay={p.decay_rate:g}" + (" merge" if p.merge_touching else "")
            )
        return " ".join(parts)

    @property
    def is_proto(self) -> bool:
        return (
            self.dense_scores
            or self.route != "none"
            or self.relevance != "rank"
            or self.order != "value"
            or self.pack
            or self.rel_floor > 0
            or self.route_only
            or self.off_route_floor != 1.0
            or self.focus != "none"
        )


@dataclass
class Corpus:
    """The indexed chunks, flattened: row ``i`` is chunk ``idx[i]`` of document ``doc[i]``."""

    keys: list[str]
    doc: np.ndarray
    idx: np.ndarray
    start: np.ndarray
    end: np.ndarray
    vectors: np.ndarray
    doc_names: list[str]
    doc_rows: list[np.ndarray]  # rows of each document, in chunk order
    bm25: BM25Index
    row_of: dict[str, int]


def _unit(x: np.ndarray) -> np.ndarray:
    """Rows scaled to unit length (cosine = dot product, as in InMemoryVectorStore)."""
    norms = np.linalg.norm(x, axis=-1, keepdims=True)
    return x / np.where(norms == 0, 1, norms)


def _in_chunk_order(rows: np.ndarray, recs: list[dict[str, Any]]) -> np.ndarray:
    return rows[np.argsort([recs[i]["metadata"]["chunk_index"] for i in rows])]


def corpus_of(retriever: RSERetriever) -> Corpus:
    vs = retriever.vectorstore
    assert isinstance(vs, InMemoryVectorStore)
    recs = list(vs.store.values())
    names = sorted({r["metadata"]["doc_id"] for r in recs})
    pos = {n: i for i, n in enumerate(names)}
    # Rows stay in the store's order, so that exact ties order as the store orders them.
    keys = [
        chunk_key(
            r["metadata"]["doc_id"], r["metadata"]["doc_version"], r["metadata"]["chunk_index"]
        )
        for r in recs
    ]
    doc = np.array([pos[r["metadata"]["doc_id"]] for r in recs])
    bm25 = BM25Index()
    bm25.add(keys, [r["text"] for r in recs])
    return Corpus(
        keys=keys,
        doc=doc,
        idx=np.array([r["metadata"]["chunk_index"] for r in recs]),
        start=np.array([r["metadata"]["start_index"] for r in recs]),
        end=np.array([r["metadata"]["end_index"] for r in recs]),
        vectors=np.asarray([r["vector"] for r in recs]),
        doc_names=names,
        doc_rows=[_in_chunk_order(np.flatnonzero(doc == d), recs) for d in range(len(names))],
        bm25=bm25,
        row_of={k: i for i, k in enumerate(keys)},
    )


@dataclass
class Branches:
    """Per query: dense cosines over all rows, and BM25 hits (row, score), best first."""

    cosine: np.ndarray
    dense_order: np.ndarray  # all rows, best first, as the store orders them
    lexical: list[tuple[int, float]]  # all hits
    lexical_at: dict[int, list[tuple[int, float]]]
    """``BM25Index.search(query, k)`` per fetch_k (ties at the cut depend on k)."""
    doc_rank: list[int]  # document-level ranking from the title search (proto)
    doc_ranks: dict[str, list[int]] = field(default_factory=dict)  # by doc_source
    lead_scores: list[float] = field(default_factory=list)  # BM25 lead scores, best first
    focus_cosine: np.ndarray | None = None  # the focus text's cosines over all rows
    focus_lexical: list[tuple[int, float]] = field(default_factory=list)  # its BM25 hits


_CLAUSE = re.compile(r";\s*|(?<=[.?!])\s+(?=[A-Z])|\n+")


def focus_text(query: str, leads: BM25Index) -> str | None:
    """The query without the clause that names a document: split at semicolons, sentence
    ends and line breaks, drop the clause whose best lead scores highest; None when the
    query is one clause."""
    parts = [p.strip() for p in _CLAUSE.split(query) if p and p.strip()]
    if len(parts) < 2:
        return None
    best = [max((s for _, s in leads.search(p, 1)), default=0.0) for p in parts]
    naming = int(np.argmax(best))
    return " ".join(p for i, p in enumerate(parts) if i != naming)


def precompute(data: CuadSubset, corpus: Corpus, embeddings: CachedEmbeddings) -> list[Branches]:
    qv = embeddings.embed_array([q.text for q in data.queries], "query")
    # The store's own similarity function, query by query, so ties order as in the store.
    cos = [_cosine_similarity([v.tolist()], corpus.vectors)[0] for v in qv]
    # Document-level search over each document's opening text (proto "title" routing).
    leads = [lead_title(data.contracts[n]) for n in corpus.doc_names]
    lead_vecs = _unit(embeddings.embed_array(leads, "passage"))
    lead_bm25 = BM25Index()
    lead_bm25.add([str(i) for i in range(len(leads))], leads)
    focus = [focus_text(q.text, lead_bm25) for q in data.queries]
    fv = embeddings.embed_array([f for f in focus if f], "query")
    fcos = iter([_cosine_similarity([v.tolist()], corpus.vectors)[0] for v in fv])
    out = []
    lead_cos = _unit(qv) @ lead_vecs.T
    for q, c, lc in zip(data.queries, cos, lead_cos):
        hits = corpus.bm25.search(q.text, len(corpus.keys))
        dense_docs = np.argsort(-lc, kind="stable")
        lex_docs = lead_bm25.search(q.text, len(leads))
        fused = fuse(
            [[(str(int(d)), None) for d in dense_docs], [(i, s) for i, s in lex_docs]],
            [1.0, 1.0],
        )
        at = {
            n: [(corpus.row_of[k], s) for k, s in corpus.bm25.search(q.text, n)] for n in FETCH_KS
        }
        doc_ranks = {
            "fused": [int(h.id) for h in fused],
            "dense": [int(d) for d in dense_docs],
            "bm25": [int(i) for i, _ in lex_docs],
        }
        out.append(
            Branches(
                c,
                c.argsort()[::-1],
                [(corpus.row_of[k], s) for k, s in hits],
                at,
                doc_ranks["fused"],
                doc_ranks,
                [float(sc) for _, sc in lex_docs],
            )
        )
    for br, f in zip(out, focus):
        if f:
            br.focus_cosine = next(fcos)
            br.focus_lexical = [(corpus.row_of[k], s) for k, s in corpus.bm25.search(f, 10**9)]
    return out


def _reranker(cfg: Config) -> EmbeddingReranker:
    """The library's reranker with ``cfg``'s calibration (its model is never called here: the
    cosines it would compute are those of the indexed vectors, replayed from ``Branches``)."""
    return EmbeddingReranker(
        embeddings=FakeEmbeddings(size=2),
        calibration=cfg.calibration,
        sigmoid_center=cfg.sig_center,
        sigmoid_temperature=cfg.sig_temp,
        rank_decay=cfg.rank_decay,
    )


def _dense_list(br: Branches, rows: np.ndarray | None, n: int) -> list[tuple[int, float]]:
    """Best-first (row, cosine), ordered as ``InMemoryVectorStore`` orders (ties reversed)."""
    cos = br.cosine
    top = br.dense_order[:n] if rows is None else rows[cos[rows].argsort()[::-1]][:n]
    return [(int(i), float(cos[i])) for i in top]


def run_query(
    cfg: Config, corpus: Corpus, br: Branches, max_chars: int | None = None
) -> list[Span]:
    """Best-first ranges for one query under ``cfg`` (the retriever's query path), fitted
    to ``max_chars`` when given."""
    names = corpus.doc_names
    n_chunks = 2 * math.ceil(max(BUDGETS) / 300) + 4
    allowed: np.ndarray | None = None
    if cfg.route in ("title", "title_filter"):
        allowed = np.concatenate([corpus.doc_rows[d] for d in br.doc_rank[: cfg.route_docs]])
    if cfg.route == "title_filter" and cfg.route_check is not None:
        unrouted = fuse(
            [
                [(str(r), None) for r, _ in _dense_list(br, None, cfg.fetch_k)],
                [(str(r), s) for r, s in br.lexical[: cfg.fetch_k]],
            ],
            cfg.weights,
            cfg.fusion,
            cfg.rrf_k,
        )
        near = {int(corpus.doc[int(h.id)]) for h in unrouted[: cfg.route_check]}
        chosen = [d for d in br.doc_rank[: cfg.route_docs] if d in near]
        if not chosen:  # the search disagrees with the router: no filter
            return run_query(replace(cfg, route="none"), corpus, br, max_chars)
        allowed = np.concatenate([corpus.doc_rows[d] for d in chosen])
    if cfg.route == "title_filter":
        # No search inside the chosen documents: keep the global top fetch_k of each branch
        # that fall in them (what a vector store without metadata filters allows).
        keep_f = set(allowed.tolist())
        dense_f = [x for x in _dense_list(br, None, cfg.fetch_k) if x[0] in keep_f]
        lexical_f = [x for x in br.lexical[: cfg.fetch_k] if x[0] in keep_f]
        allowed = None
    rows: list[int] = []
    if cfg.mode == "dense" and cfg.route == "title_filter":
        rows = [r for r, _ in dense_f][:n_chunks]
    elif cfg.mode == "dense":
        rows = [r for r, _ in _dense_list(br, allowed, n_chunks)]
    elif cfg.mode == "bm25":
        keep = None if allowed is None else set(allowed.tolist())
        rows = [r for r, _ in br.lexical if keep is None or r in keep][:n_chunks]
    if cfg.mode in ("dense", "bm25"):
        return [(names[corpus.doc[r]], int(corpus.start[r]), int(corpus.end[r])) for r in rows]

    dense = _dense_list(br, allowed, cfg.fetch_k)
    if cfg.route == "title_filter":
        dense, lexical = dense_f, lexical_f
    elif allowed is not None:
        keep = set(allowed.tolist())
        lexical = [(r, s) for r, s in br.lexical if r in keep][: cfg.fetch_k]
    else:
        lexical = br.lexical_at[cfg.fetch_k]
    fused = fuse(
        [
            [(str(r), s if cfg.dense_scores else None) for r, s in dense],
            [(str(r), s) for r, s in lexical],
        ],
        cfg.weights,
        cfg.fusion,
        cfg.rrf_k,
    )
    chosen_docs: set[int] | None = None
    if cfg.route == "soft":
        chosen_docs = _route_choice(cfg, corpus, br, fused)
        if cfg.focus != "none" and chosen_docs and br.focus_cosine is not None:
            fused = _focused(cfg, corpus, br, chosen_docs, dense, lexical)
        fused = _soft_route(cfg, corpus, br, fused)
    fused = fused[: cfg.candidate_pool]
    cands = [int(h.id) for h in fused]
    if not cands:
        return []
    p = cfg.params
    rank_rel = np.exp(-np.arange(len(cands), dtype=np.float64) / p.decay_rate)
    if cfg.rerank == "embedding":
        # EmbeddingReranker.rerank (best cosine first, stable; then its calibration), then
        # the retriever's stable sort by relevance.
        cos_c = br.cosine[cands]
        order = sorted(range(len(cands)), key=lambda i: -cos_c[i])
        relevance = _reranker(cfg).relevance([float(cos_c[i]) for i in order])
        resort = sorted(range(len(order)), key=lambda i: -relevance[i])
        cands = [cands[order[i]] for i in resort]
        rel = np.array([relevance[i] for i in resort])
    elif cfg.relevance == "score":
        top = fused[0].score or 1.0
        rel = np.array([h.score / top for h in fused])
    elif cfg.relevance == "gap":
        fetched = dict(dense)
        lo, hi = dense[-1][1], dense[0][1]
        cos = np.array([fetched.get(r, lo) for r in cands])
        rel = rank_rel * np.clip((cos - lo) / max(hi - lo, 1e-9), 0.0, 1.0) ** cfg.gap_power
    elif cfg.relevance in ("cosine", "cosine_rank"):
        cos = (br.cosine[cands] - cfg.cos_lo) / (cfg.cos_hi - cfg.cos_lo)
        rel = np.clip(cos, 0.0, 1.0) * (rank_rel if cfg.relevance == "cosine_rank" else 1.0)
    else:
        rel = rank_rel
    if cfg.route == "mass":
        mass: dict[int, float] = {}
        for r, v in zip(cands, rel):
            mass[int(corpus.doc[r])] = mass.get(int(corpus.doc[r]), 0.0) + float(v)
        chosen = set(sorted(mass, key=lambda d: -mass[d])[: cfg.route_docs])
        keep_idx = [i for i, r in enumerate(cands) if corpus.doc[r] in chosen]
        cands, rel = [cands[i] for i in keep_idx], rel[keep_idx]
    if (cfg.route_only == "cands" or cfg.mode == "chunks") and cfg.route_only and chosen_docs:
        keep_idx = [i for i, r in enumerate(cands) if corpus.doc[r] in chosen_docs]
        if keep_idx:
            cands, rel = [cands[i] for i in keep_idx], rel[keep_idx]
    if cfg.mode == "chunks" and max_chars is None:
        if False:
            keep_idx = [i for i, r in enumerate(cands) if corpus.doc[r] in chosen_docs]
            if keep_idx:
                cands, rel = [cands[i] for i in keep_idx], rel[keep_idx]
        order = np.argsort(-rel, kind="stable")
        return [
            (names[corpus.doc[cands[i]]], int(corpus.start[cands[i]]), int(corpus.end[cands[i]]))
            for i in order[:n_chunks]
        ]
    docs = list(dict.fromkeys(int(corpus.doc[r]) for r in cands))
    position = {d: i for i, d in enumerate(docs)}
    values, offsets = chunk_values(
        [len(corpus.doc_rows[d]) for d in docs],
        ((position[int(corpus.doc[r])], int(corpus.idx[r]), float(v)) for r, v in zip(cands, rel)),
        p.irrelevant_chunk_penalty,
    )
    segs = []
    if cfg.mode == "segments":
        segs = best_segments(
            values, offsets, p.max_segment_chunks, p.max_total_chunks, p.min_segment_value
        )
    if max_chars is not None:
        rows_all = np.concatenate([corpus.doc_rows[d] for d in docs])
        sizes = corpus.end[rows_all] - corpus.start[rows_all]
        order = np.argsort(-rel, kind="stable")
        fill = [(position[int(corpus.doc[cands[i]])], int(corpus.idx[cands[i]]),
                 float(rel[i]) - p.irrelevant_chunk_penalty) for i in order]  # fmt: skip
        segs = pack(segs, fill, sizes, offsets, max_chars,
                    p.merge_touching and cfg.mode == "segments")  # fmt: skip
    elif p.merge_touching:
        segs = merge_touching(segs)
    if cfg.rel_floor > 0 and segs:
        top_value = max(g.value for g in segs)
        segs = [g for g in segs if g.value >= cfg.rel_floor * top_value]
    if cfg.off_route_floor != 1.0 and chosen_docs:
        floor = cfg.off_route_floor * p.min_segment_value
        segs = [g for g in segs if docs[g.doc] in chosen_docs or g.value >= floor]
    if cfg.route_only is True and chosen_docs:
        segs = [g for g in segs if docs[g.doc] in chosen_docs] or segs
    if cfg.order == "density":
        segs = sorted(segs, key=lambda s: -s.value / (s.end - s.start))
    elif cfg.order == "best":
        segs = sorted(
            segs, key=lambda g: -values[offsets[g.doc] + g.start : offsets[g.doc] + g.end].max()
        )
    out: list[Span] = []
    for s in segs:
        rows_of_doc = corpus.doc_rows[docs[s.doc]]
        out.append(
            (
                names[docs[s.doc]],
                int(corpus.start[rows_of_doc[s.start]]),
                int(corpus.end[rows_of_doc[s.end - 1]]),
            )
        )
    return out


def pack(  # proto
    segments: Sequence[Segment],
    fill: Iterable[tuple[int, int, float]],
    sizes: np.ndarray,
    offsets: np.ndarray,
    max_chars: int,
    merge: bool = True,
) -> list[Segment]:
    """Fit a budget of ``max_chars`` characters, without cutting a chunk.

    ``segments`` are taken best first while they fit (one that does not is skipped);
    the room they leave is filled with the chunks of ``fill`` — ``(doc, chunk_index,
    value)``, best first — that no kept segment covers, each while it fits. ``sizes`` are
    the chunks' lengths in characters, flattened as in :func:`chunk_values`. With
    ``merge``, touching runs are joined (``merge_touching``).
    """
    kept: list[Segment] = []
    covered: set[tuple[int, int]] = set()
    room = int(max_chars)

    def take(doc: int, start: int, end: int, value: float) -> None:
        nonlocal room
        size = int(sizes[offsets[doc] + start : offsets[doc] + end].sum())
        if size <= room and not any((doc, i) in covered for i in range(start, end)):
            kept.append(Segment(doc, start, end, value))
            covered.update((doc, i) for i in range(start, end))
            room -= size

    for g in segments:
        take(*g)
    for doc, idx, value in fill:
        take(doc, idx, idx + 1, value)
    return merge_touching(kept) if merge else kept


def _route_choice(cfg: Config, corpus: Corpus, br: Branches, fused: list[Any]) -> set[int] | None:
    """The document(s) soft routing boosts, or None when the route does not hold."""
    ranking = br.doc_ranks.get(cfg.doc_source, br.doc_rank)
    top = ranking[: cfg.route_docs]
    sc = br.lead_scores
    if cfg.doc_margin and (not sc or (len(sc) > 1 and sc[0] < (1 + cfg.doc_margin) * sc[1])):
        return None
    if cfg.route_check is not None:
        near = {int(corpus.doc[int(h.id)]) for h in fused[: cfg.route_check]}
        top = [d for d in top if d in near]
    return set(top) or None


def _focused(
    cfg: Config,
    corpus: Corpus,
    br: Branches,
    docs: set[int],
    dense: list[tuple[int, float]],
    lexical: list[tuple[int, float]],
) -> list[Any]:
    """The fusion with the focus text's branches over the routed documents' chunks."""
    assert br.focus_cosine is not None
    cos = br.focus_cosine
    if cfg.focus == "within":
        rows = np.concatenate([corpus.doc_rows[d] for d in sorted(docs)])
        fd = [int(r) for r in rows[cos[rows].argsort(kind="stable")[::-1]]][: cfg.fetch_k]
    else:
        top = np.argsort(-cos, kind="stable")[: cfg.fetch_k]
        fd = [int(r) for r in top if int(corpus.doc[r]) in docs]
    if cfg.focus == "global":
        fl = [r for r, _ in br.focus_lexical[: cfg.fetch_k] if int(corpus.doc[r]) in docs]
    else:
        fl = [r for r, _ in br.focus_lexical if int(corpus.doc[r]) in docs][: cfg.fetch_k]
    return fuse(
        [
            [(str(r), None) for r, _ in dense],
            [(str(r), s) for r, s in lexical],
            [(str(r), None) for r in fd],
            [(str(r), None) for r in fl],
        ],
        [*cfg.weights, *cfg.focus_weights],
        cfg.fusion,
        cfg.rrf_k,
    )


def _soft_route(cfg: Config, corpus: Corpus, br: Branches, fused: list[Any]) -> list[Any]:
    """Boost the chunks of the top-ranked document(s) (if the unrouted ranking agrees)."""
    chosen = _route_choice(cfg, corpus, br, fused)
    if chosen is None:
        return fused
    boost = 1.0 + cfg.doc_boost
    scored = [
        (h.score * boost if int(corpus.doc[int(h.id)]) in chosen else h.score, i, h)
        for i, h in enumerate(fused)
    ]
    if math.isinf(boost):
        scored = [x for x in scored if int(corpus.doc[int(x[2].id)]) in chosen]
        scored = [(h.score, i, h) for _, i, h in scored]
    scored.sort(key=lambda x: (-x[0], x[1]))
    return [h._replace(score=sc) for sc, _, h in scored]


def score(
    cfg: Config, data: CuadSubset, corpus: Corpus, branches: Sequence[Branches]
) -> dict[str, Any]:
    """Mean recall / precision / returned characters per budget."""
    sums = {b: np.zeros(3) for b in BUDGETS}
    per_query_recall4k = []
    wrong = 0.0
    for q, br in zip(data.queries, branches):
        ranked = run_query(cfg, corpus, br)
        for b in BUDGETS:
            if cfg.pack:
                ranked = run_query(cfg, corpus, br, b)
            cut = cut_at_budget(ranked, b)
            r, p = recall_precision(q.gold, cut)
            chars = sum(e - s for _, s, e in cut)
            sums[b] += (r, p, chars)
            if b == 4000:
                per_query_recall4k.append(r)
                gold_files = {f for f, _, _ in q.gold}
                off = sum(e - s for f, s, e in cut if f not in gold_files)
                wrong += off / chars if chars else 0.0
    n = len(data.queries)
    return {
        "label": cfg.label(),
        "proto": cfg.is_proto,
        **{f"R{b // 1000}k": sums[b][0] / n for b in BUDGETS},
        **{f"P{b // 1000}k": sums[b][1] / n for b in BUDGETS},
        **{f"C{b // 1000}k": sums[b][2] / n for b in BUDGETS},
        "recall4k": per_query_recall4k,
        "wrong_doc4k": wrong / n,
    }


# --------------------------------------------------------------------------------------
# Grids
# --------------------------------------------------------------------------------------


def _p(base: RSEParams, **kw: float | int) -> RSEParams:
    return base.with_overrides(**kw)


def grid(name: str) -> Iterable[Config]:
    d = Config()
    dp = d.params
    if name in ("baselines", "all"):
        yield Config(mode="dense")
        yield Config(mode="bm25")
        yield Config(mode="chunks")
    if name in ("presets", "all"):
        for preset in ("balanced", "precision", "find_all"):
            yield Config(params=get_preset(preset), name=f"preset={preset}")
    if name in ("decay", "all"):
        for decay in (1, 2, 3, 5, 7, 10, 15, 20, 30, 50):
            yield Config(params=_p(dp, decay_rate=decay))
    if name in ("penalty", "all"):
        for decay in (3, 5, 10):
            for pen in (0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4):
                yield Config(params=_p(dp, decay_rate=decay, irrelevant_chunk_penalty=pen))
    if name in ("lengths", "all"):
        for decay in (5, 10):
            for seg in (1, 2, 3, 4, 6, 8, 15):
                for total in (6, 12, 30):
                    yield Config(
                        params=_p(
                            dp, decay_rate=decay, max_segment_chunks=seg, max_total_chunks=total
                        )
                    )
    if name in ("minvalue", "all"):
        for decay in (5, 10):
            for mv in (0.0, 0.2, 0.4, 0.6, 0.8, 1.0):
                yield Config(params=_p(dp, decay_rate=decay, min_segment_value=mv))
    if name in ("fusion", "all"):
        for fusion in ("rrf", "relative_score", "dist_based"):
            for weights in ((1.0, 1.0), (1.0, 0.5), (1.0, 2.0), (1.0, 0.0), (0.0, 1.0)):
                for dense_scores in (False, True):
                    if fusion == "rrf" and dense_scores:
                        continue
                    for mode in ("chunks", "segments"):
                        yield Config(
                            mode=mode, fusion=fusion, weights=weights, dense_scores=dense_scores
                        )
    if name in ("pool", "all"):
        for fetch_k in (10, 20, 50, 100, 200):
            for pool in (10, 20, 50, 100):
                if pool <= 2 * fetch_k:
                    yield Config(fetch_k=fetch_k, candidate_pool=pool)
    if name in ("route", "all"):
        for docs in (1, 2, 3):
            for mode in ("dense", "bm25", "chunks", "segments"):
                yield Config(mode=mode, route="title", route_docs=docs)
            for mode in ("chunks", "segments"):
                yield Config(mode=mode, route="mass", route_docs=docs)
    if name == "proto":
        for route in ("none", "title"):
            rels: list[dict[str, Any]] = [
                *({"params": {"decay_rate": d}} for d in (5, 10, 20)),
                *({"relevance": "cosine", "cos_lo": lo, "cos_hi": hi} for lo, hi in COS_RANGES),
                {"relevance": "cosine_rank", "cos_lo": 0.82, "cos_hi": 0.90, "params": {}},
            ]
            for rel in rels:
                extra = {k: v for k, v in rel.items() if k != "params"}
                for seg in (1, 2, 4):
                    for pen in (0.1, 0.2, 0.3):
                        for mv in (0.2, 0.5):
                            params = _p(
                                dp,
                                **rel.get("params", {}),
                                max_segment_chunks=seg,
                                irrelevant_chunk_penalty=pen,
                                min_segment_value=mv,
                            )
                            yield Config(route=route, params=params, **extra)
    if name == "proto2":
        rels2: list[dict[str, Any]] = [
            {"params": {"decay_rate": 10}},
            {"relevance": "cosine", "cos_lo": 0.82, "cos_hi": 0.90},
            {"relevance": "cosine", "cos_lo": 0.80, "cos_hi": 0.90},
        ]
        for route in ("none", "title"):
            for weights in ((1.0, 0.0), (1.0, 0.5)):
                for rel in rels2:
                    extra = {k: v for k, v in rel.items() if k != "params"}
                    for seg in (1, 2, 3):
                        for pen in (0.1, 0.2, 0.3):
                            for mv in (0.1, 0.3):
                                params = _p(
                                    dp,
                                    **rel.get("params", {}),
                                    max_segment_chunks=seg,
                                    irrelevant_chunk_penalty=pen,
                                    min_segment_value=mv,
                                )
                                yield Config(route=route, weights=weights, params=params, **extra)
    if name == "proto_small":  # for small chunks (300): longer runs, bigger chunk budget
        for route in ("none", "title"):
            for weights in ((1.0, 0.0), (1.0, 0.5)):
                for decay in (10, 20):
                    for seg in (2, 4, 6):
                        for pen in (0.1, 0.2, 0.3):
                            for mv in (0.1, 0.3):
                                params = _p(
                                    dp,
                                    decay_rate=decay,
                                    max_segment_chunks=seg,
                                    max_total_chunks=24,
                                    irrelevant_chunk_penalty=pen,
                                    min_segment_value=mv,
                                )
                                yield Config(route=route, weights=weights, params=params)
    if name == "final":
        yield Config(mode="dense")
        yield Config(mode="bm25")
        yield Config(mode="chunks")
        yield Config(params=get_preset("default"), name="preset=default")
        yield Config(mode="chunks", rerank="embedding")
        for preset in ("default", "reranked"):
            yield Config(rerank="embedding", params=get_preset(preset), name=f"preset={preset}")
        yield Config(mode="dense", route="title")
        for params in TUNED_PARAMS:
            for route in ("none", "title"):
                yield Config(route=route, weights=(1.0, 0.0), params=params)
    if name == "rerank":  # the library's EmbeddingReranker: calibration x RSE parameters
        cals: list[dict[str, Any]] = [
            *(
                {"calibration": "sigmoid", "sig_center": c, "sig_temp": t}
                for c in (0.84, 0.86, 0.88)
                for t in (0.01, 0.02, 0.04)
            ),
            {"calibration": "minmax"},
        ]
        yield Config(mode="chunks", rerank="embedding")
        for weights in ((1.0, 1.0), (1.0, 0.0)):
            for cal in cals:
                for decay in (None, 20.0):
                    for seg in (1, 2, 4):
                        for pen in (0.2, 0.35, 0.5):
                            for mv in (0.2, 0.5):
                                params = _p(
                                    dp,
                                    max_segment_chunks=seg,
                                    irrelevant_chunk_penalty=pen,
                                    min_segment_value=mv,
                                )
                                yield Config(
                                    rerank="embedding",
                                    weights=weights,
                                    rank_decay=decay,
                                    params=params,
                                    **cal,
                                )
    if name == "rerank2":  # around the best of "rerank" (its lowest centre won)
        cals2: list[dict[str, Any]] = [
            *(
                {"calibration": "sigmoid", "sig_center": c, "sig_temp": t}
                for c in (0.80, 0.82, 0.84)
                for t in (0.01, 0.02)
            ),
            {"calibration": "minmax"},
        ]
        for cal in cals2:
            for decay in (None, 10.0, 20.0, 40.0):
                for seg in (1, 2, 3):
                    for pen in (0.1, 0.2, 0.3):
                        params = _p(dp, max_segment_chunks=seg, irrelevant_chunk_penalty=pen)
                        yield Config(rerank="embedding", rank_decay=decay, params=params, **cal)
    if name == "route_filter":  # routing without a per-document search (proto)
        for fetch_k in (50, 200):
            for route in ("title", "title_filter"):
                for docs in (1, 2):
                    yield Config(mode="dense", route=route, route_docs=docs, fetch_k=fetch_k)
                    yield Config(mode="chunks", route=route, route_docs=docs, fetch_k=fetch_k,
                                 candidate_pool=fetch_k)  # fmt: skip
                    yield Config(route=route, route_docs=docs, fetch_k=fetch_k,
                                 candidate_pool=fetch_k, rerank="embedding",
                                 params=get_preset("reranked"), name="preset=reranked")  # fmt: skip
                    yield Config(route=route, route_docs=docs, fetch_k=fetch_k,
                                 candidate_pool=fetch_k, weights=(1.0, 0.0),
                                 params=_p(dp, max_segment_chunks=2, min_segment_value=0.3),
                                 )  # fmt: skip
    if name == "route_check":  # the library's route_check_k: routing only where the search agrees
        for check in (None, 5, 10, 20):
            rc: dict[str, Any] = {"route": "title_filter", "fetch_k": 200, "route_check": check}
            yield Config(mode="dense", **rc)
            yield Config(mode="chunks", weights=(1.0, 0.0), **rc)
            for seg, mv, pen in ((2, 0.3, 0.3), (2, 0.2, 0.2), (4, 0.2, 0.3)):
                params = _p(
                    dp, max_segment_chunks=seg, min_segment_value=mv, irrelevant_chunk_penalty=pen
                )
                yield Config(weights=(1.0, 0.0), params=params, **rc)
    if name == "route_lib":  # what the library's document_router does (filter, fetch 200)
        rf: dict[str, Any] = {"route": "title_filter", "fetch_k": 200, "candidate_pool": 50}
        yield Config(mode="dense", **rf)
        for weights in ((1.0, 1.0), (1.0, 0.0)):
            yield Config(mode="chunks", weights=weights, **rf)
            for seg, mv, pen in ((4, 0.2, 0.3), (2, 0.3, 0.3), (2, 0.2, 0.2), (1, 0.2, 0.2)):
                params = _p(
                    dp, max_segment_chunks=seg, min_segment_value=mv, irrelevant_chunk_penalty=pen
                )
                yield Config(weights=weights, params=params, **rf)
                yield Config(weights=weights, params=params, rerank="embedding", **rf)
    if name == "route_tune":  # RSE under the library's document routing, wider
        rf = {"route": "title_filter", "fetch_k": 200}
        for weights in ((1.0, 1.0), (2.0, 1.0), (1.0, 0.0)):
            for pool in (50, 100):
                yield Config(mode="chunks", weights=weights, candidate_pool=pool, **rf)
                for seg, mv, pen, decay in itertools.product(
                    (1, 2, 3, 4), (0.2, 0.3, 0.4), (0.2, 0.3, 0.4), (5.0, 10.0, 20.0)
                ):
                    params = _p(dp, max_segment_chunks=seg, min_segment_value=mv,
                                irrelevant_chunk_penalty=pen, decay_rate=decay)  # fmt: skip
                    yield Config(weights=weights, candidate_pool=pool, params=params, **rf)
    if name == "soft":  # document weighting without a filter (issue 16)
        seg2 = _p(dp, max_segment_chunks=2, min_segment_value=0.3)
        for source in ("fused", "bm25", "dense"):
            for boost in (0.5, 1.0, 2.0, 4.0, math.inf):
                for check in (None, 10):
                    for weights in ((1.0, 1.0), (1.0, 0.0), (2.0, 1.0)):
                        kw: dict[str, Any] = {
                            "route": "soft", "doc_source": source, "doc_boost": boost,
                            "route_check": check, "fetch_k": 200, "weights": weights,
                        }  # fmt: skip
                        yield Config(mode="chunks", **kw)
                        for params in (dp, seg2):
                            for merge in (False, True):
                                yield Config(params=_p(params, merge_touching=merge), **kw)
    if name == "soft2":  # the chosen shape (bm25 leads, boost 1, check 10): weights x budget
        for weights in ((1.0, 0.0), (4.0, 1.0), (3.0, 1.0), (2.0, 1.0)):
            kw2: dict[str, Any] = {"route": "soft", "doc_source": "bm25", "route_check": 10,
                                   "fetch_k": 200, "weights": weights}  # fmt: skip
            yield Config(mode="chunks", **kw2)
            for seg, mv in ((2, 0.3), (3, 0.3), (4, 0.2)):
                for total in (12, 16, 20):
                    params = _p(dp, max_segment_chunks=seg, min_segment_value=mv,
                                max_total_chunks=total, merge_touching=True)  # fmt: skip
                    yield Config(params=params, **kw2)
    if name == "margin":  # the default, with a confidence margin on the lead search
        for margin in (0.0, 0.1, 0.25, 0.5, 1.0):
            kw3 = {**ROUTED, "doc_margin": margin}
            yield Config(mode="chunks", **kw3)
            yield Config(params=_p(dp, max_segment_chunks=2, min_segment_value=0.3,
                                   merge_touching=True), **kw3)  # fmt: skip
    if name == "pack":  # fit each budget (issue 16): the default, with and without
        seg = _p(dp, max_segment_chunks=2, min_segment_value=0.3, merge_touching=True)
        for pk in (False, True):
            yield Config(mode="chunks", pack=pk, **ROUTED)
            yield Config(params=seg, pack=pk, **ROUTED)
            yield Config(params=seg, pack=pk, **{**ROUTED, "weights": (1.0, 0.0)})
    if name == "size":  # the default's routing and fusion with RSE lengths for other chunk sizes
        yield Config(mode="chunks", **ROUTED)
        for seg in (2, 3, 4, 6):
            for mv, pen in ((0.3, 0.3), (0.2, 0.2), (0.4, 0.3)):
                for decay, total in ((10.0, 12), (20.0, 24)):
                    params = _p(dp, max_segment_chunks=seg, min_segment_value=mv,
                                irrelevant_chunk_penalty=pen, decay_rate=decay,
                                max_total_chunks=total, merge_touching=True)  # fmt: skip
                    yield Config(params=params, **ROUTED)
    if name == "focus":  # the query's other clauses rank the routed document (issue 16)
        seg = dict(params=get_preset("default"), off_route_floor=1.0 + DEFAULT_BOOST, **LIBRARY)
        yield Config(**seg)
        for focus in ("global", "within", "lexical_within"):
            for fw in ((4.0, 1.0), (8.0, 2.0), (4.0, 0.0), (2.0, 0.5)):
                yield Config(focus=focus, focus_weights=fw, **seg)
    if name == "focus_preset":  # the preset and boost again, under focus (issue 16)
        for seg, mv, pen in ((2, 0.2, 0.2), (3, 0.2, 0.2), (4, 0.2, 0.2), (3, 0.3, 0.3)):
            for boost in (2.0, 3.0):
                params = _p(get_preset("default"), max_segment_chunks=seg,
                            min_segment_value=mv, irrelevant_chunk_penalty=pen)  # fmt: skip
                yield Config(params=params, off_route_floor=1.0 + boost, focus="within",
                             **{**LIBRARY, "doc_boost": boost})  # fmt: skip
    if name == "order":  # segments ordered by their best chunk (issue 16)
        for seg, total, mv, pen, decay in ((3, 24, 0.2, 0.2, 20.0), (2, 12, 0.3, 0.3, 10.0)):
            params = _p(dp, max_segment_chunks=seg, min_segment_value=mv,
                        max_total_chunks=total, irrelevant_chunk_penalty=pen,
                        decay_rate=decay, merge_touching=True)  # fmt: skip
            for order in ("value", "best", "density"):
                yield Config(params=params, order=order, **ROUTED)
    if name == "stop":  # a per-query stop: segments worth a fraction of the best (issue 16)
        yield Config(mode="chunks", **LIBRARY)
        yield Config(mode="chunks", route_only=True, **LIBRARY)
        yield Config(params=get_preset("default"), route_only="cands", **LIBRARY)
        for mult in (1.5, 2.0, 3.0, 5.0):
            yield Config(params=get_preset("default"), off_route_floor=mult, **LIBRARY)
        for merge in (True, False):  # touching segments joined (the default) or not
            yield Config(params=_p(get_preset("default"), merge_touching=merge),
                         off_route_floor=3.0, name=f"default, merge_touching={merge}",
                         **LIBRARY)  # fmt: skip
        for floor in (0.0, 0.1, 0.2, 0.3, 0.4, 0.5):
            for only in (False, True):
                yield Config(params=get_preset("default"), rel_floor=floor, route_only=only,
                             **LIBRARY)  # fmt: skip
    if name == "weights":  # dense:BM25 fusion weights under today's default (issue 16)
        for w in ((2.0, 1.0), (3.0, 1.0), (4.0, 1.0), (6.0, 1.0)):
            yield Config(mode="chunks", **{**LIBRARY, "weights": w})
            yield Config(params=get_preset("default"), off_route_floor=3.0,
                         **{**LIBRARY, "weights": w})  # fmt: skip
    if name == "pool_default":  # how many fused candidates RSE sees, under today's default
        for pool in (20, 25, 30, 32, 33, 35, 40, 50, 75, 100):
            yield Config(params=get_preset("default"), off_route_floor=3.0, candidate_pool=pool,
                         **LIBRARY)  # fmt: skip
    if name == "rrf_k":  # RRF's rank constant (Cormack et al.'s 60) under today's default
        for rrf_k in (5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 240.0, 480.0):
            yield Config(mode="chunks", rrf_k=rrf_k, **LIBRARY)
            yield Config(params=get_preset("default"), off_route_floor=3.0, rrf_k=rrf_k,
                         **LIBRARY)  # fmt: skip
    if name == "preset":  # the default preset's values again, under the off-route bar
        for decay in (15.0, 20.0, 30.0):
            for pen in (0.15, 0.2, 0.25):
                for mv in (0.2, 0.3):
                    params = _p(get_preset("default"), decay_rate=decay,
                                irrelevant_chunk_penalty=pen, min_segment_value=mv)  # fmt: skip
                    yield Config(params=params, off_route_floor=3.0, **LIBRARY)
    if name == "rerank_bar":  # the off-route bar on the reranker path (preset "reranked")
        for bar in (1.0, 1.0 + DEFAULT_BOOST):
            for calibration in ("minmax", "sigmoid"):
                yield Config(params=get_preset("reranked"), rerank="embedding",
                             calibration=calibration, off_route_floor=bar, **LIBRARY)  # fmt: skip
    if name == "boost":  # the route's boost, with the bar at 1 + boost
        for boost in (1.0, 2.0, 3.0, 4.0, 6.0):
            cfg = {**LIBRARY, "doc_boost": boost}
            yield Config(mode="chunks", **cfg)
            yield Config(params=get_preset("default"), off_route_floor=1.0 + boost, **cfg)
    if name == "fetch":  # how deep each branch fetches for the router (issue 18's query path)
        for fetch in (50, 100, 200, 400):
            kw8 = {**LIBRARY, "fetch_k": fetch}
            yield Config(mode="chunks", **kw8)
            yield Config(params=get_preset("default"), **kw8)
    if name == "gap":  # relevance from the dense cosine gap (issue 16)
        for power in (0.5, 1.0, 2.0, 4.0):
            for seg, mv, pen in ((1, 0.2, 0.2), (2, 0.3, 0.3), (2, 0.2, 0.2), (2, 0.1, 0.1),
                                 (3, 0.2, 0.2), (4, 0.2, 0.1)):  # fmt: skip
                for decay in (10.0, 20.0, 1e9):
                    params = _p(dp, max_segment_chunks=seg, min_segment_value=mv,
                                irrelevant_chunk_penalty=pen, decay_rate=decay,
                                merge_touching=True)  # fmt: skip
                    yield Config(params=params, relevance="gap", gap_power=power, **ROUTED)
    if name == "merge":  # touching segments returned as one, without routing
        for params in (dp, _p(dp, max_segment_chunks=2, min_segment_value=0.3)):
            for merge in (False, True):
                yield Config(params=_p(params, merge_touching=merge))
    if name in ("relevance", "all"):
        for fusion in ("relative_score", "dist_based"):
            yield Config(fusion=fusion, dense_scores=True, relevance="score")


def verify(
    data: CuadSubset,
    retriever: RSERetriever,
    corpus: Corpus,
    branches: Sequence[Branches],
    embeddings: CachedEmbeddings,
    n: int = 40,
) -> None:
    """The replay must return what the retriever returns: its defaults (:data:`LIBRARY`,
    the default preset and the off-route bar), alone and with the embedding reranker."""
    segments = Config(params=get_preset("default"), off_route_floor=1.0 + DEFAULT_BOOST,
                      **LIBRARY)  # fmt: skip
    cases = {
        "none": ({}, segments),
        "embedding": (
            {"reranker": EmbeddingReranker(embeddings=embeddings)},
            replace(segments, rerank="embedding"),
        ),  # fmt: skip
    }
    for (name, (update, cfg)), mode in itertools.product(cases.items(), ("segments", "chunks")):
        r = retriever.model_copy(update={**update, "mode": mode})
        cfg = replace(cfg, mode=mode)
        bad = 0
        for q, br in list(zip(data.queries, branches))[:n]:
            k = 100 if mode == "segments" else 2 * math.ceil(max(BUDGETS) / 300) + 4
            got = [
                (d.metadata["doc_id"], d.metadata["start_index"], d.metadata["end_index"])
                for d in r.invoke(q.text, k=k)
            ]
            want = run_query(cfg, corpus, br)[: len(got)] if mode == "chunks" else None
            if mode == "segments":
                want = run_query(cfg, corpus, br)
            if got != want:
                bad += 1
                first = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), None)
                log(f"  differs at position {first} of {len(got)} / {len(want)}")
        log(f"verify {mode}, rerank={name}: {n - bad}/{n} queries identical")


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--contracts", type=int, default=DEFAULT_CONTRACTS)
    ap.add_argument("--seed", type=int, default=DEFAULT_SEED)
    ap.add_argument("--chunk-size", type=int, default=DEFAULT_CHUNK_SIZE)
    ap.add_argument("--enricher", default="none")
    ap.add_argument("--grid", default="all")
    ap.add_argument("--verify", action="store_true")
    ap.add_argument(
        "--half",
        choices=("a", "b"),
        default=None,
        help="score only the queries of half of the contracts (a: even positions in name "
        "order, b: odd; all stay indexed): tune on one half, check the winners on the other",
    )
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    warnings.filterwarnings("ignore", category=DeprecationWarning)

    data = load_cuad(args.contracts, args.seed)
    inner, model_name = base_embeddings()
    embeddings = CachedEmbeddings(inner, model_name)
    embeddings.embed_array([q.text for q in data.queries], "query")
    retriever = build_retriever(data, embeddings, args.chunk_size, make_enricher(args.enricher))
    corpus = corpus_of(retriever)
    t0 = time.perf_counter()
    branches = precompute(data, corpus, embeddings)
    log(f"branches precomputed in {time.perf_counter() - t0:.1f}s")
    if args.half is not None:
        keep = halves(data)[args.half]
        data = CuadSubset(data.contracts, [data.queries[i] for i in keep])
        branches = [branches[i] for i in keep]
        log(f"half {args.half}: {len(keep)} queries")
    gold_doc = [corpus.doc_names.index(q.gold[0][0]) for q in data.queries]
    for source in ("fused", "bm25", "dense"):
        for n in (1, 2, 3):
            hit = np.mean([g in br.doc_ranks[source][:n] for g, br in zip(gold_doc, branches)])
            log(f"title routing ({source}): gold contract in the top {n}: {100 * hit:.1f}%")
    if args.verify:
        verify(data, retriever, corpus, branches, embeddings)

    configs = list(dict.fromkeys(c for g in args.grid.split(",") for c in grid(g)))
    rows: list[dict[str, Any]] = []
    for i, cfg in enumerate(configs):
        rows.append(score(cfg, data, corpus, branches))
        if i % 20 == 0:
            log(f"{i + 1}/{len(configs)} configurations")
    dense = next((r for r in rows if r["label"] == "dense"), None)
    table = []
    for r in rows:
        ratio = f"x{r['R4k'] / dense['R4k']:.2f} / x{r['P4k'] / dense['P4k']:.2f}" if dense else ""
        table.append(
            [
                ("proto " if r["proto"] else "") + r["label"],
                *[f"{100 * r[f'R{b}k']:.1f}/{100 * r[f'P{b}k']:.2f}" for b in (1, 2, 4, 8)],
                f"{r['C4k']:.0f}",
                f"{100 * r['wrong_doc4k']:.1f}",
                ratio,
            ]
        )
    held = "" if args.half is None else f", queries of half {args.half} of the contracts"
    print(
        f"CUAD dev, {len(data.contracts)} contracts (seed {args.seed}){held}, "
        f"{len(data.queries)} queries, chunk_size={args.chunk_size}, enricher={args.enricher}"
    )
    print(
        fmt_table(
            [
                "config",
                "1k R/P",
                "2k R/P",
                "4k R/P",
                "8k R/P",
                "chars@4k",
                "wrong doc %@4k",
                "vs dense @4k R / P",
            ],
            table,
        )
    )
    out = CACHE_DIR / "results" / (args.out or f"tune_{args.chunk_size}_{args.enricher}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(rows), encoding="utf-8")
    embeddings.close()


if __name__ == "__main__":
    main()
