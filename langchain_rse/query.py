"""The query's types, below every module that passes them along: a search hit
(:data:`Hit`), a dense search's result (:class:`DenseResult`), a fused candidate on its way
to RSE (:class:`Candidate`) and the route a router gives a query (:class:`Route`, the
policy the pipeline applies to the fused ranking). Fusion, segments, explain, search,
routing and the pipeline import them from here instead of from each other.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

__all__ = ["Candidate", "DenseResult", "Hit", "Route"]

Hit = tuple[str, "float | None"]
"""``(chunk key, score)``; the score is None when the store gives none."""


@dataclass
class DenseResult:
    hits: Sequence[Hit]
    """``(chunk key, score)`` best first (the default store's
    :meth:`~langchain_rse.integrations.faiss.FaissStore.ranked`)."""
    texts: dict[str, str] = field(default_factory=dict)
    """Enriched index text of each hit, when the store returned it (saves a read)."""


@dataclass(slots=True)
class Candidate:
    """A fused candidate chunk on its way to RSE."""

    key: str
    doc_id: str
    version: str
    chunk_index: int
    fused_score: float
    """Weighted reciprocal-rank-fusion score (boosted when a soft route favours it)."""
    ranks: list[int]
    """1-based rank in each fused branch (each query's dense, then lexical); 0: not in it."""
    text: str | None = None  # enriched index text, when the dense branch returned it
    relevance: float = 0.0
    rerank_score: float | None = None


@dataclass(frozen=True)
class Route:
    """A query's route, the policy a document router
    (:class:`~langchain_rse.routing.DocumentRouter`) gives the pipeline: the documents the
    query names and how their chunks are favoured in the fused ranking
    (:func:`~langchain_rse.routing.apply_route`) and in segment selection.

    Usage:
        .. code-block:: python

            route = Route(frozenset({"orion.txt"}), factor=3.0, check_k=10)
            route = route.confirmed(["orion.txt", "lyra.txt"])  # the unrouted ranking agrees
    """

    docs: frozenset[str]
    """The routed documents."""
    factor: float
    """Their chunks' fused scores are multiplied by it (``1 + boost``); ``inf``: only their
    chunks are candidates (:attr:`keeps_only`)."""
    check_k: int | None = None
    """Not confirmed yet: the route holds only for the documents with a chunk among the
    first ``check_k`` of the unrouted ranking (:meth:`confirmed`). None: it holds as is."""
    focus: float = 0.0
    """The query without the words that name the routed documents also searches them,
    its searches fused at this times the query's own weights; 0: no focus search
    (:attr:`DocumentRouter.focus_weight <langchain_rse.routing.DocumentRouter.focus_weight>`)."""

    @property
    def keeps_only(self) -> bool:
        """Only the routed documents' chunks are candidates (a filter, not a boost)."""
        return math.isinf(self.factor)

    @property
    def segment_factor(self) -> float | None:
        """In segments mode a segment of another document must be worth this many times
        the preset's ``min_segment_value`` (the boost's factor); None under a keep-only
        route, which leaves no other document's candidates."""
        return None if self.keeps_only else self.factor

    def confirmed(self, ranked_docs: Sequence[str]) -> Route | None:
        """This route, confirmed against the unrouted ranking (each candidate's doc id, best
        first): only the routed documents with a chunk among its first :attr:`check_k`, and
        None (no route) when none has one. A confirmed route is returned as it is."""
        if self.check_k is None:
            return self
        kept = self.docs.intersection(ranked_docs[: self.check_k])
        return replace(self, docs=kept, check_k=None) if kept else None
