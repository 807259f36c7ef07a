"""Chunk offsets are exact: source[start:end] == chunk text, whatever the text."""

from __future__ import annotations

import pytest
from langchain_core.documents import Document
from langchain_text_splitters import CharacterTextSplitter, RecursiveCharacterTextSplitter

from langchain_rse.indexing.chunking import doc_id_for, make_splitter, split_text
from langchain_rse.indexing.records import chunk_key, chunk_uuid, parse_chunk_key


def assert_exact(text: str, chunks: list) -> None:
    assert chunks, "expected at least one chunk"
    for n, c in enumerate(chunks):
        assert c.chunk_index == n
        assert text[c.start_index : c.end_index] == c.text
    spans = [(c.start_index, c.end_index) for c in chunks]
    assert spans == sorted(set(spans))  # source order, no duplicates


TEXTS = {
    "repeated": ("The same sentence repeats here. " * 200),
    "cjk_emoji": ("東京都は日本の首都です。🙂🚀 Combining: e\u0301 n\u0303 " * 120),
    "crlf": ("Line one of the clause.\r\nLine two follows.\r\n\r\nNew paragraph here.\r\n" * 80),
    "odd_whitespace": ("word \t\t  word\n\n\n\n   word\u00a0word\u2003 " * 150),
    "one_long_token": "x" * 5000,
}


@pytest.mark.parametrize("name", sorted(TEXTS))
@pytest.mark.parametrize("overlap", [0, 50, 199])
def test_offsets_exact(name: str, overlap: int) -> None:
    text = TEXTS[name]
    chunks = split_text(text, "d", make_splitter(chunk_size=200, chunk_overlap=overlap))
    assert_exact(text, chunks)
    assert all(len(c.text) <= 200 for c in chunks)


def test_no_overlap_covers_all_non_whitespace() -> None:
    text = TEXTS["crlf"]
    chunks = split_text(text, "d", make_splitter(chunk_size=120))
    covered = set()
    for c in chunks:
        covered.update(range(c.start_index, c.end_index))
    missing = [i for i in range(len(text)) if i not in covered]
    assert all(text[i].isspace() for i in missing)


def test_overlapping_chunks_really_overlap_and_stay_exact() -> None:
    text = " ".join(f"w{i}" for i in range(3000))
    chunks = split_text(text, "d", make_splitter(chunk_size=100, chunk_overlap=40))
    assert_exact(text, chunks)
    assert any(b.start_index < a.end_index for a, b in zip(chunks, chunks[1:]))


def test_other_splitter_is_located_exactly() -> None:
    text = "para one\n\npara two is here\n\npara one\n\npara three" * 20
    splitter = CharacterTextSplitter(separator="\n\n", chunk_size=30, chunk_overlap=10)
    assert_exact(text, split_text(text, "d", splitter))


def test_empty_and_whitespace_give_no_chunks() -> None:
    assert split_text("", "d") == []
    assert split_text(" \n\t\r\n ", "d") == []


@pytest.mark.parametrize(("size", "overlap"), [(0, 0), (-5, 0), (100, 100), (100, 150), (10, -1)])
def test_bad_splitter_config(size: int, overlap: int) -> None:
    with pytest.raises(ValueError, match="chunk_"):
        make_splitter(size, overlap)


def test_doc_id_rules() -> None:
    assert doc_id_for(Document("x", id="given", metadata={"source": "s"})) == "given"
    assert doc_id_for(Document("x", metadata={"source": "a/b.txt"})) == "a/b.txt"
    hashed = doc_id_for(Document("x"))
    assert hashed.startswith("sha256:") and hashed == doc_id_for(Document("x"))
    assert hashed != doc_id_for(Document("y"))


def test_chunk_keys_round_trip_any_doc_id() -> None:
    for doc_id in ["plain", "with\x1fsep", "路径/文件.txt", ""]:
        key = chunk_key(doc_id, "v1", 7)
        assert parse_chunk_key(key) == (doc_id, "v1", 7)
    assert chunk_uuid(chunk_key("a", "v", 1)) != chunk_uuid(chunk_key("a", "v", 2))


# Regression (issue 14, bug 5): with overlap counted in words or tokens, chunks of text with
# repeated boilerplate were placed at later occurrences: text was never indexed and chunk
# order stopped following the text.

_BOILER = "This section is subject to the terms and conditions set out in the Agreement."
_WORDS = ["alpha", "beta", "gamma", "delta", "notice", "party", "term", "fee"]


def _boilerplate_text() -> str:
    import random

    rng = random.Random(0)
    paras = []
    for i in range(60):
        words = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(5, 30)))
        paras.append(f"{i}. {words}. {_BOILER}")
    return "\n\n".join(paras)


def _count_words(text: str) -> int:
    return len(text.split())


def _count_tokens(text: str) -> int:  # a tokenizer-like count: words and punctuation marks
    import re

    return len(re.findall(r"\w+|[^\w\s]", text))


@pytest.mark.parametrize(
    ("unit", "splitter"),
    [
        ("chars", RecursiveCharacterTextSplitter(chunk_size=200, chunk_overlap=60)),
        (
            "words",
            RecursiveCharacterTextSplitter(
                chunk_size=40, chunk_overlap=15, length_function=_count_words
            ),
        ),
        (
            "tokens",
            RecursiveCharacterTextSplitter(
                chunk_size=50, chunk_overlap=20, length_function=_count_tokens
            ),
        ),
    ],
)
def test_chunks_follow_the_text_and_cover_it_with_any_overlap_unit(unit, splitter) -> None:
    text = _boilerplate_text()
    chunks = split_text(text, "d", splitter)
    assert_exact(text, chunks)
    # chunk order is the splitter's order (RSE's adjacency), and starts increase
    assert [c.text for c in chunks] == [p for p in splitter.split_text(text) if p.strip()]
    assert all(a.start_index < b.start_index for a, b in zip(chunks, chunks[1:]))
    covered = bytearray(len(text))
    for c in chunks:
        covered[c.start_index : c.end_index] = b"\x01" * (c.end_index - c.start_index)
    missing = [i for i, ch in enumerate(text) if not ch.isspace() and not covered[i]]
    assert missing == [], f"{len(missing)} non-space characters never indexed ({unit})"
