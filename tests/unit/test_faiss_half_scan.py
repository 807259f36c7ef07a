"""FaissStore's half-precision pre-scan (``HALF_SCAN_FROM`` vectors and more) returns
exactly what a full-precision search returns: the same ids, scores and order."""

from __future__ import annotations

import numpy as np
import pytest

from langchain_rse.integrations.faiss import HALF_SCAN_FROM, FaissStore


class _NoModel:
    def embed_documents(self, texts):  # pragma: no cover - vectors are given
        raise AssertionError

    def embed_query(self, text):  # pragma: no cover
        raise AssertionError


def _full(store: FaissStore, query: np.ndarray, k: int):
    """What the full-precision index itself returns: positions and scores, best first."""
    q = np.array(query, dtype=np.float32, ndmin=2)
    q /= np.linalg.norm(q)
    scores, at = store.index.search(q, k)
    order = np.lexsort((at[0], -scores[0]))
    return at[0][order], scores[0][order]


@pytest.mark.parametrize("seed", range(3))
def test_the_half_scan_returns_the_exact_top_k(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n, dim = HALF_SCAN_FROM + 5_000, 24
    vectors = rng.normal(size=(n, dim)).astype(np.float32)
    # near-ties the half-precision copy cannot tell apart: a cluster of almost equal
    # vectors (forces the exact fallback) and exact duplicates (ties broken by position)
    vectors[:1000] = vectors[0] + rng.normal(scale=3e-3, size=(1000, dim))
    vectors[1000:1050] = vectors[1]
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    store = FaissStore(_NoModel(), keep_text=False)
    store.add_embeddings([""] * n, vectors, ids=[f"v{i}" for i in range(n)])

    def check() -> None:
        queries = [vectors[0], vectors[1000], vectors[3], vectors[1500]]
        for query in [*queries, *rng.normal(size=(12, dim))]:
            for k in (1, 10, 50, 200):
                positions, scores = store.search_vector(query, k)
                want, want_scores = _full(store, query, k)
                np.testing.assert_allclose(scores, want_scores, rtol=0, atol=1e-6)
                # the same ids, best first; those within float32 rounding of the cut
                # may be either
                cut = want_scores[-1]
                assert set(want[want_scores > cut + 2e-6]) <= set(positions)
                assert (scores >= cut - 2e-6).all()
                assert (np.diff(scores) <= 0).all()

    check()
    assert store._half is not None and store._half.ntotal == n  # the copy was used
    gone = rng.choice(n, size=3_000, replace=False)
    store.delete([f"v{i}" for i in gone])
    check()
    assert store._half.ntotal == n - len(gone) >= HALF_SCAN_FROM  # kept in step with deletes
