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
from langchain_rse.embeddings import cache_size, model_namespace
from langchain_rse.indexing.recordstore import FileByteStore


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
    store = FileByteStore(tmp_path)
    assert cache_size(store, again) == 11
    other = HashingEmbeddings(dim=64)  # another model never gets these vectors
    assert model_namespace(other) != model_namespace(again)
    assert len(cached_embeddings(other, store).embed_documents(texts[:1])[0]) == 64
    assert all(
        p.name.startswith(("Counting-hashing-256", "HashingEmbeddings")) for p in tmp_path.iterdir()
    )
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
