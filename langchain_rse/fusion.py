"""Fusing ranked lists from several retrieval branches — pure functions.

Each branch is a best-first list of ``(id, score)`` pairs (``score`` may be ``None``
when a branch only gives ranks). Results are deduplicated by id, never by text.

* ``"rrf"`` — weighted reciprocal rank fusion: ``sum_b w_b / (c + rank_b)``, ranks
  starting at 1, ``c = 60`` by default (Cormack et al., 2009).
* ``"relative_score"`` — min-max normalise each branch's scores to [0, 1], then a
  weighted sum (LlamaIndex's relative-score fusion).
* ``"dist_based"`` — normalise each branch with ``mean ± 3·std`` as the range, clip
  to [0, 1], then a weighted sum (LlamaIndex's distribution-based score fusion).

A branch whose scores are missing falls back to rank-based scores ``1 / rank``
inside the score-based methods.

:func:`quotes_code` tells the queries that quote code apart, for which the retriever
weights BM25 as much as the dense branch (exact identifiers are BM25's strength), and
:data:`CODE_CORPUS` the corpora of code, where it weights BM25 more for every query.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Literal, NamedTuple

import numpy as np

__all__ = ["CODE_CORPUS", "Fused", "FusedHit", "FusionMethod", "fuse", "fused", "quotes_code"]

FusionMethod = Literal["rrf", "relative_score", "dist_based"]

Branch = Sequence[tuple[str, "float | None"]]

_CODE = re.compile(r"`|\w\(\)|[A-Za-z0-9]_[A-Za-z0-9]|::|->")
"""A backtick, ``name()``, ``snake_case``, ``a::b`` or ``a->b``: signs of quoted code that
natural-language questions (and company names such as ``Amazon.com``, ``S.A.`` or
``eFashion``) do not carry. CamelCase alone is not one: it is also how brands are spelled."""


CODE_CORPUS = 1.0
"""The snake_case identifiers per chunk (``BM25Index.identifier_density``) from which a
corpus counts as code: 2.96 on Anthropic's code set, 0.006 on CUAD's dev contracts. Not fitted:
any value between about 0.05 and 2.5 tells the two apart. Code in camelCase only is not
seen (its identifiers read like words once lowercased)."""


def quotes_code(query: str) -> bool:
    """Whether ``query`` quotes code (see ``_CODE``): on Anthropic's code set 85 of 248
    questions do, on the CUAD dev questions none."""
    return _CODE.search(query) is not None


class FusedHit(NamedTuple):
    """One fused candidate: its id, fused score and each branch's 1-based rank (or None)."""

    id: str
    score: float
    ranks: tuple[int | None, ...]


def _branch_scores(branch: Branch) -> np.ndarray:
    if any(s is None for _, s in branch):
        return 1.0 / np.arange(1, len(branch) + 1, dtype=np.float64)
    return np.asarray([s for _, s in branch], dtype=np.float64)


def _normalise(scores: np.ndarray, method: FusionMethod) -> np.ndarray:
    if scores.size == 0:
        return scores
    if method == "relative_score":
        lo, hi = float(scores.min()), float(scores.max())
    else:
        mean, std = float(scores.mean()), float(scores.std())
        lo, hi = mean - 3 * std, mean + 3 * std
    if hi - lo <= 0:
        return np.ones_like(scores)
    return np.clip((scores - lo) / (hi - lo), 0.0, 1.0)


class Fused(NamedTuple):
    """Every id the branches returned, in order of first appearance (``ids``), with its
    fused score, its 1-based rank in each branch (``ranks[b]``; 0 where branch ``b`` lacks
    it) and the ranking (``order``: positions in ``ids``, best first). The arrays stay
    arrays until :meth:`top` builds the few :class:`FusedHit`\\ s a caller keeps."""

    ids: list[str]
    scores: np.ndarray
    ranks: np.ndarray
    order: np.ndarray

    def top(self, n: int | None = None) -> list[FusedHit]:
        """The first ``n`` hits of the ranking (all of them without ``n``)."""
        at = self.order[:n]
        ranks = self.ranks[:, at].tolist()
        new = tuple.__new__  # FusedHit's own constructor, without its Python-level wrapper
        return [
            new(FusedHit, hit)
            for hit in zip(
                [self.ids[i] for i in at.tolist()],
                self.scores[at].tolist(),
                zip(*([r or None for r in column] for column in ranks)),
            )
        ]

    def ranked_ids(self, n: int | None = None) -> list[str]:
        """The ids of the first ``n`` hits of the ranking."""
        return [self.ids[i] for i in self.order[:n].tolist()]

    def boosted(self, favoured: np.ndarray, factor: float) -> Fused:
        """The scores of the ids where ``favoured`` (a boolean per id) multiplied by
        ``factor``, and the ranking re-sorted by them (ties keep this ranking's order)."""
        scores = np.where(favoured, self.scores * factor, self.scores)
        order = self.order[np.argsort(-scores[self.order], kind="stable")]
        return self._replace(scores=scores, order=order)


def fused(
    branches: Sequence[Branch],
    weights: Sequence[float] | None = None,
    method: FusionMethod = "rrf",
    rrf_k: float = 60.0,
) -> Fused:
    """Fuse best-first ranked lists into one ranking of unique ids (see :func:`fuse`)."""
    if weights is None:
        weights = [1.0] * len(branches)
    if len(weights) != len(branches):
        raise ValueError(f"got {len(weights)} weights for {len(branches)} branches")
    if any(w < 0 for w in weights):
        raise ValueError(f"fusion weights must be non-negative, got {list(weights)}")
    if method not in ("rrf", "relative_score", "dist_based"):
        raise ValueError(f"unknown fusion method {method!r}")
    if rrf_k < 0:
        raise ValueError(f"rrf_k must be non-negative, got {rrf_k}")

    # Each id's position in order of first appearance across the branches, per branch.
    first: dict[str, int] = {}
    positions = [[first.setdefault(hit[0], len(first)) for hit in branch] for branch in branches]
    totals = np.zeros(len(first))
    ranks = np.zeros((len(branches), len(first)), dtype=np.intp)  # 0: not in the branch
    for b, (branch, pos, weight) in enumerate(zip(branches, positions, weights)):
        if pos:
            ids = np.asarray(pos, dtype=np.intp)
            if len(set(pos)) == len(pos):
                at = np.arange(len(pos))
            else:  # duplicates inside a branch keep their first (best) rank
                ids, at = np.unique(ids, return_index=True)
            if method == "rrf":
                totals[ids] += weight / (rrf_k + (at + 1.0))
            else:
                totals[ids] += (weight * _normalise(_branch_scores(branch), method))[at]
            ranks[b, ids] = at + 1
    order = np.argsort(-totals, kind="stable")  # ties keep the order of first appearance
    return Fused(list(first), totals, ranks, order)


def fuse(
    branches: Sequence[Branch],
    weights: Sequence[float] | None = None,
    method: FusionMethod = "rrf",
    rrf_k: float = 60.0,
) -> list[FusedHit]:
    """Fuse best-first ranked lists into one best-first list of unique ids.

    Duplicate ids inside one branch keep their first (best) rank. Ties in the
    fused score keep the order of first appearance across branches.
    """
    return fused(branches, weights, method, rrf_k).top()
