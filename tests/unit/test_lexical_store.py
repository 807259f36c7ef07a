"""The lexical branch can be an external store instead of the in-process BM25 index.

``KeywordStore`` is a minimal ``VectorStore`` whose search is BM25, the shape of
``ElasticsearchStore(strategy=BM25Strategy())``: the retriever writes chunks to it and
searches it, and replacements and deletions reach it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pytest
from langchain_core.documents import Document
from langchain_core.embeddings import Embeddings
from langchain_core.vectorstores import InMemoryVectorStore, VectorStore

from conftest import corpus_documents
from helpers import HashingEmbeddings, make_contract
from langchain_rse import RSERetriever
from langchain_rse.lexical import BM25Index


class KeywordStore(VectorStore):
    def __init__(self) -> None:
        self.index = BM25Index()
        self.docs: dict[str, Document] = {}
        self.searches = 0

    def add_texts(
        self,
        texts: Iterable[str],
        metadatas: list[dict] | None = None,
        *,
        ids: list[str] | None = None,
        **kwargs: Any,
    ) -> list[str]:
        texts = list(texts)
        ids = list(ids or [str(i) for i in range(len(self.docs), len(self.docs) + len(texts))])
        for i, text, meta in zip(ids, texts, metadatas or [{}] * len(texts)):
            self.docs[i] = Document(text, metadata=meta, id=i)
        self.index.add(ids, texts)
        return ids

    def delete(self, ids: list[str] | None = None, **kwargs: Any) -> bool:
        for i in ids or []:
            self.docs.pop(i, None)
        self.index.delete(ids or [])
        return True

    def similarity_search_with_score(self, query: str, k: int = 4, **kwargs: Any):
        self.searches += 1
        return [(self.docs[i], score) for i, score in self.index.search(query, k)]

    def similarity_search(self, query: str, k: int = 4, **kwargs: Any) -> list[Document]:
        return [d for d, _ in self.similarity_search_with_score(query, k)]

    @classmethod
    def from_texts(cls, texts: list[str], embedding: Embeddings, metadatas=None, **kwargs: Any):
        store = cls()
        store.add_texts(texts, metadatas)
        return store


@pytest.fixture
def setup() -> tuple[RSERetriever, KeywordStore]:
    store = KeywordStore()
    r = RSERetriever(vectorstore=InMemoryVectorStore(HashingEmbeddings()), lexical_store=store, k=3)
    r.add_documents(corpus_documents())
    return r, store


def test_external_lexical_store_is_written_and_searched(setup) -> None:
    r, store = setup
    assert len(r.index.lexical) == 0 and len(store.docs) == len(r.vectorstore.store)
    out = r.invoke("royalties audit rights", mode="chunks")
    assert store.searches == 1
    assert out[0].metadata["doc_id"] == "gamma.txt"
    assert all(d.metadata["lexical_rank"] is not None for d in out)


def test_replace_and_delete_reach_the_lexical_store(setup) -> None:
    r, store = setup
    r.add_documents(
        [Document(make_contract("gamma", ["escrow"]), metadata={"source": "gamma.txt"})]
    )
    versions = {
        d.metadata["doc_version"]
        for d in store.docs.values()
        if d.metadata["doc_id"] == "gamma.txt"
    }
    assert len(versions) == 1
    r.delete(["gamma.txt"])
    assert all(d.metadata["doc_id"] != "gamma.txt" for d in store.docs.values())


def test_save_needs_the_external_store_again(setup, tmp_path) -> None:
    r, store = setup
    r.save(tmp_path / "idx")
    with pytest.raises(ValueError, match="lexical_store"):
        RSERetriever.load(tmp_path / "idx", embedding=HashingEmbeddings())
    loaded = RSERetriever.load(tmp_path / "idx", embedding=HashingEmbeddings(), lexical_store=store)
    q = "insurance obligations"
    assert [d.metadata for d in loaded.invoke(q)] == [d.metadata for d in r.invoke(q)]
