"""The record store's decoded-body cache: keyed by document version, so it can never serve
another version's text, and a body that vanished before it was cached is a stale read."""

from __future__ import annotations

import json
from typing import Any

import pytest
from langchain_core.documents import Document
from langchain_core.stores import InMemoryByteStore
from pydantic import ValidationError

from helpers import HashingEmbeddings, make_contract
from langchain_rse import RSERetriever
from langchain_rse.enrichment import ChunkContext
from langchain_rse.indexing.records import (
    Contexts,
    DocBody,
    Pointer,
    Spans,
    StaleRead,
    body_key,
    compressed,
    decompressed,
    json_bytes,
    local_form,
    plain_form,
)
from langchain_rse.indexing.recordstore import RecordStore
from langchain_rse.persistence import default_vectorstore


class CountingStore(InMemoryByteStore):
    """An in-memory byte store that counts the keys each ``mget`` asks for."""

    def __init__(self) -> None:
        super().__init__()
        self.asked: list[str] = []

    def mget(self, keys: Any) -> Any:
        self.asked.extend(keys)
        return super().mget(keys)


def record(version: str, text: str) -> tuple[Pointer, DocBody]:
    pointer = Pointer(doc_id="d", version=version, metadata={}, spans=[(0, len(text))])
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
    assert all(
        old[d.metadata["start_index"] : d.metadata["end_index"]] == d.page_content
        for d in r.invoke("termination notice")
    )
    new = make_contract("supply renewed", ["termination", "warranty"])
    r.add_documents([Document(new, id="c")])
    for found in (r.invoke("termination notice"), await r.ainvoke("termination notice")):
        assert found
        for d in found:
            assert new[d.metadata["start_index"] : d.metadata["end_index"]] == d.page_content


async def test_an_in_process_store_keeps_bodies_compressed_and_reads_both_forms(
    tmp_path: Any,
) -> None:
    """The default in-memory record store holds each body compressed (smaller than its
    JSON); results are still exact slices, sync and async; a save writes plain JSON and a
    load compresses again; a body written as plain JSON (by a shared store) still reads."""
    r = RSERetriever(vectorstore=default_vectorstore(HashingEmbeddings()), k=2)
    text = make_contract("supply", ["termination", "payment", "warranty", "notices"])
    r.add_documents([Document(text, id="c")])
    store = r.record_store.store  # type: ignore[attr-defined]
    (key,) = [k for k in store if k.startswith("body/")]
    plain = DocBody.from_bytes(store[key]).to_bytes()
    assert store[key][:1] != b"{" and len(store[key]) < len(plain) / 2
    for found in (r.invoke("termination notice"), await r.ainvoke("termination notice")):
        assert found and all(
            text[d.metadata["start_index"] : d.metadata["end_index"]] == d.page_content
            for d in found
        )
    r.save(tmp_path / "index")
    saved = (tmp_path / "index").rglob("record_store*")
    assert any(b'{\\"text\\"' in p.read_bytes() or b'{"text"' in p.read_bytes() for p in saved)
    loaded = RSERetriever.load(tmp_path / "index", HashingEmbeddings())
    assert loaded.record_store.store[key] == store[key]  # type: ignore[attr-defined]
    want = [d.page_content for d in r.invoke("payment terms")]
    assert [d.page_content for d in loaded.invoke("payment terms")] == want

    shared = RecordStore(InMemoryByteStore())  # compress=False: what a shared store gets
    pointer, body = record("v1", "plain text body")
    shared.put([(body_key("d", "v1"), body)])
    raw = shared.store.mget([body_key("d", "v1")])[0]
    assert raw is not None and raw.startswith(b"{")
    assert shared.bodies([pointer])[0].text == "plain text body"


def test_spans_are_a_compact_sequence_of_pairs() -> None:
    """A pointer keeps its spans flat (16 bytes a chunk) and reads like a list of pairs;
    its JSON stays the flat list every version writes and reads."""
    spans = [(0, 5), (5, 12), (12, 40)]
    pointer = Pointer(doc_id="d", version="v", metadata={}, spans=spans)
    assert isinstance(pointer.spans, Spans) and len(pointer.spans) == 3
    assert pointer.spans[1] == (5, 12) and pointer.spans[-1] == (12, 40)
    assert (
        list(pointer.spans) == spans and pointer.spans == spans and pointer.spans[:2] == spans[:2]
    )
    with pytest.raises(IndexError):
        pointer.spans[3]
    assert b'"spans":[0,5,5,12,12,40]' in pointer.to_bytes()
    again = Pointer.from_bytes(pointer.to_bytes())
    assert again == pointer and hash(again.spans) == hash(pointer.spans)
    assert Pointer(doc_id="d", version="v", metadata={}, spans=[0, 5, 5, 12, 12, 40]) == pointer
    with pytest.raises(ValueError):
        Spans([0, 5, 7])


def test_body_contexts_round_trip_and_are_built_when_read() -> None:
    contexts = [ChunkContext("Title: A", "header"), ChunkContext("", "none")]
    body = DocBody(text="ab", contexts=contexts)
    forms = (body.to_bytes(), local_form(body_key("d", "v"), body.to_bytes()), body.local_bytes())
    for raw in forms:
        read = DocBody.from_bytes(raw)
        assert read == body and isinstance(read.contexts, Contexts)
        assert read.contexts.pairs == [["Title: A", "header"], ["", "none"]]  # as stored
        assert read.contexts[0] == contexts[0] and list(read.contexts) == contexts
        assert read.contexts[-1:] == contexts[1:]
    assert json.loads(body.to_bytes())["contexts"] == [["Title: A", "header"], ["", "none"]]


def test_the_in_process_body_form_is_compressed_json_and_saves_as_plain_json() -> None:
    """The in-process form: the body's JSON compressed (any code point round-trips); a save
    turns it back into the plain JSON."""
    text = "Vertrag \u00fcber \u20ac 5 \U0001f4c4 end"
    body = DocBody(text=text, contexts=[ChunkContext("Titel: \u00e9", "header")])
    raw = body.local_bytes()
    assert raw[:1] != b"{" and decompressed(raw) == body.to_bytes()
    assert DocBody.from_bytes(raw) == body
    assert json_bytes(raw) == body.to_bytes() == plain_form(body_key("d", "v"), raw)


def test_a_compressed_record_round_trips_and_other_bytes_are_refused() -> None:
    """The compressed form starts with its own marker byte, whatever the text's length:
    JSON bodies are told apart from it, and bytes that are neither, or a
    damaged block, are a ValueError that says so, never a wrong text."""
    for text in ["", "{", "x" * 123, "\u00e9t\u00e9 " * 5000]:  # sizes whose low byte is "{"
        raw = text.encode("utf-8")
        assert decompressed(compressed(raw)) == raw and compressed(raw)[:1] == b"\x04"
    with pytest.raises(ValueError, match="not a compressed record"):
        decompressed(b"\x28\xb5\x2f\xfd a Zstandard frame")
    damaged = compressed(b"abc" * 1000)[:-5]
    with pytest.raises(ValueError, match="does not decompress"):
        decompressed(damaged)
    with pytest.raises(ValueError, match="Invalid JSON"):  # neither compressed nor JSON
        DocBody.from_bytes(b"\x28\xb5\x2f\xfd")


@pytest.mark.parametrize(
    "contexts", [[["only text"]], [["text", 1]], ["text"], [["a", "b", "c"]], [None]]
)
def test_a_malformed_stored_context_is_a_clear_error(contexts: list[Any]) -> None:
    raw = json.dumps({"text": "ab", "contexts": contexts}).encode()
    with pytest.raises(ValidationError, match=r"\[text, method\] pair of strings"):
        DocBody.from_bytes(raw)


def test_a_pointer_is_read_back_or_refused_with_a_reason() -> None:
    """Pointers are parsed by pydantic's JSON parser; what it rejects is read again to say
    why: another record format, a value of the wrong type, or bytes that are not JSON."""
    pointer = Pointer(
        doc_id="d",
        version="v1",
        metadata={"title": "caf\u00e9 \u6587", "n": 2},
        spans=[(0, 5), (5, 9)],
        fallbacks=1,
    )
    raw = pointer.to_bytes()
    again = Pointer.from_bytes(raw)
    assert again == pointer and list(again.spans) == [(0, 5), (5, 9)]
    data = json.loads(raw)
    with pytest.raises(ValueError, match="has format 99; this version of langchain-rse reads"):
        Pointer.from_bytes(json.dumps({**data, "format": 99}).encode())
    with pytest.raises(ValueError, match="has format None"):
        Pointer.from_bytes(json.dumps({k: v for k, v in data.items() if k != "format"}).encode())
    with pytest.raises(ValueError, match="has format None"):
        Pointer.from_bytes(b"[1, 2]")
    with pytest.raises(ValidationError, match="spans"):
        Pointer.from_bytes(json.dumps({**data, "spans": [1, 2, 3]}).encode())
    with pytest.raises(json.JSONDecodeError):
        Pointer.from_bytes(b"not json")
    with pytest.raises(ValueError):  # not UTF-8 either
        Pointer.from_bytes(b"\x28\xb5\x2f\xfd not json")
