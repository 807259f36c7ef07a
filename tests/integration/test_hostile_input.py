"""Hostile input from the wild: markup in metadata (the ``--html`` page), lone surrogates,
NaN and infinity, pathological heading shapes, and mixed-type ``$in`` filters on Chroma.

Each test goes through the public API (the explanation page is opened in a real headless
browser) and fails on the code before its fix (issue 46, items 8, 9, 10, 14 and 16).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
import tracemalloc
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from langchain_core.documents import Document
from langchain_core.vectorstores import InMemoryVectorStore
from servers import chroma_server, redis_server
from test_explain import chromium, headless

from helpers import HashingEmbeddings
from langchain_rse import RSERetriever
from langchain_rse.enrichment import HeaderEnricher
from langchain_rse.filters import FilterError, matches, parse
from langchain_rse.indexing.chunking import Chunk

LONE = json.loads('"\\ud800"')
"""A lone surrogate, as ``json.loads`` hands it over from ``"\\ud800"``."""


def fresh(**kw: Any) -> RSERetriever:
    return RSERetriever(
        vectorstore=InMemoryVectorStore(HashingEmbeddings()), show_progress=False, **kw
    )


def state(r: RSERetriever) -> tuple[Any, ...]:
    """What the retriever holds: lexical index size, record keys, vector count."""
    return len(r.index.lexical), sorted(r.record_store.yield_keys()), len(r.vectorstore.store)


# ------------------------------------------------------------------ 8: XSS in to_html

PAYLOAD = "<img src=x onerror=\"document.title='pwned'\"><b id='injected'>bold</b>"


def test_markup_in_metadata_is_text_in_the_html_page(tmp_path: Path) -> None:
    browser = chromium()
    r = fresh(k=2, chunk_size=120)
    meta = {"source": PAYLOAD, "page_start": PAYLOAD, "page_end": PAYLOAD}
    text = "Termination. Either party may terminate with ninety days notice. " * 3
    r.add_documents([Document(text, metadata=meta, id="x")])
    explanation = r.explain("terminate notice")
    assert explanation.results, "the payload document is returned"
    page = tmp_path / "why.html"
    page.write_text(explanation.to_html(), encoding="utf-8")

    dom = headless(browser, "--dump-dom", page.as_uri())
    assert dom.returncode == 0 and "<mark" in dom.stdout, dom.stderr[-2000:]
    assert "<title>langchain-rse: terminate notice</title>" in dom.stdout  # no script ran
    assert "<img" not in dom.stdout and 'id="injected"' not in dom.stdout  # no new element
    escaped = PAYLOAD.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    assert f"pages {escaped}-{escaped}" in dom.stdout  # shown as the literal text


# ------------------------------------------------------------------ 9: lone surrogates

SURROGATE_DOCS = [
    ("in the text", Document("payment terms " + LONE, id="bad")),
    ("in a metadata value", Document("payment terms", metadata={"note": LONE}, id="bad")),
    ("in a metadata key", Document("payment terms", metadata={LONE: 1}, id="bad")),
    ("nested in metadata", Document("payment", metadata={"a": {"b": ["ok", LONE]}}, id="bad")),
    ("in the id", Document("payment terms", id="bad" + LONE)),
]


@pytest.mark.parametrize(("name", "doc"), SURROGATE_DOCS, ids=[n for n, _ in SURROGATE_DOCS])
def test_a_lone_surrogate_is_rejected_before_any_write(
    name: str, doc: Document, tmp_path: Path
) -> None:
    r = fresh()
    r.add_documents([Document("an existing document about payment terms", id="keep")])
    before = state(r)
    with pytest.raises(ValueError, match="surrogate"):
        r.add_documents([Document("good text that would be lost", id="good"), doc])
    assert state(r) == before
    r.save(tmp_path / "idx")  # the index still saves, and loads with what it held
    loaded = RSERetriever.load(tmp_path / "idx", HashingEmbeddings())
    assert [d.id for d in loaded.get(["keep", "good"])] == ["keep"]


@pytest.fixture(scope="module")
def redis_port(tmp_path_factory) -> Iterator[int]:
    with redis_server(tmp_path_factory.mktemp("redis")) as port:
        yield port


@pytest.mark.integration
def test_a_lone_surrogate_writes_nothing_to_redis(redis_port: int) -> None:
    from langchain_community.storage import RedisStore

    store = RedisStore(redis_url=f"redis://127.0.0.1:{redis_port}", namespace=uuid.uuid4().hex)
    r = RSERetriever(
        vectorstore=InMemoryVectorStore(HashingEmbeddings()),
        record_store=store,
        show_progress=False,
    )
    for doc in (d for _, d in SURROGATE_DOCS):
        with pytest.raises(ValueError, match="surrogate"):
            r.add_documents([Document("good text that would be lost", id="good"), doc])
        assert state(r) == (0, [], 0)


def cli(*argv: str) -> subprocess.CompletedProcess[str]:
    """The command in a subprocess (its stderr writes a surrogate as ``\\udcff``)."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    argv = (sys.executable, "-m", "langchain_rse.cli", *argv)
    return subprocess.run(
        argv, env=env, capture_output=True, text=True, errors="replace", timeout=300
    )


def test_a_file_name_that_is_not_utf8_is_skipped_not_fatal(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "good.txt").write_text("Payment terms are thirty days.\n", encoding="utf-8")
    bad = docs / os.fsdecode(b"bad\xff.txt")  # the name decodes to a lone surrogate
    bad.write_text("Other terms apply here.\n", encoding="utf-8")
    idx = str(tmp_path / "idx")
    done = cli("index", str(docs), "--index", idx, "--no-progress")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "indexed 1 file(s)" in done.stdout and "1 skipped" in done.stdout
    assert "surrogate" in done.stderr
    done = cli("query", idx, "payment terms", "--json")
    assert [s["source"] for s in json.loads(done.stdout)] == [
        "good.txt"
    ]  # relative to the indexed folder


# ------------------------------------------------------------------ 16: NaN and infinity


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, [1.0, math.nan], {"x": math.inf}])
def test_nan_and_infinity_in_metadata_are_rejected(value: Any) -> None:
    r = fresh()
    r.add_documents([Document("an existing document about payment terms", id="keep")])
    before = state(r)
    with pytest.raises(ValueError, match=r"metadata\['score_x'\].*(NaN|infinit)"):
        bad = Document("payment terms", metadata={"score_x": value}, id="bad")
        r.add_documents([Document("good", id="good"), bad])
    assert state(r) == before


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize(
    "make", [lambda v: {"x": v}, lambda v: {"x": {"$gt": v}}, lambda v: {"x": {"$in": [1, v]}}]
)
def test_nan_and_infinity_in_filters_are_rejected(make: Any, value: float) -> None:
    with pytest.raises(FilterError, match="NaN|infinit"):
        parse(make(value))
    r = fresh()
    r.add_documents([Document("payment terms", metadata={"x": 1.0}, id="a")])
    with pytest.raises(FilterError, match="NaN|infinit"):
        r.invoke("payment", filter=make(value))


def test_huge_finite_numbers_round_trip_and_filter() -> None:
    r = fresh()
    r.add_documents([Document("payment terms", metadata={"big": 1.7e308}, id="a")])
    assert r.get(["a"])[0].metadata["big"] == 1.7e308
    assert [d.metadata["doc_id"] for d in r.invoke("payment", filter={"big": {"$gt": 1e308}})] == [
        "a"
    ]


# ------------------------------------------------------------------ 10: header enrichment

HOSTILE_TEXTS = {  # 300,000 characters each (10: a heading candidate every few characters)
    "dotted number": "1." * 150_000,
    "dotted number, no final dot": "1." * 149_999 + "1",
    "section dotted number": "Section " + "1." * 150_000,
    "dotted number then title": "1." * 150_000 + " Term",
    "runs of 1. with spaces": "1. " * 100_000,
    "ARTICLE words": "ARTICLE " * 37_500,
    "hashes": "#" * 300_000,
    "hash heading then blanks": "# a" + " " * 300_000 + "b",
    "hash heading then hashes": "# a " + "# " * 150_000 + "b\n# b",
    "uppercase": "A" * 300_000,
    "uppercase words": "ABC " * 75_000,
}
DENSE_TEXTS = {  # 100,000 characters: linear, but each candidate costs some Python
    "uppercase soft breaks": "ABCD   " * 14_300,
    "one clause number over and over": "4.29 a   4.30   Zed   " * 4_550,
    "one top-level number over and over": "11 a   12.   Zed   " * 5_000,
}


def enrich(text: str) -> list[Any]:
    chunks = [
        Chunk("d", n, i, min(i + 1000, len(text)), text[i : i + 1000])
        for n, i in enumerate(range(0, len(text), 1000))
    ]
    contexts = HeaderEnricher().enrich("d", text, {}, chunks)
    assert len(contexts) == len(chunks)
    return contexts


@pytest.mark.parametrize("text", HOSTILE_TEXTS.values(), ids=HOSTILE_TEXTS)
def test_header_enricher_is_linear_on_hostile_shapes(text: str) -> None:
    began = time.perf_counter()
    enrich(text)
    took = time.perf_counter() - began
    tracemalloc.start()
    try:
        enrich(text)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert took < 1.0, f"{took:.2f} s for {len(text):,} characters"
    assert peak < 64 * len(text), f"peak {peak / 1e6:.0f} MB for {len(text):,} characters"


@pytest.mark.parametrize("text", DENSE_TEXTS.values(), ids=DENSE_TEXTS)
def test_header_enricher_is_linear_on_dense_candidates(text: str) -> None:
    began = time.perf_counter()
    enrich(text)
    took = time.perf_counter() - began
    assert took < 1.0, f"{took:.2f} s for {len(text):,} characters"


def test_deep_but_real_clause_numbers_are_still_headings() -> None:
    text = "1. Scope\n\nText.\n\n1.1.1.1.1 Deep Clause\n\nMore text here about it.\n"
    outline = HeaderEnricher().outline(text, {})
    assert any("1.1.1.1.1 Deep Clause" in c for c in outline.contexts)


# ------------------------------------------------------------------ 14: Chroma $in / $nin

META = [
    {"v": 1},
    {"v": 1.0},
    {"v": 1.5},
    {"v": "1"},
    {"v": True},
    {"v": 2},
    {"other": 3},
    {"v": "x"},
]
MIXED_FILTERS = [
    {"v": {"$in": [1, 1.5]}},
    {"v": {"$in": [1.5, "x", True]}},
    {"v": {"$nin": [1, 1.5]}},
    {"v": {"$nin": ["1", 2, False]}},
    {"$or": [{"v": {"$in": [2, "x"]}}, {"other": 3}]},
    {"$and": [{"v": {"$nin": [1.5, "x"]}}]},
    {"$or": [{"v": {"$in": [1, "1"]}}]},
]


@pytest.fixture(scope="module")
def chroma_client(tmp_path_factory) -> Iterator[Any]:
    import chromadb

    with chroma_server(tmp_path_factory.mktemp("chroma")) as port:
        settings = chromadb.config.Settings(anonymized_telemetry=False)
        yield chromadb.HttpClient(host="127.0.0.1", port=port, settings=settings)


@pytest.mark.integration
@pytest.mark.parametrize("spec", MIXED_FILTERS, ids=[json.dumps(f) for f in MIXED_FILTERS])
def test_mixed_type_in_filters_on_chroma_match_in_memory_semantics(
    chroma_client: Any, spec: Any
) -> None:
    from langchain_chroma import Chroma

    name = f"t{uuid.uuid4().hex[:12]}"
    vs = Chroma(collection_name=name, embedding_function=HashingEmbeddings(), client=chroma_client)
    try:
        r = RSERetriever(vectorstore=vs, show_progress=False, k=20, mode="chunks")
        r.add_documents(
            [
                Document(f"payment terms and invoices, variant {i}", metadata=m, id=f"d{i}")
                for i, m in enumerate(META)
            ]
        )
        expected = {f"d{i}" for i, m in enumerate(META) if matches(parse(spec), m)}
        assert expected, "the filter keeps something"
        got = {d.metadata["doc_id"] for d in r.invoke("payment terms invoices", filter=spec)}
        assert got == expected
    finally:
        chroma_client.delete_collection(name)
