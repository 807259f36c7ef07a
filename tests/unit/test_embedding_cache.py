"""Document vectors cached by model and text (``cached_embeddings``): reused across
processes and retrievers, separate per model, and described by the model they cache."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from langchain_core.documents import Document
from langchain_core.vectorstores import InMemoryVectorStore

from helpers import HashingEmbeddings
from langchain_rse import RSERetriever, cached_embeddings
from langchain_rse.embeddings import VectorCache, cache_size, model_namespace


class Counting(HashingEmbeddings):
    """Counts the texts it embeds."""

    model_name = "hashing-256"

    def __init__(self, dim: int = 256) -> None:
        super().__init__(dim)
        self.texts = 0

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        self.texts += len(texts)
        return super().embed_documents(texts)


def test_vectors_are_reused_and_kept_per_model(tmp_path: Path) -> None:
    texts = [f"clause {i} about delivery" for i in range(10)]
    first = Counting()
    vectors = cached_embeddings(first, tmp_path, batch_size=4).embed_documents(texts)
    assert first.texts == 10 and len(vectors) == 10
    again = Counting()  # a new process would see the same files
    assert cached_embeddings(again, tmp_path).embed_documents(texts + ["new"]) == [
        *vectors,
        again._embed("new"),
    ]
    assert again.texts == 1  # only the new text
    store = VectorCache(tmp_path)
    assert cache_size(store, again) == 11
    other = HashingEmbeddings(dim=64)  # another model never gets these vectors
    assert model_namespace(other) != model_namespace(again)
    assert len(cached_embeddings(other, store).embed_documents(texts[:1])[0]) == 64
    assert cache_size(store, other) == 1 and store.count() == 12
    with pytest.raises(ValueError, match="batch_size"):
        cached_embeddings(first, tmp_path, batch_size=0)


def test_saved_index_names_the_cached_model(tmp_path: Path) -> None:
    model = Counting()
    emb = cached_embeddings(model, tmp_path / "cache")
    r = RSERetriever(vectorstore=InMemoryVectorStore(emb), show_progress=False)
    r.add_documents([Document("The tenant may terminate with three months notice.", id="a")])
    r.save(tmp_path / "idx")
    manifest = json.loads((tmp_path / "idx" / "rse_index.json").read_text())
    assert manifest["embedding"] == {"class": "Counting", "model": "hashing-256"}
    loaded = RSERetriever.load(tmp_path / "idx", embedding=Counting())
    assert loaded.invoke("terminate notice")[0].metadata["doc_id"] == "a"


def test_the_default_cache_is_outside_the_index(tmp_path: Path, monkeypatch) -> None:
    """``cached_embeddings(model)`` keeps its vectors in one file in the user's cache
    folder (``LANGCHAIN_RSE_CACHE_DIR`` here), not in a saved index; copying the index
    copies no vector; ``clear`` drops them."""
    monkeypatch.setenv("LANGCHAIN_RSE_CACHE_DIR", str(tmp_path / "user-cache"))
    model = Counting()
    emb = cached_embeddings(model)
    assert emb.store.path == tmp_path / "user-cache" / "embeddings.sqlite3"
    r = RSERetriever(vectorstore=InMemoryVectorStore(emb), show_progress=False)
    r.add_documents([Document("The tenant may terminate with three months notice.", id="a")])
    r.save(tmp_path / "idx")
    assert [p.parent for p in tmp_path.rglob("*.sqlite3")] == [tmp_path / "user-cache"]
    assert {p.suffix for p in (tmp_path / "idx").iterdir()} == {".json", ".jsonl", ".npz", ".lock"}
    assert cache_size(VectorCache(), model) == 1
    assert VectorCache().clear() == 1 and VectorCache().count() == 0


def test_vectors_are_stored_compactly_and_exactly(tmp_path: Path) -> None:
    """A 384-dimension float32 vector (what the bundled model gives) takes under 2.5 KB;
    values float32 cannot hold are kept as float64, so every vector comes back exact."""
    import numpy as np

    rng = np.random.default_rng(7)
    cache = VectorCache(tmp_path)
    single = rng.standard_normal((600, 384)).astype(np.float32).astype(np.float64).tolist()
    keys = [f"LocalEmbeddings-multilingual-e5-small/{i:064x}" for i in range(600)]
    for start in range(0, 600, 64):  # as the command writes them: a batch at a time
        cache.put(list(zip(keys, single))[start : start + 64])
    assert cache.get(keys) == single
    cache.checkpoint()
    assert cache.path.stat().st_size / 600 < 2560, cache.path.stat().st_size / 600  # JSON: 8 KB
    double = [[0.1, 1e-300, 1 / 3], [1.0, 2.0, 3.0]]
    cache.put([("d/0", double[0]), ("d/1", double[1])])
    assert VectorCache(cache.path).get(["d/0", "missing", "d/1"]) == [double[0], None, double[1]]


def test_the_cache_is_shared_by_threads_and_survives_pickling(tmp_path: Path) -> None:
    import pickle
    from concurrent.futures import ThreadPoolExecutor

    emb = cached_embeddings(Counting(), tmp_path / "c.sqlite3", batch_size=3)
    texts = [[f"clause {t}-{i}" for i in range(10)] for t in range(4)]
    with ThreadPoolExecutor(4) as pool:
        vectors = list(pool.map(emb.embed_documents, texts))
    again = pickle.loads(pickle.dumps(emb))
    assert again.store.path == tmp_path / "c.sqlite3"
    assert [again.embed_documents(t) for t in texts] == vectors
    assert again.underlying_embeddings.texts == 40  # (the copy's counter: nothing new)


def test_threads_opening_a_new_cache_together_all_get_it(tmp_path: Path) -> None:
    """Eight threads open one new cache file at the same moment; each reads and writes.
    (Once seen failing with "database is locked" in the switch to WAL, in a full run on a
    loaded machine; not reproduced since, so opening is serialized in the process and
    retried across processes.)"""
    import threading

    for round_ in range(15):
        cache = VectorCache(tmp_path / f"c{round_}.sqlite3")
        start = threading.Barrier(8)
        errors: list[BaseException] = []

        def use(
            i: int,
            cache: VectorCache = cache,
            start: threading.Barrier = start,
            errors: list[BaseException] = errors,
        ) -> None:
            try:
                start.wait()
                cache.put([(f"k{i}", [float(i)] * 4)])
                assert cache.get([f"k{i}"]) == [[float(i)] * 4]
            except BaseException as exc:  # noqa: BLE001 - collected for the assert below
                errors.append(exc)

        threads = [threading.Thread(target=use, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        assert cache.count() == 8
