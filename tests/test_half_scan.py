"""The half-precision scan returns exactly what FAISS's exact search returns.

``exact_search`` must give the same positions, the same float32 distances and the same
order (ties included) as ``IndexFlat.search`` on one OpenMP thread, as the retriever
searches (on more, FAISS computes a single query's distances another way); ``LocalFAISS``
keeps its copy in step with every way LangChain's ``FAISS`` writes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import faiss
import numpy as np
import pytest
from langchain_core.documents import Document

from helpers import HashingEmbeddings, make_contract
from langchain_rse import RSERetriever
from langchain_rse.persistence import default_vectorstore
from langchain_rse.search import faiss_threads
from langchain_rse.stores.faiss import LocalFAISS
from langchain_rse.stores.half_scan import HalfCopy, exact_search

FAISS = LocalFAISS.__mro__[1]
"""``langchain_community.vectorstores.FAISS``, as LangChain ships it."""

DIM = 24


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    """FAISS on one OpenMP thread in the test's thread, as the retriever searches."""
    before = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(1)
    yield
    faiss.omp_set_num_threads(before)


def vectors(rng: np.random.Generator, n: int, normalized: bool) -> np.ndarray:
    """Clustered vectors with exact and near duplicates (ties and near-ties)."""
    centres = rng.standard_normal((20, DIM))
    x = centres[rng.integers(0, 20, n)] + 0.3 * rng.standard_normal((n, DIM))
    x[n // 2 : n // 2 + 40] = x[7]  # exact duplicates
    x[n // 3 : n // 3 + 40] = x[11] + 1e-4 * rng.standard_normal((40, DIM))  # near ones
    if normalized:
        x /= np.linalg.norm(x, axis=1, keepdims=True)
    else:
        x *= 3.0
    return np.ascontiguousarray(x, dtype=np.float32)


def flat_index(x: np.ndarray, metric: int) -> faiss.IndexFlat:
    index = faiss.IndexFlatL2(DIM) if metric == faiss.METRIC_L2 else faiss.IndexFlatIP(DIM)
    index.add(x)
    return index


def assert_same(copy: HalfCopy, queries: np.ndarray, ks: list[int]) -> None:
    for q in queries:
        one = q[None, :]  # a view, float32 or not: exact_search makes it FAISS's input
        for k in ks:
            want_d, want_i = copy.source.search(one, k)
            got_d, got_i = exact_search(copy, one, k)
            assert np.array_equal(got_i, want_i), (k, got_i, want_i)
            assert np.array_equal(got_d, want_d)  # bit for bit


@pytest.mark.parametrize("metric", [faiss.METRIC_L2, faiss.METRIC_INNER_PRODUCT])
@pytest.mark.parametrize("normalized", [True, False])
def test_same_hits_distances_and_order_as_the_exact_scan(metric: int, normalized: bool) -> None:
    rng = np.random.default_rng(metric * 2 + normalized)
    x = vectors(rng, 6_000, normalized)
    copy = HalfCopy.of(flat_index(x, metric))
    assert copy.n == 6_000 and 0 < copy.error < 1e-2 * copy.norm
    noisy = x[rng.integers(0, len(x), 30)] + 0.05 * rng.standard_normal((30, DIM))
    queries = np.concatenate([noisy, x[[7, 11, 3_000, 2_000]], rng.standard_normal((10, DIM))])
    assert_same(copy, queries, [1, 4, 10, 50, 200, 2_999, 3_000, 6_000])  # float64 rows


@pytest.mark.parametrize("metric", [faiss.METRIC_L2, faiss.METRIC_INNER_PRODUCT])
def test_a_tie_larger_than_the_first_fetch_widens_the_candidates(metric: int) -> None:
    rng = np.random.default_rng(5)
    x = vectors(rng, 3_000, normalized=True)
    x[1_000:1_500] = x[3]  # 500 equal vectors: the k-th hit ties with hundreds more
    copy = HalfCopy.of(flat_index(x, metric))
    fetched: list[int] = []

    class Counting:  # the half-precision index, recording how many hits each scan asks for
        def search(self, vector: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
            fetched.append(k)
            return copy.index.search(vector, k)  # type: ignore[no-any-return]

    assert_same(replace(copy, index=Counting()), x[[3, 1_200]] + np.float32(1e-3), [10, 50, 120])
    assert max(fetched) >= 500  # it asked again, for more, until the tie was inside


def test_values_beyond_half_precision_are_searched_in_float32() -> None:
    x = vectors(np.random.default_rng(6), 2_000, normalized=False)
    x[5, 0] = 1e6  # no half-precision number is that large
    copy = HalfCopy.of(flat_index(x, faiss.METRIC_L2))
    assert copy.error == float("inf")
    assert_same(copy, x[:5], [1, 10])


def test_local_faiss_keeps_the_copy_in_step_with_every_write() -> None:
    emb = HashingEmbeddings()
    texts = [f"clause {i} on topic {i % 17} and term {i % 5}" for i in range(3_000)]
    store = LocalFAISS.from_texts(texts[:1_000], emb, ids=[f"t{i}" for i in range(1_000)])
    probe = np.asarray([emb.embed_query("topic 3 and term 2")], dtype=np.float32)

    def check(n: int) -> HalfCopy:
        assert store.index.ntotal == n
        assert [a.tolist() for a in store.search_vectors(probe, 20)] == [
            a.tolist() for a in store.index.search(probe, 20)
        ]
        assert store._half is not None and store._half.synced(store.index)
        return store._half

    first = check(1_000)
    store.add_texts(texts[1_000:1_500], ids=[f"t{i}" for i in range(1_000, 1_500)])
    assert check(1_500).index is first.index  # extended, not made again
    asyncio.run(store.aadd_texts(texts[1_500:2_000], ids=[f"t{i}" for i in range(1_500, 2_000)]))
    pairs = [(t, emb.embed_query(t)) for t in texts[2_000:2_500]]
    store.add_embeddings(pairs, ids=[f"t{i}" for i in range(2_000, 2_500)])
    other = LocalFAISS.from_texts(texts[2_500:], emb, ids=[f"t{i}" for i in range(2_500, 3_000)])
    store.merge_from(other)
    assert check(3_000).index is first.index
    store.delete([f"t{i}" for i in range(0, 3_000, 7)] + ["t2999"])
    assert check(3_000 - 429 - 1).index is first.index  # removed from the copy as well
    FAISS.delete(store, ["t1", "t2"])  # LangChain's own delete, behind the copy's back
    assert check(3_000 - 429 - 3).index is not first.index  # made again
    store.half_precision_scan = False
    assert [a.tolist() for a in store.search_vectors(probe, 20)] == [
        a.tolist() for a in store.index.search(probe, 20)
    ]
    assert store._half is None  # its memory handed back


def prepared(store: Any) -> bool:
    """Whether the copy and the position keys are up to date (no search needed)."""
    keys = store.docstore._hit_keys
    synced = keys[0] is store.index_to_docstore_id and len(keys[1]) == store.index.ntotal
    return synced and store._half is not None and store._half.synced(store.index)


def test_the_retriever_returns_the_same_with_and_without_the_copy(tmp_path: Path) -> None:
    topics = ["termination", "payment", "confidentiality", "warranty", "liability", "fees"]
    emb = HashingEmbeddings()
    r = RSERetriever(vectorstore=default_vectorstore(emb))
    r.add_documents(
        [Document(make_contract(f"c{i}", [topics[i % 6], topics[i * 5 % 6]])) for i in range(40)]
    )
    store = r.vectorstore
    assert isinstance(store, LocalFAISS) and store.index.ntotal > 4 * r.fetch_k
    assert prepared(store)  # by the write, not left to the first query
    r.save(tmp_path)
    assert prepared(RSERetriever.load(tmp_path, embedding=emb).vectorstore)  # and by the load

    def run() -> list[list[tuple[str, int, float]]]:
        return [
            [(d.page_content, d.metadata["start_index"], d.metadata["score"]) for d in found]
            for q in ["termination for convenience", "fees and payment", "warranty of title"]
            for found in (r.invoke(q), r.invoke(q, mode="chunks", k=8))
        ]

    with_copy = run()
    assert store._half is not None and store._half.synced(store.index)  # the dense branch used it
    store.half_precision_scan = False
    assert run() == with_copy


def test_concurrent_first_searches_share_one_copy() -> None:
    from concurrent.futures import ThreadPoolExecutor

    rng = np.random.default_rng(9)
    x = vectors(rng, 20_000, normalized=True)
    store = LocalFAISS(HashingEmbeddings(), flat_index(x, faiss.METRIC_L2), None, {})  # type: ignore[arg-type]
    queries = [np.ascontiguousarray(q[None, :]) for q in x[rng.integers(0, 20_000, 40)] + 0.01]
    want = [store.index.search(q, 30) for q in queries]

    def search(q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        with faiss_threads(store, 1):  # an OpenMP setting is per thread
            return store.search_vectors(q, 30)

    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(search, queries))
    assert all(np.array_equal(g[1], w[1]) and np.array_equal(g[0], w[0]) for g, w in zip(got, want))
    assert store._half is not None and store._half.synced(store.index)
