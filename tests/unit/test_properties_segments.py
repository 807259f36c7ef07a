"""Property tests of what segment extraction promises, through ``RSERetriever.invoke`` on
generated documents (gaps, repeated passages, whitespace runs, unicode, headings) with
varied ``k``, budgets and filters:

* the returned text never exceeds ``max_chars``;
* with ``k`` > 1 and no reranker, the chunk the dense search ranks first comes back (when
  it fits the budget);
* every result is the exact slice ``source[start_index:end_index]``;
* results never overlap;
* no result is under ``min_result_chars`` unless it is its whole document (or holds the
  dense search's first chunk, which may be short when the document is);
* with room, a result stops inside a paragraph only when the paragraph's end is further
  than ``paragraph_chars`` or past the next result.

Failing inputs found while developing are kept as ``@example`` regressions.
"""

from __future__ import annotations

import hashlib
import math
import re
import textwrap
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np
from hypothesis import example, given, settings
from hypothesis import strategies as st
from langchain_core.documents import Document
from langchain_core.embeddings import Embeddings
from langchain_core.vectorstores import InMemoryVectorStore

from helpers import HashingEmbeddings
from langchain_rse import RSERetriever
from langchain_rse.indexing.chunking import split_text
from langchain_rse.segments import Chosen, RSEParams, _is_end, _is_start, fit_segments, get_preset

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
    "zebra",
    "apple",
    "banana",
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
PROSE = [
    "the",
    "app",
    "runs",
    "a",
    "view",
    "and",
    "its",
    "request",
    "context",
    "stays",
    "open",
    "until",
    "it",
    "returns",
    "data",
]


@st.composite
def prose(draw: st.DrawFn) -> str:
    """Sentences on one line: a capital first, plain words (some with a comma, semicolon or
    colon after them), a full stop, question or exclamation mark last."""
    sentences = []
    for _ in range(draw(st.integers(1, 8))):
        words = draw(st.lists(st.sampled_from(PROSE), min_size=2, max_size=16))
        marks = draw(st.lists(st.sampled_from(["", "", "", "", ",", ";", ":"]), min_size=16))
        words = [w + m for w, m in zip(words[:-1], marks)] + words[-1:]
        words[0] = words[0].capitalize()
        sentences.append(" ".join(words) + draw(st.sampled_from([".", "?", "!"])))
    return " ".join(sentences)


def _wrapped(text: str, width: int) -> str:
    """``text`` hard-wrapped at ``width`` columns: each line break takes one blank's place."""
    out = textwrap.fill(text, width, break_long_words=False, break_on_hyphens=False)
    assert out.replace("\n", " ") == text
    return out


@st.composite
def documents(draw: st.DrawFn) -> str:
    """Paragraphs and headings joined by runs of blanks; some passages repeated."""
    parts: list[str] = []
    for _ in range(draw(st.integers(1, 14))):
        if draw(st.booleans()) and draw(st.booleans()):
            parts.append(draw(draw(headings)))
        passage = draw(paragraphs)
        if draw(st.integers(0, 3)) == 0:  # hard-wrapped prose (reST, Markdown, e-mail)
            passage = _wrapped(draw(prose()), draw(st.integers(40, 100)))
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


class MarkerEmbeddings(Embeddings):
    """The dense search ranks by marker words whatever the query says: ``zebra`` first, then
    ``apple``, then ``banana`` (BM25 ranks by the query's words)."""

    def _embed(self, text: str) -> list[float]:
        low = text.lower()
        return [float("zebra" in low), float("apple" in low), float("banana" in low), 0.05]

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        return [self._embed(t) for t in texts]

    def embed_query(self, text: str) -> list[float]:
        return [1.0, 0.6, 0.3, 0.05]


EMBEDDINGS = {
    "hashing": HashingEmbeddings,
    "arbitrary": ArbitraryEmbeddings,
    "marker": MarkerEmbeddings,
}


@dataclass(frozen=True)
class Call:
    texts: tuple[str, ...]
    query: str
    k: int
    max_chars: int | None
    group: int | None
    embeddings: str = "hashing"
    """A key of :data:`EMBEDDINGS`."""


calls = st.builds(
    Call,
    texts=st.lists(documents(), min_size=1, max_size=4).map(tuple),
    query=st.lists(st.sampled_from(WORDS), min_size=1, max_size=4).map(" ".join),
    k=st.integers(1, 8),
    max_chars=st.none() | st.integers(100, 3000),
    group=st.none() | st.sampled_from([0, 1]),
    embeddings=st.sampled_from(sorted(EMBEDDINGS)),
)


def _retriever(call: Call, params: RSEParams | None = None) -> RSERetriever:
    docs = [Document(t, id=f"d{i}", metadata={"group": i % 2}) for i, t in enumerate(call.texts)]
    embeddings = EMBEDDINGS[call.embeddings]()
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
        # (of chunks that tie, the pipeline may keep any: the promise holds when all fit)
        fits = call.max_chars is None or max(b - a for _, a, b in firsts) <= call.max_chars
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


TITLE = "Field notes, kept by the warden of the northern reserve through the dry season.\n\n"
ISSUE_54_3 = Call(  # the dense-first chunk joined to its neighbour across 204 blanks: 599 > 400
    texts=(
        TITLE
        + " ".join(["zebra"] * 25)
        + "\n\n"
        + " " * 200
        + "\n\n"
        + "apple banana " * 10
        + "apple banana",
        "banana split, no apple.",
    ),
    query="apple banana",
    k=3,
    max_chars=400,
    group=None,
    embeddings="marker",
)
ISSUE_54_4 = Call(  # the dense-first chunk's own segment ranked third, and k = 2
    texts=(
        "Zebra crossings stripe the old town's roads in black and white.",
        "An apple and a banana make a quick snack for the road.",
        "A banana bread recipe: flour, sugar and ripe fruit.",
    ),
    query="apple banana",
    k=2,
    max_chars=None,
    group=None,
    embeddings="marker",
)


@settings(max_examples=120)
@example(ISSUE_54_3)
@example(ISSUE_54_4)
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


# ------------------------------------------------------------- fit_segments, directly


@dataclass(frozen=True)
class Fit:
    text: str
    runs: tuple[tuple[int, int], ...]
    """Chosen chunk runs, best first."""
    max_chars: int | None
    dense: int | None
    """The dense search's first chunk, inside one of the runs (or None)."""


@st.composite
def fits(draw: st.DrawFn) -> Fit:
    text = draw(documents())
    n = len(split_text(text, "d"))
    cuts = sorted(draw(st.sets(st.integers(0, n), max_size=10)) | {0, n})
    runs = [r for r in zip(cuts, cuts[1:]) if r[1] > r[0] and draw(st.booleans())][:6]
    runs = draw(st.permutations(runs))
    spans = _spans(text)
    used = sum(spans[b - 1][1] - spans[a][0] for a, b in runs)
    held = [i for a, b in runs for i in range(a, b)]
    return Fit(
        text,
        tuple(runs),
        draw(st.none() | st.integers(used, used + 1200)),
        draw(st.none() | st.sampled_from(held)) if held else None,
    )


def _spans(text: str) -> list[tuple[int, int]]:
    return [(c.start_index, c.end_index) for c in split_text(text, "d")]


def _fit(f: Fit, params: RSEParams) -> list[Chosen]:
    s = SimpleNamespace(mode="segments", params=params, max_chars=f.max_chars, rerank=False, k=8)
    cands = (
        [] if f.dense is None else [SimpleNamespace(doc_id="d", chunk_index=f.dense, ranks=[1, 0])]
    )
    pointers = {"d": SimpleNamespace(spans=_spans(f.text))}
    selection = [("d", a, b, 1.0) for a, b in f.runs]
    return fit_segments(s, cands, pointers, {"d": f.text}, selection)  # type: ignore[arg-type]


def _check_fit(f: Fit, params: RSEParams, got: list[Chosen]) -> None:
    spans = sorted((g.start_index, g.end_index) for g in got)
    assert all(0 <= a < b <= len(f.text) for a, b in spans)
    assert all(x[1] <= y[0] for x, y in zip(spans, spans[1:]))  # never overlapping
    if f.max_chars is not None:  # within the budget
        assert sum(b - a for a, b in spans) <= f.max_chars
    if f.dense is not None:  # the dense search's first chunk stays whole
        c, e = _spans(f.text)[f.dense]
        assert any(a <= c and e <= b for a, b in spans)


@settings(max_examples=150)
@given(fits())
def test_fitting_keeps_budget_slices_and_the_dense_first_chunk(f: Fit) -> None:
    p = get_preset("default")
    got = _fit(f, p)
    _check_fit(f, p, got)
    for g in got:  # no fragments
        whole = f.text[g.start_index : g.end_index].strip() == f.text.strip()
        dense = f.dense is not None and g.chunk_start <= f.dense < g.chunk_end
        assert g.end_index - g.start_index >= p.min_result_chars or whole or dense


@settings(max_examples=150)
@given(fits())
def test_no_gap_of_up_to_bridge_chunks_is_left_when_it_fits(f: Fit) -> None:
    """Brute force over every pair of neighbouring results: two results at most
    ``bridge_chunks`` chunks apart are only left apart when their gap exceeds the budget
    left (snapping, growing and paragraph ends off, so only bridging spends it)."""
    p = get_preset("default").with_overrides(snap_chars=0, min_result_chars=0, paragraph_chars=0)
    got = sorted(_fit(f, p), key=lambda g: g.start_index)
    _check_fit(f, p, got)
    left = (
        math.inf
        if f.max_chars is None
        else f.max_chars - sum(g.end_index - g.start_index for g in got)
    )
    for x, y in zip(got, got[1:]):
        if y.chunk_start - x.chunk_end <= p.bridge_chunks:
            assert y.start_index - x.end_index > left


@settings(max_examples=150)
@given(fits())
def test_with_room_results_start_and_end_on_boundaries(f: Fit) -> None:
    """Brute force: with no budget, a result's end is a sentence or line end unless none is
    within ``snap_chars`` before the next result; the same for its start."""
    p = get_preset("default").with_overrides(min_result_chars=0)
    f = Fit(f.text, f.runs, None, f.dense)
    got = sorted(_fit(f, p), key=lambda g: g.start_index)
    _check_fit(f, p, got)
    n, reach = len(f.text), p.snap_chars
    for j, g in enumerate(got):
        hi = got[j + 1].start_index if j + 1 < len(got) else n
        lo = got[j - 1].end_index if j else 0
        if not _is_end(f.text, g.end_index):
            assert not any(
                _is_end(f.text, i) for i in range(g.end_index + 1, min(hi, g.end_index + reach) + 1)
            )
        if not _is_start(f.text, g.start_index):
            assert not any(
                _is_start(f.text, i) and not f.text[i].isspace()
                for i in range(max(lo, g.start_index - reach), g.start_index)
            )


def _paragraph_end(text: str, i: int) -> bool:
    """Brute force: only blanks follow ``i`` up to an empty line or the text's end."""
    return bool(re.match(r"[ \t\r\f\v]*\n[ \t\r\f\v]*\n", text[i:])) or not text[i:].strip()


@settings(max_examples=150)
@given(fits())
def test_with_room_a_result_ends_its_paragraph_when_that_is_near(f: Fit) -> None:
    """Brute force: with no budget, a result that stops inside a paragraph has no paragraph
    end within ``paragraph_chars`` before the next result."""
    p = get_preset("default")
    f = Fit(f.text, f.runs, None, f.dense)
    got = sorted(_fit(f, p), key=lambda g: g.start_index)
    _check_fit(f, p, got)
    for j, g in enumerate(got):
        hi = got[j + 1].start_index if j + 1 < len(got) else len(f.text)
        if not _paragraph_end(f.text, g.end_index):
            reach = range(g.end_index + 1, min(hi, g.end_index + p.paragraph_chars) + 1)
            assert not any(_paragraph_end(f.text, i) for i in reach)


@settings(max_examples=150)
@given(fits())
def test_a_paragraph_end_is_bought_with_room_left_only(f: Fit) -> None:
    """Metamorphic: carrying ends on to their paragraphs' ends never drops a result, never
    moves a start and never shortens a result; it only spends the budget's room."""
    off = _fit(f, get_preset("default").with_overrides(paragraph_chars=0))
    on = _fit(f, get_preset("default"))
    _check_fit(f, get_preset("default"), on)
    assert [(g.doc_id, g.start_index) for g in on] == [(g.doc_id, g.start_index) for g in off]
    assert all(a.end_index >= b.end_index for a, b in zip(on, off))


def test_an_answer_paragraph_comes_back_to_its_end_when_the_budget_has_room() -> None:
    """A chunk that stops inside its paragraph comes back to the paragraph's end when the
    budget has room for the rest, and stops short of it (on a sentence end) when not."""
    para = " ".join(f"Step {i}: hold the reset button until the gauge settles." for i in range(7))
    text = "\n\n".join([para] * 4)
    spans = _spans(text)
    first = next(i for i, (_, e) in enumerate(spans) if not _paragraph_end(text, e))
    start, end = spans[first]
    paragraph_end = text.index("\n\n", end)
    assert paragraph_end - end <= get_preset("default").paragraph_chars
    p = get_preset("default")
    (roomy,) = _fit(Fit(text, ((first, first + 1),), end - start + 400, None), p)
    assert roomy.end_index == paragraph_end
    (tight,) = _fit(Fit(text, ((first, first + 1),), end - start, None), p)
    assert tight.end_index < paragraph_end and _is_end(text, tight.end_index)


@settings(max_examples=200)
@given(prose(), st.integers(60, 100))
def test_hard_wrapping_prose_adds_no_result_ends_or_starts(text: str, width: int) -> None:
    """Metamorphic: prose hard-wrapped at 60-100 columns may end and start a result exactly
    where the same prose on one line may: a line break inside a sentence is no end."""
    wrapped = _wrapped(text, width)
    for i in range(len(text) + 1):
        assert _is_end(wrapped, i) == _is_end(text, i), (i, wrapped[max(0, i - 30) : i + 30])
        assert _is_start(wrapped, i) == _is_start(text, i), (i, wrapped[max(0, i - 30) : i + 30])


def test_a_line_of_code_or_a_comment_still_ends_where_it_ends() -> None:
    """Only prose wraps: a reST paragraph's wrapped line is no end, its sentence's end is;
    a comment before code, an import and a list of names end at their line ends."""
    rst = (
        "The loader looks for a user id that the login view kept in the\n"
        ":data:`session` and reads that user's row from the database, keeping it\n"
        "on :data:`g.user <g>` for the rest of the request, so that every view\n"
        "``before_request`` runs ahead of can read it.\n"
        "If there is no user id, ``g.user`` will be ``None``.\n"
    )
    for line_end in (rst.index("\n:data:"), rst.index("\non "), rst.index("\n``before")):
        assert not _is_end(rst, line_end) and not _is_start(rst, line_end + 1)
    assert _is_end(rst, rst.index("\nIf")) and _is_start(rst, rst.index("If"))
    code = (
        "    # check whether the cache already holds a value for this key\n"
        "    if key in cache:\n"
        "from pyflink.common import Types\n"
        "from pyflink.datastream import StreamExecutionEnvironment\n"
        "    mockXdgPrimaryCredentialRetriever,\n"
        "    mockEnvHomeXdgCredentialRetriever,\n"
    )
    lines = [i for i, c in enumerate(code) if c == "\n"]
    assert all(_is_end(code, i) for i in lines)
    assert all(_is_start(code, i + 1) for i in lines[:-1])


def test_a_gap_is_bought_with_the_results_ranked_below_both() -> None:
    """A one-chunk gap between the two best results that the budget left cannot pay for
    is paid by leaving out the third result (ranked below both)."""
    text = "\n\n".join(f"Paragraph {i} says one thing. " + "word " * 40 for i in range(8))
    spans = _spans(text)
    runs = ((0, 2), (3, 5), (6, 8))  # chunk 2 lies between the first two
    used = sum(spans[b - 1][1] - spans[a][0] for a, b in runs)
    f = Fit(text, runs, used, None)
    p = get_preset("default").with_overrides(snap_chars=0, min_result_chars=0, paragraph_chars=0)
    got = _fit(f, p)
    assert [(g.chunk_start, g.chunk_end) for g in got] == [(0, 5)]
    assert sum(g.end_index - g.start_index for g in got) <= used


def test_a_line_too_long_to_be_wrapped_ends_where_it_ends() -> None:
    """A paragraph written on one line (longer than any wrap width) ends at its line end,
    and the check reads at most a wrap's width of it."""
    line = "the app runs a view and its request context stays open " * 5000
    text = line + "\nand the next paragraph starts here."
    assert _is_end(text, len(line)) and _is_start(text, len(line) + 1)
    wrapped = "the app runs a view and its request context stays open\nand goes on."
    assert not _is_end(wrapped, wrapped.index("\n"))
