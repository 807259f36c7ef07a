"""Fusing ranked lists from several retrieval branches — pure functions.

Each branch is a best-first list of ``(id, score)`` pairs (``score`` may be ``None``
when a branch only gives ranks). Results are deduplicated by id, never by text. The
in-process indexes return :class:`Ranked` branches instead: positions in the index, whose
keys are read only for the hits fusion keeps, and each hit's key id (``hash`` of its
key, kept by the index), by which the hits of the branches are matched in one array sort;
hits matched by a shared key id have their keys compared, so two keys that share one are
never merged.

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
from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import accumulate
from typing import Literal, NamedTuple, overload

import numpy as np

__all__ = [
    "CODE_CORPUS",
    "NO_KEY",
    "Fused",
    "FusedHit",
    "FusionMethod",
    "Ranked",
    "fuse",
    "fused",
    "key_ids",
    "quotes_code",
]

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


NO_KEY = -1
"""The key id of a position that holds no chunk of ours (``hash`` never returns -1)."""


def key_ids(keys: Iterable[str | None]) -> np.ndarray:
    """The key id of each key (``hash(key)``, 64 bits), :data:`NO_KEY` for None or "": the
    ids :class:`Ranked` branches are fused by. Ids are equal for equal keys within one
    process; two keys may share one (about 3e-8 for some pair among 1M keys), which
    :func:`fused` checks before it merges hits."""
    return np.fromiter((hash(k) if k else NO_KEY for k in keys), dtype=np.int64)


class Ranked(Sequence[tuple[str, float]]):
    """A branch's hits, best first, kept as arrays: hit ``i`` is the chunk ``keys[at[i]]``
    with score ``scores[i]`` and key id ``ids[i]`` (see :func:`key_ids`). A sequence of
    ``(key, score)`` pairs like any branch, but :func:`fused` reads the keys of the hits
    it keeps only: an index holds each position's key and key id, and a search returns
    positions."""

    __slots__ = ("at", "ids", "keys", "scores")

    def __init__(
        self, keys: Sequence[str | None], at: np.ndarray, ids: np.ndarray, scores: np.ndarray
    ) -> None:
        if not len(at) == len(ids) == len(scores):
            raise ValueError("a ranked branch needs as many positions, ids and scores")
        self.keys, self.at, self.ids = keys, at, ids
        self.scores = np.asarray(scores, dtype=np.float64)

    @classmethod
    def empty(cls) -> Ranked:
        """A branch with no hits."""
        return cls([], np.zeros(0, dtype=np.intp), np.zeros(0, dtype=np.int64), np.zeros(0))

    def key(self, i: int) -> str:
        """The key of hit ``i``."""
        return self.keys[int(self.at[i])]  # type: ignore[return-value]

    def __len__(self) -> int:
        return len(self.at)

    @overload
    def __getitem__(self, i: int) -> tuple[str, float]: ...
    @overload
    def __getitem__(self, i: slice) -> list[tuple[str, float]]: ...
    def __getitem__(self, i: int | slice) -> tuple[str, float] | list[tuple[str, float]]:
        if isinstance(i, slice):
            keys = self.keys
            return [(keys[p], x) for p, x in zip(self.at[i].tolist(), self.scores[i].tolist())]  # type: ignore[misc]
        return self.key(i), float(self.scores[i])

    def __iter__(self) -> Iterator[tuple[str, float]]:
        return iter(self[:])

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (Ranked, list, tuple)):
            return list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Ranked({self[:]!r})"


def _branch_scores(branch: Branch) -> np.ndarray:
    if isinstance(branch, Ranked):
        return branch.scores
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


class Fused:
    """Every id the branches returned, numbered (in order of first appearance, or of key
    id for :class:`Ranked` branches), with its fused score (``scores``), its 1-based rank
    in each branch (``ranks[b]``; 0 where branch ``b`` lacks it) and the ranking
    (``order``: id numbers, best first; ties in order of first appearance). Keys are read
    when asked for (:meth:`top`, :meth:`ranked_ids`, :attr:`ids`): for :class:`Ranked`
    branches, from the index only for the hits a caller keeps."""

    __slots__ = ("_keys", "order", "ranks", "scores")

    def __init__(self, keys: Callable[[list[int]], list[str]], scores: np.ndarray,
                 ranks: np.ndarray, order: np.ndarray) -> None:  # fmt: skip
        self._keys, self.scores, self.ranks, self.order = keys, scores, ranks, order

    @property
    def ids(self) -> list[str]:
        """The key of every id number."""
        return self._keys(list(range(len(self.scores))))

    def top(self, n: int | None = None) -> list[FusedHit]:
        """The first ``n`` hits of the ranking (all of them without ``n``)."""
        at = self.order[:n]
        ranks = self.ranks[:, at].tolist()
        new = tuple.__new__  # FusedHit's own constructor, without its Python-level wrapper
        return [
            new(FusedHit, hit)
            for hit in zip(
                self._keys(at.tolist()),
                self.scores[at].tolist(),
                zip(*([r or None for r in column] for column in ranks)),
            )
        ]

    def ranked_ids(self, n: int | None = None) -> list[str]:
        """The ids of the first ``n`` hits of the ranking."""
        return self._keys(self.order[:n].tolist())

    def boosted_first(self, n: int, favoured: Callable[[list[str]], np.ndarray], factor: float
                      ) -> Fused:  # fmt: skip
        """:meth:`boosted` for the ids whose keys ``favoured`` marks (a boolean per key),
        exact in the first ``n`` places: only the keys of ids that can reach them are read,
        those whose score times ``factor`` (at least 1) reaches the ``n``-th score, which
        boosting only raises. Whether the others are boosted changes the ranking after the
        ``n``-th place only."""
        reach = len(self.order)
        if n < reach:
            nth = self.scores[self.order[n - 1]] if n > 0 else np.inf
            reach = int(np.count_nonzero(self.scores * factor >= nth))
        marked = np.zeros(len(self.scores), dtype=bool)
        marked[self.order[:reach]] = favoured(self.ranked_ids(reach))
        return self.boosted(marked, factor)

    def boosted(self, favoured: np.ndarray, factor: float) -> Fused:
        """The scores of the ids where ``favoured`` (a boolean per id) multiplied by
        ``factor``, and the ranking re-sorted by them (ties keep this ranking's order)."""
        scores = np.where(favoured, self.scores * factor, self.scores)
        order = self.order[np.argsort(-scores[self.order], kind="stable")]
        return Fused(self._keys, scores, self.ranks, order)


class _Numbering(NamedTuple):
    """The branches' hits numbered by id: each branch's id numbers (``labels``), the first
    hit of each id (its index over the branches in turn), whether any id is hit twice,
    and the keys of id numbers."""

    labels: list[np.ndarray]
    firsts: np.ndarray
    repeats: bool
    keys: Callable[[list[int]], list[str]]


def _by_key(branches: Sequence[Branch]) -> _Numbering:
    """Ids numbered in order of first appearance, by key."""
    first: dict[str, int] = {}
    labels = [
        np.fromiter((first.setdefault(hit[0], len(first)) for hit in branch), dtype=np.intp,
                    count=len(branch))
        for branch in branches
    ]  # fmt: skip
    ids = list(first)
    hits = sum(len(x) for x in labels)
    return _Numbering(labels, np.arange(len(ids)), len(ids) < hits, lambda at: [ids[i] for i in at])


def _by_key_id(branches: Sequence[Ranked]) -> _Numbering | None:
    """Ids numbered in order of key id (one sort of the hits' key ids); None when two hits
    share a key id but not a key (then they must be told apart by key)."""
    flat = np.concatenate([b.ids for b in branches])
    order = np.argsort(flat, kind="stable")  # stable: each id's first hit leads its run
    sorted_ids = flat[order]
    head = np.empty(len(flat), dtype=bool)
    head[:1] = True
    np.not_equal(sorted_ids[1:], sorted_ids[:-1], out=head[1:])
    labels = np.empty(len(flat), dtype=np.intp)
    labels[order] = np.cumsum(head) - 1
    firsts = order[head]
    bounds = list(accumulate((len(b) for b in branches), initial=0))
    branch_of = np.repeat(np.arange(len(branches)), np.diff(bounds))  # each hit's branch
    where = np.concatenate([b.at for b in branches])  # each hit's key position
    lists = [b.keys for b in branches]

    def keys(at: list[int]) -> list[str]:
        hits = firsts[at]
        return [lists[b][p] for b, p in zip(branch_of[hits].tolist(), where[hits].tolist())]  # type: ignore[misc]

    repeats = len(firsts) < len(flat)
    if repeats:  # a hit merged with an earlier one: their keys must match
        later = order[~head]
        if _collides(later, firsts[labels[later]], branch_of, where, lists):
            return None
    return _Numbering([labels[a:b] for a, b in zip(bounds, bounds[1:])], firsts, repeats, keys)


def _collides(hits: np.ndarray, first: np.ndarray, branch_of: np.ndarray, where: np.ndarray,
              lists: list[Sequence[str | None]]) -> bool:  # fmt: skip
    """Whether one of ``hits``, each merged with the earlier hit ``first`` (the same key id),
    names another key. A hit at the position of the earlier one in the same key list (a
    focus search's hit, over the index of an earlier branch) is the same key; the others
    have their keys compared."""
    b, p = branch_of[hits].tolist(), where[hits].tolist()
    a, q = branch_of[first].tolist(), where[first].tolist()
    return any(
        lists[i][m] != lists[j][n]
        for i, m, j, n in zip(b, p, a, q)
        if m != n or lists[i] is not lists[j]
    )


def fused(
    branches: Sequence[Branch],
    weights: Sequence[float] | None = None,
    method: FusionMethod = "rrf",
    rrf_k: float = 60.0,
) -> Fused:
    """Fuse best-first ranked lists into one ranking of unique ids (see :func:`fuse`).
    When every branch is :class:`Ranked`, hits are matched by key id (one array sort) and
    only the keys of hits that share one are compared; otherwise by key."""
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

    numbered = None
    if branches and all(isinstance(b, Ranked) for b in branches):
        numbered = _by_key_id(branches)  # type: ignore[arg-type]
    labels, firsts, repeats, keys = numbered or _by_key(branches)
    totals = np.zeros(len(firsts))
    ranks = np.zeros((len(branches), len(firsts)), dtype=np.intp)  # 0: not in the branch
    for b, (branch, ids, weight) in enumerate(zip(branches, labels, weights)):
        if len(ids):
            at = np.arange(len(ids))
            if repeats and np.bincount(ids).max() > 1:  # repeats in a branch: the first counts
                ids, at = np.unique(ids, return_index=True)
            if method == "rrf":
                totals[ids] += weight / (rrf_k + (at + 1.0))
            else:
                totals[ids] += (weight * _normalise(_branch_scores(branch), method))[at]
            ranks[b, ids] = at + 1
    order = np.lexsort((firsts, -totals))  # ties: the order of first appearance
    return Fused(keys, totals, ranks, order)


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
