"""Property tests of what segment extraction promises, through ``RSERetriever.invoke`` on
generated documents (gaps, repeated passages, whitespace runs, unicode, headings) with
varied ``k``, budgets and filters:

* the returned text never exceeds ``max_chars``;
* with ``k`` > 1 and no reranker, the chunk the dense search ranks first comes back (when
  it fits the budget);
* every result is the exact slice ``source[start_index:end_index]``;
* results never overlap;
* no result is under ``min_result_chars`` unless it is its whole document (or holds the
  dense search's first chunk, which may be short when the document is).

Failing inputs found while developing are kept as ``@example`` regressions.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from langchain_core.documents import Document
from langchain_core.embeddings import Embeddings
from langchain_core.vectorstores import InMemoryVectorStore

from helpers import HashingEmbeddings
from langchain_rse import RSERetriever
from langchain_rse.segments import RSEParams, get_preset

WORDS = [
    "boiler",
    "reset",
    "pressure",
    "gauge",
    "kitten",
    "sleep",
    "night",
    "the",
    "and",
    "of",
    "café",
    "naïve",
    "Straße",
    "日本語",
    "🙂",
    "ΣΊΣΥΦΟΣ",
]
ENDS = [". ", "! ", "? ", "; ", " ", "\n", ".\n", "…"]
BREAKS = ["\n\n", "\n", "\n\n\n   \n", "\t\t", "      ", " \u3000 ", "\r\n\r\n"]

sentences = st.builds(
    lambda words, end: " ".join(words) + end,
    st.lists(st.sampled_from(WORDS), min_size=1, max_size=14),
    st.sampled_from(ENDS),
)
paragraphs = st.lists(sentences, min_size=1, max_size=6).map("".join)
headings = st.sampled_from(WORDS).map(
    lambda w: st.sampled_from([f"# {w}\n", f"{w}\n{'=' * len(w)}\n", f"{w.upper()}\n"])
)


@st.composite
def documents(draw: st.DrawFn) -> str:
    """Paragraphs and headings joined by runs of blanks; some passages repeated."""
    parts: list[str] = []
    for _ in range(draw(st.integers(1, 14))):
        if draw(st.booleans()) and draw(st.booleans()):
            parts.append(draw(draw(headings)))
        passage = draw(paragraphs)
        parts.append(passage * draw(st.sampled_from([1, 1, 1, 2, 3])))
        parts.append(draw(st.sampled_from(BREAKS)))
    text = "".join(parts)
    return text if text.strip() else "boiler"


class ArbitraryEmbeddings(Embeddings):
    """A fixed pseudo-random vector per text: the dense ranking has nothing to do with the
    words, so its first chunk is often one that BM25 and RSE would leave out."""

    def _embed(self, text: str) -> list[float]:
        seed = int.from_bytes(hashlib.blake2b(text.encode()).digest()[:8], "little")
        vec = np.random.default_rng(seed).normal(size=16)
        return (vec / np.linalg.norm(vec)).tolist()

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        return [self._embed(t) for t in texts]

    def embed_query(self, text: str) -> list[float]:
        return self._embed(text)


@dataclass(frozen=True)
class Call:
    texts: tuple[str, ...]
    query: str
    k: int
    max_chars: int | None
    group: int | None
    arbitrary: bool = False
    """Dense vectors unrelated to the words (:class:`ArbitraryEmbeddings`)."""


calls = st.builds(
    Call,
    texts=st.lists(documents(), min_size=1, max_size=4).map(tuple),
    query=st.lists(st.sampled_from(WORDS), min_size=1, max_size=4).map(" ".join),
    k=st.integers(1, 8),
    max_chars=st.none() | st.integers(100, 3000),
    group=st.none() | st.sampled_from([0, 1]),
    arbitrary=st.booleans(),
)


def _retriever(call: Call, params: RSEParams | None = None) -> RSERetriever:
    docs = [Document(t, id=f"d{i}", metadata={"group": i % 2}) for i, t in enumerate(call.texts)]
    embeddings = ArbitraryEmbeddings() if call.arbitrary else HashingEmbeddings()
    return RSERetriever.from_documents(
        docs,
        vectorstore=InMemoryVectorStore(embeddings),
        rse_params=params or get_preset("default"),
        show_progress=False,
    )


def _dense_firsts(r: RSERetriever, call: Call) -> list[tuple[str, int, int]]:
    """The chunks the dense search ranks first among those the filter allows (all of
    them when several tie), as ``(doc_id, start, end)``."""
    hits = r.vectorstore.similarity_search_with_score(call.query, k=10_000)
    allowed = [
        (h, score) for h, score in hits if call.group is None or h.metadata["group"] == call.group
    ]
    if not allowed:
        return []
    top = allowed[0][1]
    return [
        (h.metadata["doc_id"], h.metadata["start_index"], h.metadata["end_index"])
        for h, score in allowed
        if np.isclose(score, top, rtol=0, atol=1e-9)
    ]


def check_call(call: Call, params: RSEParams | None = None) -> None:
    r = _retriever(call, params)
    p = r.params
    flt = None if call.group is None else {"group": call.group}
    got = r.invoke(call.query, k=call.k, max_chars=call.max_chars, filter=flt)
    sources = {f"d{i}": t for i, t in enumerate(call.texts)}
    assert len(got) <= call.k
    if call.max_chars is not None:  # the budget is never exceeded
        assert sum(len(d.page_content) for d in got) <= call.max_chars
    ranges: dict[str, list[tuple[int, int]]] = {}
    for d in got:  # exact slices, of allowed documents
        doc_id, a, b = d.metadata["doc_id"], d.metadata["start_index"], d.metadata["end_index"]
        assert d.page_content == sources[doc_id][a:b]
        assert call.group is None or d.metadata["group"] == call.group
        ranges.setdefault(doc_id, []).append((a, b))
    for spans in ranges.values():  # never overlapping
        spans.sort()
        assert all(x[1] <= y[0] for x, y in zip(spans, spans[1:]))
    firsts = _dense_firsts(r, call)
    if p.keep_dense_first and call.k > 1 and firsts:
        fits = call.max_chars is None or min(b - a for _, a, b in firsts) <= call.max_chars
        held = any(
            any(a <= c and e <= b for a, b in ranges.get(doc_id, [])) for doc_id, c, e in firsts
        )
        assert held or not fits, "the dense search's first chunk is missing"
    if p.min_result_chars:  # no fragments
        for d in got:
            doc_id, a, b = d.metadata["doc_id"], d.metadata["start_index"], d.metadata["end_index"]
            whole = sources[doc_id].strip() == d.page_content.strip()
            dense_first = any(f == doc_id and a <= c and e <= b for f, c, e in firsts)
            assert b - a >= p.min_result_chars or whole or dense_first, d.page_content


@settings(max_examples=120)
@given(calls)
def test_segments_keep_their_promises(call: Call) -> None:
    check_call(call)


@settings(max_examples=60)
@given(calls)
def test_the_budget_and_slices_hold_with_every_finishing_step_off(call: Call) -> None:
    """The raw RSE picks (no bridging, snapping or growing) keep the same promises."""
    check_call(
        call,
        get_preset("default").with_overrides(bridge_chunks=0, snap_chars=0, min_result_chars=0),
    )
