"""The record store's decoded-body cache: keyed by document version, so it can never serve
another version's text, and a body that vanished before it was cached is a stale read."""

from __future__ import annotations

from typing import Any

import pytest
from langchain_core.documents import Document
from langchain_core.stores import InMemoryByteStore

from helpers import HashingEmbeddings, make_contract
from langchain_rse import RSERetriever
from langchain_rse.enrichment import ChunkContext
from langchain_rse.persistence import default_vectorstore
from langchain_rse.records import DocBody, DocRecord, RecordStore, StaleRead, body_key


class CountingStore(InMemoryByteStore):
    """An in-memory byte store that counts the keys each ``mget`` asks for."""

    def __init__(self) -> None:
        super().__init__()
        self.asked: list[str] = []

    def mget(self, keys: Any) -> Any:
        self.asked.extend(keys)
        return super().mget(keys)


def record(version: str, text: str) -> tuple[DocRecord, DocBody]:
    pointer = DocRecord(doc_id="d", version=version, metadata={}, spans=[(0, len(text))])
    return pointer, DocBody(text=text, contexts=[ChunkContext("", "none")])


def test_a_body_is_read_and_decoded_once_per_version() -> None:
    store = CountingStore()
    records = RecordStore(store)
    v1, body1 = record("v1", "first version")
    v2, body2 = record("v2", "second version")
    records.put([(body_key("d", "v1"), body1), (body_key("d", "v2"), body2)])
    assert records.bodies([v1])[0].text == "first version"
    assert records.bodies([v1])[0].text == "first version"
    assert store.asked.count(body_key("d", "v1")) == 1  # the second read came from the cache
    assert records.bodies([v2, v1])[0].text == "second version"  # another version: read
    assert store.asked.count(body_key("d", "v2")) == 1


async def test_a_missing_uncached_body_is_a_stale_read() -> None:
    records = RecordStore(InMemoryByteStore())
    pointer, _ = record("v1", "gone")
    with pytest.raises(StaleRead):
        records.bodies([pointer])
    with pytest.raises(StaleRead):
        await records.abodies([pointer])


async def test_replaced_documents_return_their_new_text() -> None:
    """Through the retriever: after a replace, sync and async queries cut the new text."""
    r = RSERetriever(vectorstore=default_vectorstore(HashingEmbeddings()), k=2)
    old = make_contract("supply", ["termination", "payment"])
    r.add_documents([Document(old, id="c")])
    assert all(old[d.metadata["start_index"] : d.metadata["end_index"]] == d.page_content
               for d in r.invoke("termination notice"))  # fmt: skip
    new = make_contract("supply renewed", ["termination", "warranty"])
    r.add_documents([Document(new, id="c")])
    for found in (r.invoke("termination notice"), await r.ainvoke("termination notice")):
        assert found
        for d in found:
            assert new[d.metadata["start_index"] : d.metadata["end_index"]] == d.page_content
