"""Writes that race or repeat (issue 54): a tenant's add re-checks who owns an id inside
the write (item 1), ``delete`` of an id named twice (item 12), and a query during a
replace (item 15)."""

from __future__ import annotations

import asyncio
import threading
import uuid
from typing import Any

import pytest
from langchain_core.documents import Document
from langchain_core.stores import InMemoryByteStore
from langchain_core.vectorstores import InMemoryVectorStore

from helpers import HashingEmbeddings
from langchain_rse import NoEnricher, RSERetriever

# ---------------------------------------------------------------- 12: delete(["a", "a"])


def _two_documents(vectorstore: Any) -> RSERetriever:
    r = RSERetriever(
        vectorstore=vectorstore, enricher=NoEnricher(), chunk_size=200, show_progress=False
    )
    r.add_documents(
        [Document("alpha beta gamma " * 30, id="a"), Document("delta epsilon " * 30, id="b")]
    )
    return r


def test_an_id_named_twice_is_deleted_once() -> None:
    r = _two_documents(InMemoryVectorStore(HashingEmbeddings()))
    response = r.delete(["a", "a"])
    assert response["num_deleted"] == 1 and response["succeeded"] == ["a"]
    assert [d.id for d in r.get(["a", "b"])] == ["b"]


def test_an_id_named_twice_is_deleted_from_chroma() -> None:
    """Chroma refuses a delete that names a chunk twice: nothing may be left half-done."""
    chroma = pytest.importorskip("langchain_chroma")
    vs = chroma.Chroma(
        collection_name=f"dup-{uuid.uuid4().hex[:8]}", embedding_function=HashingEmbeddings()
    )
    r = _two_documents(vs)
    held = len(vs.get()["ids"])
    response = r.delete(["a", "a"])
    assert response["num_deleted"] == 1
    assert [d.id for d in r.get(["a", "b"])] == ["b"]
    left = {m["doc_id"] for m in vs.get()["metadatas"]}
    assert left == {"b"} and len(vs.get()["ids"]) < held
    assert r.vacuum() == 0  # nothing left behind
