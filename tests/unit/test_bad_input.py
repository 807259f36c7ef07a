"""The bad-input matrix: every bad input gets a clear error or a defined behaviour.

Each row names the input, what must happen, and (for errors) words the message must contain.
Nothing is half-written: after a rejected ``add_documents`` the index is unchanged.
"""

from __future__ import annotations

from typing import Any

import pytest
from langchain_core.documents import Document
from langchain_core.vectorstores import InMemoryVectorStore

from conftest import corpus_documents
from helpers import HashingEmbeddings
from langchain_rse import RSERetriever


@pytest.fixture(scope="module")
def indexed() -> RSERetriever:
    r = RSERetriever(vectorstore=InMemoryVectorStore(HashingEmbeddings()), k=3)
    r.add_documents(corpus_documents())
    return r


# --------------------------------------------------------------------------- queries

QUERY_ERRORS: list[tuple[str, Any, type[Exception], str]] = [
    ("empty", "", ValueError, "non-empty"),
    ("whitespace", " \t\n ", ValueError, "non-empty"),
    ("only control characters", "\x00\x07\x1b", ValueError, "non-empty"),
    ("None", None, TypeError, "query must be a string"),
    ("bytes", b"termination", TypeError, "query must be a string"),
    ("number", 42, TypeError, "query must be a string"),
    ("list", ["termination"], TypeError, "query must be a string"),
    ("1 MB", "termination " * 90_000, ValueError, "max_query_chars"),
]


@pytest.mark.parametrize(
    ("name", "query", "error", "words"), QUERY_ERRORS, ids=[row[0] for row in QUERY_ERRORS]
)
def test_bad_queries_raise_clearly(indexed, name, query, error, words) -> None:
    with pytest.raises(error, match=words):
        indexed._get_relevant_documents(query, run_manager=None)  # type: ignore[arg-type]


async def test_bad_queries_raise_clearly_async(indexed) -> None:
    with pytest.raises(ValueError, match="non-empty"):
        await indexed.ainvoke("   ")


def test_control_characters_in_a_query_are_treated_as_spaces(indexed) -> None:
    clean = indexed.invoke("termination provisions")
    dirty = indexed.invoke("termination\x00\x07 provisions\x1b")
    assert [d.metadata for d in dirty] == [d.metadata for d in clean]


def test_lone_surrogates_in_a_query_do_not_crash(indexed) -> None:
    assert isinstance(indexed.invoke("termination \ud800 provisions"), list)


@pytest.mark.parametrize("k", [-1, 1.5, "3", True])
def test_bad_k_in_invoke(indexed, k) -> None:
    with pytest.raises(ValueError, match="k must be a non-negative integer"):
        indexed.invoke("termination", k=k)


# --------------------------------------------------------------------------- documents


def fresh() -> RSERetriever:
    return RSERetriever(vectorstore=InMemoryVectorStore(HashingEmbeddings()), k=3)


BINARY = bytes(range(256)).decode("latin-1") * 40
REPLACED = (b"\xff\xfe\x00\x01garbage" * 500).decode("utf-8", errors="replace")

DOC_ERRORS: list[tuple[str, list[Document], type[Exception], str]] = [
    ("binary decoded as latin-1", [Document(BINARY, id="bin")], ValueError, "binary"),
    ("binary decoded with replace", [Document(REPLACED, id="rep")], ValueError, "binary"),
    ("50 MB", [Document("word " * 10_000_000, id="huge")], ValueError, "max_document_chars"),
    ("duplicate ids", [Document("a", id="x"), Document("b", id="x")], ValueError, "duplicate"),
    ("metadata not JSON", [Document("a", metadata={"when": object()})], TypeError, "JSON"),
    ("metadata set", [Document("a", metadata={"tags": {1, 2}})], TypeError, "JSON"),
]


@pytest.mark.parametrize(
    ("name", "docs", "error", "words"), DOC_ERRORS, ids=[row[0] for row in DOC_ERRORS]
)
def test_bad_documents_raise_and_write_nothing(name, docs, error, words) -> None:
    r = fresh()
    r.add_documents([Document("an existing document about payment terms", id="keep")])
    before = (len(r.index.lexical), sorted(r.record_store.yield_keys()), len(r.vectorstore.store))
    with pytest.raises(error, match=words):
        r.add_documents([Document("good text that would be lost", id="good"), *docs])
    assert (
        len(r.index.lexical),
        sorted(r.record_store.yield_keys()),
        len(r.vectorstore.store),
    ) == before


@pytest.mark.parametrize("bad", ["a string", Document("one document"), [None], [b"bytes"]])
def test_add_documents_wants_a_list_of_documents(bad) -> None:
    with pytest.raises(TypeError, match="Document"):
        fresh().add_documents(bad)


@pytest.mark.parametrize("text", ["", "   ", "\n\r\n\t"])
def test_empty_documents_are_skipped_with_a_warning(text, caplog) -> None:
    r = fresh()
    with caplog.at_level("WARNING"):
        ids = r.add_documents([Document(text, id="empty"), Document("real words", id="real")])
    assert ids == ["empty", "real"]
    assert "has no text" in caplog.text
    assert r.get(["empty"]) == [] and r.get(["real"])[0].page_content == "real words"


def test_a_replaced_document_that_became_empty_is_removed() -> None:
    r = fresh()
    r.add_documents([Document("payment terms apply", id="d")])
    r.add_documents([Document("   ", id="d")])
    assert r.get(["d"]) == [] and len(r.index.lexical) == 0


def test_a_two_megabyte_document_is_indexed_exactly() -> None:
    text = "".join(
        f"Clause {i}. The supplier shall deliver item {i} on time.\n" for i in range(40_000)
    )[:2_000_000]
    # every chunk says the same words, so hashing embeddings cannot rank; lean on BM25
    r = RSERetriever(vectorstore=InMemoryVectorStore(HashingEmbeddings()), weights=(0.2, 1.0))
    r.add_documents([Document(text, id="big")])
    for seg in r.invoke("deliver item 31337", k=3):
        assert seg.page_content == text[seg.metadata["start_index"] : seg.metadata["end_index"]]
    top = r.invoke("deliver item 31337", k=1, mode="chunks")[0]
    assert "item 31337" in top.page_content


def test_delete_rejects_a_bare_string_and_none() -> None:
    r = fresh()
    with pytest.raises(TypeError, match="not a string"):
        r.delete("doc-id")
    with pytest.raises(ValueError, match="list of document ids"):
        r.delete(None)
    assert r.delete(["unknown"]) == {"num_deleted": 0, "succeeded": [], "failed": []}


# --------------------------------------------------------------------------- configuration

CONFIG_ERRORS: list[tuple[str, dict[str, Any], str]] = [
    ("negative k", {"k": -1}, "k must be"),
    ("zero chunk size", {"chunk_size": 0}, "chunk_size"),
    ("overlap equal to size", {"chunk_size": 100, "chunk_overlap": 100}, "chunk_overlap"),
    ("overlap above size", {"chunk_size": 100, "chunk_overlap": 150}, "chunk_overlap"),
    ("unknown preset", {"rse_params": "fastest"}, "unknown RSE preset"),
    ("zero weights", {"weights": (0.0, 0.0)}, "weights"),
    ("zero fetch_k", {"fetch_k": 0}, "fetch_k"),
    ("unknown mode", {"mode": "paragraphs"}, "mode"),
    ("misspelt setting", {"fetchk": 10}, "fetchk"),
    ("router that is not a retriever", {"router": "orion"}, "router"),
]


@pytest.mark.parametrize(
    ("name", "kwargs", "words"), CONFIG_ERRORS, ids=[row[0] for row in CONFIG_ERRORS]
)
def test_bad_configuration(name, kwargs, words) -> None:
    with pytest.raises(ValueError, match=words):
        RSERetriever(vectorstore=InMemoryVectorStore(HashingEmbeddings()), **kwargs)
