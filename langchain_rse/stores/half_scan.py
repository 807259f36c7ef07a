"""Exact nearest-neighbour search over a flat FAISS index that reads half its bytes.

An exact scan of a flat index reads every float32 vector: 150 MB at 100k chunks of 384
dimensions, bound by the memory bandwidth (about 6 ms on one core of the benchmark's
machine). :class:`HalfCopy` keeps the same vectors in half precision (an
``IndexScalarQuantizer`` of FAISS, ``QT_fp16``) and :func:`exact_search` scans that copy
first, then computes the exact distances of the few vectors that can still be among the
``k`` nearest, with the flat index's own code: the same hits and the same distances as
``index.search`` on one OpenMP thread (the retriever's ``faiss_threads=1``), in the same
order. (On more threads FAISS splits one query's scan over them and computes its distances
another way, which differs in the last bits: there the hits can differ only between
distances that close.)

Why that is exact: rounding a vector ``x`` to half precision moves it by at most ``E``
(the largest ``||x - half(x)||``, measured on the vectors as FAISS stores them), so by the
triangle inequality the distance from a query to ``x`` and to its copy differ by at most
``E`` (for inner products: by at most ``||q|| E``). The ``k``-th best coarse distance
bounds the ``k``-th best exact one; a vector whose coarse distance lies beyond that bound
by more than twice ``E`` (and the float32 rounding of the sums, with room to spare) cannot
be among the ``k`` nearest. The coarse search asks for more hits until the last one is
beyond the bound, so ties and clusters of near-duplicates widen the set instead of being
cut. Costs: 2 bytes a dimension more memory (768 B a chunk at 384 dimensions) and the
copy's upkeep, which :class:`~langchain_rse.stores.faiss.LocalFAISS` does on each write.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

__all__ = ["HalfCopy", "exact_search"]

_ROWS = 65_536
"""Vectors encoded (and measured) per batch when a copy is built or extended."""

_FIRST = 2
"""The coarse search asks for this many times ``k`` hits first (doubling if too few)."""


@dataclass(frozen=True)
class HalfCopy:
    """A half-precision copy of a flat FAISS index's first ``n`` vectors.

    ``error``: the largest distance from a vector to its copy; ``norm``: the largest vector
    norm (both upper bounds once vectors are removed). Build with :meth:`of`; writes go
    through :meth:`extend` and :meth:`remove`.
    """

    source: Any
    """The flat index (``faiss.IndexFlat``) this copies."""
    index: Any
    """The copy: ``faiss.IndexScalarQuantizer`` (``QT_fp16``, the same metric)."""
    n: int
    error: float
    norm: float

    @classmethod
    def of(cls, flat: Any) -> HalfCopy:
        """A copy of ``flat``'s vectors (an L2 or inner-product ``faiss.IndexFlat``)."""
        import faiss

        index = faiss.IndexScalarQuantizer(flat.d, faiss.ScalarQuantizer.QT_fp16, flat.metric_type)
        return cls(flat, index, 0, 0.0, 0.0).extend()

    def extend(self) -> HalfCopy:
        """This copy with the vectors the source has appended since it was made (FAISS's
        flat indexes only append). A value beyond half precision makes ``error`` infinite:
        :func:`exact_search` then scans the source."""
        start, end = self.n, self.source.ntotal
        error, norm = self.error, self.norm
        for lo in range(start, end, _ROWS):
            rows = _vectors(self.source, lo, min(lo + _ROWS, end))
            self.index.add(rows)
            copied = self.index.reconstruct_n(lo, len(rows))
            with np.errstate(over="ignore", invalid="ignore"):
                error = max(error, float(np.linalg.norm(rows - copied, axis=1).max()))
                norm = max(norm, float(np.linalg.norm(rows, axis=1).max()))
            if not (math.isfinite(error) and math.isfinite(norm)):
                error = math.inf
        return replace(self, n=end, error=error, norm=norm)

    def remove(self, positions: np.ndarray) -> HalfCopy:
        """This copy after the source removed ``positions`` (``remove_ids``: later
        positions move up)."""
        self.index.remove_ids(positions)
        return replace(self, n=self.index.ntotal)

    def synced(self, flat: Any) -> bool:
        """Whether this is a copy of ``flat`` as it is now."""
        return self.source is flat and self.n == flat.ntotal

    @property
    def nbytes(self) -> int:
        """The copy's vectors in bytes."""
        return int(self.n * self.index.code_size)


def exact_search(copy: HalfCopy, vector: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """``copy.source.search(vector, k)`` for one query vector (shape ``(1, d)``, float32):
    the same distances and positions as that search on one OpenMP thread, reading the
    half-precision copy whole and the flat index only at the candidates (see the module
    docstring)."""
    import faiss

    flat, n = copy.source, copy.n
    vector = np.ascontiguousarray(vector, dtype=np.float32)  # FAISS reads its buffer
    if k >= n // _FIRST or math.isinf(copy.error):  # most of the index, or no bound
        return flat.search(vector, k)  # type: ignore[no-any-return]
    ip = flat.metric_type == faiss.METRIC_INNER_PRODUCT
    q = float(np.linalg.norm(vector))
    reach = copy.norm + copy.error  # no vector or copy is farther from the origin
    rounding = 2.0**-22 * flat.d  # relative float32 error of a d-term sum, 4x the usual bound
    fetch = _FIRST * k
    coarse, positions = copy.index.search(vector, fetch)
    kth = float(coarse[0, k - 1])  # the same in every longer fetch: so is the bar
    if ip:  # similarities: higher is better
        slack = rounding * q * reach
        bar = kth - 4 * slack - 2 * q * copy.error
    else:  # squared distances: lower is better
        slack = rounding * (q + reach) ** 2
        upper = (math.sqrt(kth + slack) + copy.error) ** 2 + slack  # the k-th exact
        bar = (math.sqrt(upper + slack) + copy.error) ** 2 + slack
    sign = -1.0 if ip else 1.0  # past the bar: below it for similarities, above for distances
    while sign * float(coarse[0, -1]) <= sign * bar:  # the last hit is not past the bar
        if fetch >= n:  # everything is a candidate
            return flat.search(vector, k)  # type: ignore[no-any-return]
        fetch = min(2 * fetch, n)
        coarse, positions = copy.index.search(vector, fetch)
    keep = coarse[0] >= bar if ip else coarse[0] <= bar
    candidates = np.ascontiguousarray(positions[:, keep])
    distances = np.empty(candidates.shape, dtype=np.float32)
    flat.compute_distance_subset(
        1,
        faiss.swig_ptr(vector),
        candidates.shape[1],
        faiss.swig_ptr(distances),
        faiss.swig_ptr(candidates),
    )
    # FAISS's heaps order (distance, position) pairs: the nearest first and, among equal
    # distances, the lower position first for L2 and the higher one for inner products
    ranks = (-candidates[0], -distances[0]) if ip else (candidates[0], distances[0])
    order = np.lexsort(ranks)
    if order.size > k and distances[0, order[k - 1]] == distances[0, order[k]]:
        # A tie across the k-th place: which of the tied FAISS keeps depends on the order
        # its scan meets them in, so let it scan the candidates (in position order).
        params = faiss.SearchParameters()
        params.sel = selector = faiss.IDSelectorBatch(candidates[0])  # alive until it returns
        distances, positions = flat.search(vector, k, params=params)
        del selector
        return distances, positions
    return distances[:, order[:k]], candidates[:, order[:k]]


def _vectors(flat: Any, start: int, end: int) -> np.ndarray:
    """Rows ``start:end`` of a flat index's vectors (a view of FAISS's buffer)."""
    import faiss

    every = faiss.rev_swig_ptr(flat.get_xb(), flat.ntotal * flat.d).reshape(flat.ntotal, flat.d)
    return every[start:end]
