"""Why a segment was picked: chunk relevance along each document, and the chosen segments.

A query records what it saw as a :class:`Trace` while :func:`tracing` listens.

:meth:`RSERetriever.explain <langchain_rse.retriever.RSERetriever.explain>` returns an
:class:`Explanation`: the results, and for every document with candidates the relevance
the pipeline gave each of its chunks (``None`` for chunks that were not candidates) and
the segments chosen in it. :meth:`Explanation.to_text` draws one strip per document for a
terminal; :meth:`Explanation.to_html` writes one self-contained page with the segments
highlighted in their document text under the strip.
"""

from __future__ import annotations

import html
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

from langchain_core.documents import Document

if TYPE_CHECKING:
    from langchain_rse.indexing.records import Body, Pointer
    from langchain_rse.query import Candidate
    from langchain_rse.segments import Chosen

__all__ = [
    "TRACES",
    "DocumentExplanation",
    "Explanation",
    "Trace",
    "build_explanation",
    "tracing",
]


class Trace(NamedTuple):
    """What one retrieval saw: current candidates with their relevance, the documents'
    pointers, the chosen segments and the bodies read (at least those of chosen documents).
    The pipeline hands it over in a ``Report`` request on every query; a ``NamedTuple``, so
    building it runs no code of this module."""

    candidates: list[Candidate]
    pointers: dict[str, Pointer]
    selection: list[Chosen]
    bodies: dict[str, Body]


TRACES: ContextVar[list[Trace] | None] = ContextVar("rse_traces", default=None)
"""Set while :meth:`RSERetriever.explain` runs: retrievals record their trace there."""


@contextmanager
def tracing() -> Iterator[list[Trace]]:
    """Within the block, retrievals in this context append their :class:`Trace` to the
    list yielded."""
    traces: list[Trace] = []
    token = TRACES.set(traces)
    try:
        yield traces
    finally:
        TRACES.reset(token)


_LEVELS = " ▁▂▃▄▅▆▇█"
"""Blocks for relevance 0 .. 1 (a space: not a candidate)."""


@dataclass
class DocumentExplanation:
    """One document's chunks as the retrieval saw them."""

    doc_id: str
    metadata: dict[str, object]
    spans: list[tuple[int, int]]
    """Each chunk's ``(start_index, end_index)`` in the source text."""
    relevance: list[float | None]
    """Each chunk's relevance in [0, 1]; ``None`` where the chunk was not a candidate."""
    segments: list[tuple[int, int, int]] = field(default_factory=list)
    """``(result number, chunk_start, chunk_end)`` of the results cut from this document."""
    text: str | None = None
    """The source text (documents with a returned segment only)."""

    @property
    def name(self) -> str:
        """The document's ``source`` (or its id)."""
        return str(self.metadata.get("source") or self.doc_id)

    def strip(self, width: int = 64) -> tuple[str, str]:
        """The relevance strip (one character per ``len(chunks) / width`` chunks, the most
        relevant of them) and, under it, the result numbers over the chosen chunks."""
        n = len(self.spans)
        width = max(1, min(width, n))
        cells, marks = [], []
        for col in range(width):
            lo, hi = col * n // width, max(col * n // width + 1, (col + 1) * n // width)
            rel = [r for r in self.relevance[lo:hi] if r is not None]
            cells.append(_LEVELS[1 + round(max(rel) * 7)] if rel else _LEVELS[0])
            hit = [num for num, a, b in self.segments if a < hi and b > lo]
            marks.append(str(hit[0])[-1] if hit else " ")
        return "".join(cells), "".join(marks).rstrip()


@dataclass
class Explanation:
    """A retrieval's results and what the pipeline saw on the way (see module docs)."""

    query: str
    results: list[Document]
    documents: list[DocumentExplanation]
    """Documents with candidates, those with results first (in result order)."""

    def to_text(self, width: int = 64) -> str:
        """One strip per document, the result numbers under the chosen chunks."""
        if not self.documents:
            return "no candidates"
        lines = [
            f"relevance per chunk ({_LEVELS[1]} low .. {_LEVELS[-1]} high, blank: "
            "not a candidate); numbers: the results chosen there"
        ]
        for d in self.documents:
            bar, marks = d.strip(width)
            found = sum(r is not None for r in d.relevance)
            lines.append(f"{d.name}  ({len(d.spans)} chunks, {found} candidates)")
            lines.append(f"  |{bar}|")
            if marks:
                lines.append(f"   {marks}")
        return "\n".join(lines)

    def to_html(self) -> str:
        """One self-contained HTML page (no scripts, no external files): per document with
        results, the relevance strip, then the document text with each returned segment
        highlighted in a ``<mark id="seg-N" data-result="N">``, which result N in the list
        links to. Every value written into the page (the query, text, metadata such as
        ``source`` or ``page_start``) is HTML-escaped."""
        parts = [f"<h1>Query: {html.escape(self.query)}</h1>"]
        parts.append(
            f"<p>{len(self.results)} result(s). Bars: chunk relevance (height); "
            "highlighted: the returned segments.</p>"
        )
        for d in self.documents:
            if d.text is None:
                continue
            parts.append(f"<section><h2>{html.escape(d.name)}</h2>{_html_strip(d)}")
            parts.append(f"<ul class='results'>{_html_results(d, self.results)}</ul>")
            parts.append(f"<div class='text'>{_html_text(d, self.results)}</div></section>")
        others = [d.name for d in self.documents if d.text is None]
        if others:
            items = "".join(f"<li>{html.escape(name)}</li>" for name in others)
            parts.append(f"<h2>Other documents with candidates</h2><ul>{items}</ul>")
        return _PAGE.format(title=html.escape(self.query), body="\n".join(parts))


def _html_strip(d: DocumentExplanation) -> str:
    chosen = {i for _, a, b in d.segments for i in range(a, b)}
    bars = []
    for i, rel in enumerate(d.relevance):
        height = 2 + round((rel or 0.0) * 38)
        cls = "bar chosen" if i in chosen else ("bar" if rel is not None else "bar none")
        tip = f"chunk {i}: " + (f"relevance {rel:.3f}" if rel is not None else "not a candidate")
        bars.append(
            f"<span class='{cls}' style='height:{height}px' title='{html.escape(tip)}'></span>"
        )
    return f"<div class='strip'>{''.join(bars)}</div>"


def _html_results(d: DocumentExplanation, results: list[Document]) -> str:
    items = []
    for num, start, end in d.segments:
        m = results[num - 1].metadata
        pages = ""
        if "page_start" in m:  # metadata: a source may set anything there
            pages = f", pages {m['page_start']}-{m.get('page_end')}"
        chars = f"characters {m['start_index']}-{m['end_index']}"
        line = f"chunks {start}-{end - 1}, {chars}{pages}, score {m['score']:.3f}"
        items.append(f"<li><a href='#seg-{num}'>result {num}</a>: {html.escape(line)}</li>")
    return "".join(items)


def _html_text(d: DocumentExplanation, results: list[Document]) -> str:
    assert d.text is not None
    out, pos = [], 0
    marks = sorted(
        (results[num - 1].metadata["start_index"], results[num - 1].metadata["end_index"], num)
        for num, _, _ in d.segments
    )
    for start, end, num in marks:  # segments never overlap
        score = results[num - 1].metadata["score"]
        out.append(html.escape(d.text[pos:start]))
        tip = html.escape(f"result {num}, score {score:.3f}")
        out.append(
            f"<mark id='seg-{num}' data-result='{num}' title='{tip}'>"
            f"{html.escape(d.text[start:end])}</mark>"
        )
        pos = end
    out.append(html.escape(d.text[pos:]))
    return "".join(out)


_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>langchain-rse: {title}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2em auto; max-width: 60em; }}
.strip {{ display: flex; align-items: flex-end; gap: 1px; height: 42px;
  border-bottom: 1px solid #888; margin: .5em 0 1em; }}
.bar {{ flex: 1; background: #7a9cc6; min-width: 1px; }}
.bar.none {{ background: #ddd; }}
.bar.chosen {{ background: #e0a800; }}
.text {{ white-space: pre-wrap; font-family: ui-monospace, monospace; font-size: 13px;
  line-height: 1.4; border: 1px solid #ccc; padding: 1em; }}
mark {{ background: #ffe08a; }}
</style></head>
<body>
{body}
</body></html>
"""


def build_explanation(query: str, results: list[Document], trace: Trace | None) -> Explanation:
    """The :class:`Explanation` of a retrieval from its results and pipeline trace."""
    if trace is None:
        return Explanation(query, results, [])
    docs: dict[str, DocumentExplanation] = {}
    for c in trace.candidates:
        d = docs.get(c.doc_id)
        if d is None:
            pointer = trace.pointers[c.doc_id]
            d = docs[c.doc_id] = DocumentExplanation(
                c.doc_id, dict(pointer.metadata), list(pointer.spans), [None] * len(pointer.spans)
            )
        d.relevance[c.chunk_index] = c.relevance
    for num, (doc_id, start, end, *_) in enumerate(trace.selection, start=1):
        if num > len(results) or doc_id not in docs:
            continue
        docs[doc_id].segments.append((num, start, end))
        body = trace.bodies.get(doc_id)
        docs[doc_id].text = body.text if body is not None else None
    ordered = sorted(docs.values(), key=lambda d: min((s[0] for s in d.segments), default=1 << 30))
    return Explanation(query, results, ordered)
