"""Fusing ranked lists from several retrieval branches — pure functions.

Each branch is a best-first list of ``(id, score)`` pairs; they are fused by weighted
reciprocal rank fusion, ``sum_b w_b / (c + rank_b)`` with ranks starting at 1 and
``c = 60`` (Cormack et al., 2009), so only the order of a branch counts, never its scores.
Results are deduplicated by id, never by text.

:func:`quotes_code` tells the queries that quote code apart, for which the retriever
weights BM25 as much as the dense branch (exact identifiers are BM25's strength).

:func:`candidates` cuts a ranking's first hits into the candidates that go on to RSE. A
document route is no concern of this module: the pipeline applies it to a fused ranking
(:func:`~langchain_rse.routing.apply_route`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np
from numpy.typing import NDArray

from langchain_rse.indexing.records import parse_chunk_key
from langchain_rse.query import Candidate, DenseResult, Hit

__all__ = [
    "RRF_K",
    "Branch",
    "Fused",
    "FusedHit",
    "branches_of",
    "candidates",
    "fuse",
    "fused",
    "quotes_code",
]

RRF_K = 60.0
"""The reciprocal rank fusion constant the retriever fuses with (Cormack et al., 2009)."""

Branch = Sequence[tuple[str, "float | None"]]

_CODE = re.compile(r"`|\w\(\)|[A-Za-z0-9]_[A-Za-z0-9]|::|->")
"""A backtick, ``name()``, ``snake_case``, ``a::b`` or ``a->b``: signs of quoted code that
natural-language questions (and company names such as ``Amazon.com``, ``S.A.`` or
``eFashion``) do not carry. CamelCase alone is not one: it is also how brands are spelled."""


def quotes_code(query: str) -> bool:
    """Whether ``query`` quotes code (see ``_CODE``): on Anthropic's code set 85 of 248
    questions do, on the CUAD dev questions none."""
    return _CODE.search(query) is not None


class FusedHit(NamedTuple):
    """One fused candidate: its id, fused score and each branch's 1-based rank (or None)."""

    id: str
    fused_score: float
    ranks: tuple[int | None, ...]


class Fused:
    """Every id the branches returned, numbered in order of first appearance (``ids``),
    with its fused score (``scores``), its 1-based rank in each branch (``ranks[b]``; 0
    where branch ``b`` lacks it) and the ranking (``order``: id numbers, best first; ties
    in order of first appearance)."""

    __slots__ = ("ids", "order", "ranks", "scores")

    def __init__(
        self,
        ids: list[str],
        scores: NDArray[np.float64],
        ranks: NDArray[np.intp],
        order: NDArray[np.intp],
    ) -> None:
        self.ids, self.scores, self.ranks, self.order = ids, scores, ranks, order

    def top(self, n: int | None = None) -> list[FusedHit]:
        """The first ``n`` hits of the ranking (all of them without ``n``)."""
        at = self.order[:n].tolist()
        ranks = self.ranks[:, at].T.tolist()
        return [
            FusedHit(self.ids[i], score, tuple(r or None for r in rank))
            for i, score, rank in zip(at, self.scores[at].tolist(), ranks)
        ]

    def ranked_ids(self, n: int | None = None) -> list[str]:
        """The ids of the first ``n`` hits of the ranking."""
        ids = self.ids
        return [ids[i] for i in self.order[:n].tolist()]

    def boosted(self, favoured: Callable[[list[str]], NDArray[np.bool_]], factor: float) -> Fused:
        """The scores of the ids that ``favoured`` marks (a boolean per id, given all ids)
        multiplied by ``factor``, and the ranking re-sorted by them (ties keep this
        ranking's order)."""
        scores = np.where(favoured(self.ids), self.scores * factor, self.scores)
        order = self.order[np.argsort(-scores[self.order], kind="stable")]
        return Fused(self.ids, scores, self.ranks, order)


def fused(
    branches: Sequence[Branch],
    weights: Sequence[float] | None = None,
    rrf_k: float = RRF_K,
) -> Fused:
    """Fuse best-first ranked lists into one ranking of unique ids (see :func:`fuse`)."""
    if weights is None:
        weights = [1.0] * len(branches)
    if len(weights) != len(branches):
        raise ValueError(f"got {len(weights)} weights for {len(branches)} branches")
    if any(w < 0 for w in weights):
        raise ValueError(f"fusion weights must be non-negative, got {list(weights)}")
    if rrf_k < 0:
        raise ValueError(f"rrf_k must be non-negative, got {rrf_k}")

    first: dict[str, int] = {}  # each id's number, in order of first appearance
    labels = [
        np.fromiter(
            (first.setdefault(hit[0], len(first)) for hit in branch),
            dtype=np.intp,
            count=len(branch),
        )
        for branch in branches
    ]
    firsts = np.arange(len(first))
    repeats = len(first) < sum(len(x) for x in labels)
    totals = np.zeros(len(firsts))
    ranks = np.zeros((len(branches), len(firsts)), dtype=np.intp)  # 0: not in the branch
    for b, (ids, weight) in enumerate(zip(labels, weights)):
        if len(ids):
            at = np.arange(len(ids))
            if repeats and np.bincount(ids).max() > 1:  # repeats in a branch: the first counts
                ids, at = np.unique(ids, return_index=True)
            totals[ids] += weight / (rrf_k + (at + 1.0))
            ranks[b, ids] = at + 1
    order = np.lexsort((firsts, -totals))  # ties: the order of first appearance
    return Fused(list(first), totals, ranks, order)


def fuse(
    branches: Sequence[Branch],
    weights: Sequence[float] | None = None,
    rrf_k: float = RRF_K,
) -> list[FusedHit]:
    """Fuse best-first ranked lists into one best-first list of unique ids.

    Duplicate ids inside one branch keep their first (best) rank. Ties in the
    fused score keep the order of first appearance across branches.
    """
    return fused(branches, weights, rrf_k).top()


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


def candidates(
    ranking: Fused, pool: int, texts: dict[str, str], keep_first: bool = True
) -> list[Candidate]:
    """The first ``pool`` hits of ``ranking`` as candidates, best first, with the texts the
    dense branches returned (``texts``). With ``keep_first``, the ranking's first id (the
    first branch's first hit, when that branch found anything) stays a candidate however
    far a route's boost pushed it down (see ``segments.keep_dense_first``), after the
    others."""
    at = ranking.order[:pool]  # the first `pool` of the ranking, read as columns
    if ranking.ids and keep_first and not (at == 0).any():
        at = np.append(at, 0)
    scores, ranks = ranking.scores[at].tolist(), ranking.ranks[:, at].T.tolist()
    text = texts.get if texts else lambda key: None  # the dense branch returned no texts
    keys = [ranking.ids[i] for i in at.tolist()]
    return [
        Candidate(key, *parse_chunk_key(key), score, rank, text(key))
        for key, score, rank in zip(keys, scores, ranks)
    ]
