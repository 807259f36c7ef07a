"""The query's types, below every module that passes them along: a search hit
(:data:`Hit`), a dense search's result (:class:`DenseResult`), a fused candidate on its way
to RSE (:class:`Candidate`), the route that holds for a query (:class:`Route`), and what
fusion and segment selection read from a router and from a query's settings
(:class:`RouteCheck`, :class:`FusionSettings`). Fusion, segments, explain, search and the
pipeline import them from here instead of from each other.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

__all__ = ["Candidate", "DenseResult", "FusionSettings", "Hit", "Route", "RouteCheck"]

Hit = tuple[str, "float | None"]
"""``(chunk key, score)``; the score is None when the store gives none."""


@dataclass
class DenseResult:
    hits: Sequence[Hit]
    """``(chunk key, score)`` best first; a :class:`~langchain_rse.fusion.Ranked` from the
    default store."""
    texts: dict[str, str] = field(default_factory=dict)
    """Enriched index text of each hit, when the store returned it (saves a read)."""


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
class Route:
    """The documents a query was routed to, when the route holds, and the factor their
    chunks' fused scores were multiplied by (``inf``: only their chunks are candidates)."""

    docs: frozenset[str]
    factor: float


class RouteCheck(Protocol):
    """What fusion asks of a document router (:class:`~langchain_rse.routing.DocumentRouter`)."""

    @property
    def check_k(self) -> int | None: ...

    @property
    def boost(self) -> float: ...

    def confirmed(self, routed: set[str], ranked_keys: Sequence[str]) -> set[str] | None: ...


class FusionSettings(Protocol):
    """What fusion reads from a query's settings
    (:class:`~langchain_rse.pipeline.QuerySettings`)."""

    @property
    def queries(self) -> list[str]: ...

    @property
    def weights(self) -> tuple[float, float]: ...

    @property
    def candidate_pool(self) -> int: ...
