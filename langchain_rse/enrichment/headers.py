"""The offline enricher: the document title and the section-heading path of each chunk.

Headings are found in one linear pass: line headings (``indexing.sections``: Markdown ``#``
headings outside code blocks, and titles underlined or overlined with ``===``, ``---``,
``~~~``, ``^^^`` ... as reStructuredText, AsciiDoc and Markdown write them), or in plain
text numbered clauses, ``ARTICLE``/``Section``/``Item`` headings and ALL-CAPS lines, less
table cells (a line followed on its row by a number cell, ``REVENUES   2019``, is a
table row; a bare number ending a row, its last cell); an untitled number is a heading only
where it continues the clause numbering (``4.29`` -> ``4.30``, ``4.2`` -> ``4.2.1``).
"""

from __future__ import annotations

import os
import re
from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from langchain_rse.enrichment.base import BaseEnricher, clip, collapse
from langchain_rse.indexing.chunking import Chunk
from langchain_rse.indexing.records import ChunkContext
from langchain_rse.indexing.sections import line_headings

__all__ = ["HEADER_VERSION", "HeaderEnricher", "HeaderOutline"]

HEADER_VERSION = "header-v3"
"""Part of :meth:`HeaderEnricher.fingerprint`: bumped when heading detection or wording
changes, so indexes built with the old header are re-enriched."""

# A "logical line" starts at a line start (up to 3 spaces in) or after 3+ spaces (PDF text).
_NEWLINE_START = re.compile(r"\n[ \t]{0,3}(?=[A-Z0-9])")
_SOFT_BREAK_START = re.compile(r"   +(?=[A-Z0-9])")
_TEXT_START = re.compile(r"[ \t]{0,3}(?=[A-Z0-9])")
_WORDS = r"\S+(?:[ \t]{1,2}\S+){0,15}"  # up to 16 words, stopping at a 3+ space run
_CLAUSE = r"\d{1,3}(?:\.\d{1,3}){0,7}"
"""A clause number of up to 8 parts (``12.3.1``): bounded, so a run of ``1.1.1...`` costs a
constant at a line start (150,000 parts made the outline quadratic)."""
_KEYWORDS = (
    "ARTICLE|Article|SECTION|Section|PART|Part|CHAPTER|Chapter|SCHEDULE|Schedule|"
    "EXHIBIT|Exhibit|ANNEX|Annex|APPENDIX|Appendix|ITEM|Item"
)
_PLAIN_HEADING = re.compile(
    # ARTICLE IV / Section 5. / Part 2 - Scope / Item 7A.
    rf"(?P<kw>{_KEYWORDS})[ \t]+(?P<kwnum>[IVXLCDM]+|{_CLAUSE}[A-Z]?|[A-Z])\b"
    + rf"(?P<kwsep>\.?[ \t]{{0,2}}[.:\-–—]?)(?:[ \t]{{0,2}}(?P<kwtitle>{_WORDS}))?"
    # IV. TERMINATION
    + r"|(?P<roman>[IVX]{1,5})\.[ \t]{1,2}(?P<rtitle>[A-Z]\S*(?:[ \t]{1,2}\S+){0,15})"
    # 12.3 Term / 12. Term / 12.3. Term / 4.
    + r"|(?P<num>\d{1,3}(?:\.\d{1,3}){1,7}\.?|\d{1,3}\.)(?=[ \t\r\n]|\Z)"
    + rf"(?:[ \t]{{1,2}}(?P<ntitle>{_WORDS}))?"
    # TERM AND TERMINATION (a whole logical line of capitals)
    + r"|(?P<caps>[A-Z][A-Z0-9 \t,&'’/().:;\-–—]{2,99}?)(?=[ \t\r]*(?:\n|\Z)|[ \t\xa0]{3})"
)
_LINE_BREAK = re.compile(r"\n|[ \t\xa0]{3}")
_SENTENCE_END = re.compile(r"[.;:](?:\s|$)")
_TOP_LEVEL = 0
"""Level of ARTICLE / ITEM / EXHIBIT-like headings: above numbered clauses (level >= 1)."""
_PART_LEVEL = -1
"""Level of PART headings: above articles (and a 10-K's ``Item`` headings)."""
_ROW_WINDOW = 160
"""How far along its physical line a heading candidate is checked for number cells."""
_ROMAN = {"I": 1, "V": 5, "X": 10, "L": 50, "C": 100, "D": 500, "M": 1000}
_LOOKBACK = 5000
"""How far back the clause before an untitled clause number is looked for in the text."""
_MAX_LABEL_HITS = 16
"""How many (nearest) occurrences of that clause's number are looked at: a bound."""
_CLAUSE_TEXT = re.compile(r"\.?[ \t]+[A-Z\"“(]")
_MAX_SKIPPED, _MAX_SKIPPED_TOP = 3, 10
"""Untitled ``4.30`` continues after ``4.27``-``4.29``; top-level ``12.`` after ``2.``-``11.``."""
_CELL_BREAK = re.compile(r"[ \t\xa0]{3,}")
_NUMBER_CELL = re.compile(r"[$€£(]?[ \t]?[-–]?\d[\d,.]*\)?%?")
"""A table cell that is a number: ``4.30``, ``12.5``, ``2019``, ``$ 1,234``, ``(1,234)``."""


class _Heading(NamedTuple):
    start: int
    end: int
    level: int
    text: str
    kind: str
    """``"markdown"``, ``"underlined"``, ``"keyword"``, ``"roman"``, ``"number"`` or
    ``"caps"``."""
    titled: bool = True
    number: tuple[int, ...] = ()
    """The clause number of a ``"number"`` or ``Section 4.2`` heading (``(4, 2)``)."""


def _heading_title(raw: str | None) -> str:
    """The title part of a clause heading ('' when what follows looks like prose)."""
    if not raw:
        return ""
    found = _SENTENCE_END.search(raw)
    title = raw[: found.start()] if found else raw
    title = collapse(title).rstrip(" .,;:-–—")
    if not title or len(title) > 80:
        return ""
    if not (title[0].isupper() or title[0] in "\"“'(["):
        return ""
    if title.isupper():
        return title
    long_words = [w for w in title.split() if len(w) > 3 and w[0].isalpha()]
    capitalised = sum(w[0].isupper() for w in long_words)
    if long_words and capitalised * 2 < len(long_words):
        return ""  # a sentence, not a title
    return title


def _is_caps_heading(line: str) -> bool:
    """Whether an all-capitals logical line looks like a heading, not a code or number row."""
    letters = sum(map(str.isalpha, line))
    visible = len(line) - line.count(" ")
    return (
        letters >= 4
        and letters >= 0.6 * visible
        and len(line.split()) <= 12
        and not line.endswith(",")
    )


def _next_cell_is_number(text: str, end: int) -> bool:
    """Whether the next cell on the physical line after ``end`` is a number (a table row).

    Cells are separated by runs of 3+ spaces, as PDF text extraction lays tables out; only
    the next :data:`_ROW_WINDOW` characters are looked at (a cell cut there is ignored).
    Only the next cell: a page number at the end of a clause's last line is no table.
    """
    line_end = text.find("\n", end, end + _ROW_WINDOW)
    cells = _CELL_BREAK.split(text[end : line_end if line_end >= 0 else end + _ROW_WINDOW])
    if line_end < 0 and end + _ROW_WINDOW < len(text):
        cells.pop()
    cell = next((c.strip() for c in cells if c.strip()), "")
    return _NUMBER_CELL.fullmatch(cell) is not None


def _last_cell(text: str, start: int, end: int) -> bool:
    """Whether ``text[start:end]`` ends a physical line that has text before it: the last
    cell of a table row (``Net sales      4.30``)."""
    line_end = text.find("\n", end, end + _ROW_WINDOW)
    if text[end : line_end if line_end >= 0 else end + _ROW_WINDOW].strip():
        return False
    line_start = text.rfind("\n", max(0, start - _ROW_WINDOW), start) + 1
    return bool(text[line_start or max(0, start - _ROW_WINDOW) : start].strip())


def _written_before(text: str, start: int, clause: tuple[int, ...]) -> bool:
    """Whether clause ``clause`` (``2.5.1`` or ``2.05.1``, then a capital) starts in the
    :data:`_LOOKBACK` characters before ``start``.

    PDF text often runs clauses on in one paragraph (``... 2.5 Purchase Orders. 2.5.1
    CUTANEA agrees ...``), so only the clauses that start a page start a line.
    """
    head = "".join(f"{part}." for part in clause[:-1])
    labels = {f"{head}{clause[-1]}", f"{head}{clause[-1]:02d}"}  # 8.5 and 8.05
    lo = max(0, start - _LOOKBACK)
    for label in labels:
        at = text.rfind(label, lo, start)
        for _ in range(_MAX_LABEL_HITS):
            if at < 0:
                break
            if (at == 0 or text[at - 1] not in "0123456789.,$") and _CLAUSE_TEXT.match(
                text, at + len(label)
            ):
                return True
            at = text.rfind(label, lo, at)
    return False


def _continues_numbering(
    number: tuple[int, ...], seen: set[tuple[int, ...]], text: str, start: int
) -> bool:
    """Whether an untitled clause number at ``start`` continues the numbering before it.

    ``seen`` holds the numbers of the headings so far and their prefixes. PDF text runs
    some clauses on mid-line, where they are no heading, so: ``4.30`` continues after
    ``4.27``-``4.29`` (a top-level ``12.`` after ``2.``-``11.``) or where ``4.29`` starts
    in the text just before it (:func:`_written_before`); a first sub-clause ``x.1`` under
    a parent ``x`` that was seen, is written just before or itself continues; ``1.`` and
    ``1.1`` always (a first clause); ``x.0`` never. So ``4.30`` after ``Section 7`` does not.
    """
    parent, last = number[:-1], number[-1]
    if last == 0:
        return False
    if last == 1:
        return (
            all(part == 1 for part in parent)
            or parent in seen
            or _written_before(text, start, parent)
            or _continues_numbering(parent, seen, text, start)
        )
    skipped = _MAX_SKIPPED if parent else _MAX_SKIPPED_TOP
    if any((*parent, lower) in seen for lower in range(max(1, last - skipped), last)):
        return True
    return _written_before(text, start, (*parent, last - 1))


def _is_table_cell(
    text: str, match: re.Match[str], heading: _Heading, seen: set[tuple[int, ...]]
) -> bool:
    """Whether an ALL-CAPS line or an untitled number is a table row or cell, not a heading.

    Followed on its row by a number cell, an ALL-CAPS line (``REVENUES   2019   2020``) or
    a bare number (``4.30   12.5``) is a table row; a bare number that ends a row with text
    before it is its last cell; an untitled number must continue the numbering
    (:func:`_continues_numbering`). Titled numbers are kept whatever follows them:
    ``5. Confidential Information   7`` may be a heading with its page number.
    """
    if heading.kind == "caps":
        return _next_cell_is_number(text, match.end())
    if heading.kind != "number" or heading.titled:
        return False
    if not match.group("ntitle") and (
        _next_cell_is_number(text, match.end()) or _last_cell(text, match.start(), match.end())
    ):
        return True
    return not heading.number or not _continues_numbering(heading.number, seen, text, match.start())


def _clause_number(raw: str) -> tuple[int, ...]:
    """``"4.2."`` -> ``(4, 2)``, ``"15.0"`` -> ``(15,)`` (``15.0`` is clause 15, above
    ``15.1``; ``85.00`` stays ``(85, 0)``); ``()`` when ``raw`` is not digits and dots."""
    parts = [part for part in raw.split(".") if part]
    if len(parts) > 1 and parts[-1] == "0":
        parts.pop()
    return tuple(map(int, parts)) if parts and all(p.isdigit() for p in parts) else ()


def _roman_number(numeral: str) -> tuple[int, ...]:
    """``"VIII"`` -> ``(8,)``; ``()`` when ``numeral`` is not a Roman numeral."""
    values = [_ROMAN.get(letter, 0) for letter in numeral]
    if not values or 0 in values:
        return ()
    return (sum(-v if v < after else v for v, after in zip(values, [*values[1:], 0])),)


def _logical_line_starts(text: str) -> list[int]:
    """Sorted starts of logical lines that begin with a capital letter or a digit."""
    starts = {m.end() for m in _NEWLINE_START.finditer(text)}
    starts.update(m.end() for m in _SOFT_BREAK_START.finditer(text))
    first = _TEXT_START.match(text)
    if first is not None:
        starts.add(first.end())
    return sorted(starts)


def _plain_headings(text: str) -> list[_Heading]:
    """Clause headings of a plain-text document: keywords, numbers, ALL-CAPS lines."""
    headings: list[_Heading] = []
    seen: set[tuple[int, ...]] = set()  # the numbers of the headings so far, and prefixes
    matched_to = 0
    for position in _logical_line_starts(text):
        if position < matched_to:
            continue
        match = _PLAIN_HEADING.match(text, position)
        if match is None:
            continue
        matched_to = match.end()
        heading = _plain_heading(match)
        if heading is None:
            continue
        if _is_table_cell(text, match, heading, seen):
            continue
        previous = headings[-1] if headings else None
        if (
            previous is not None
            and match.group("caps")
            and (not previous.titled or previous.kind == "caps")
            and match.start() - previous.end <= 40
            and not text[previous.end : match.start()].strip()
            and text.count("\n", previous.end, match.start()) <= 1
        ):
            # "ARTICLE IV\nTERM AND TERMINATION", capitals over two lines (no blank between)
            merged = clip(f"{previous.text} {heading.text}", 100)
            headings[-1] = previous._replace(end=heading.end, text=merged, titled=True)
            continue
        headings.append(heading)
        seen.update(heading.number[:depth] for depth in range(1, len(heading.number) + 1))
    return headings


def _plain_heading(match: re.Match[str]) -> _Heading | None:
    """The heading a :data:`_PLAIN_HEADING` match stands for, or ``None`` for a false hit."""
    if match.group("kw"):
        keyword, number = match.group("kw"), match.group("kwnum")
        raw_title = match.group("kwtitle")
        title = _heading_title(raw_title)
        if raw_title and not title and not match.group("kwsep").strip():
            return None  # "Section 5 of the Act provides ..." is prose
        level, clause = _TOP_LEVEL, tuple[int, ...]()
        if keyword.lower() == "part":
            level = _PART_LEVEL
        elif keyword.lower() == "section" and number[0].isdigit():
            level, clause = number.count(".") + 1, _clause_number(number)
        elif keyword.lower() == "article":  # "ARTICLE VIII" before an untitled "8.1"
            clause = _clause_number(number) or _roman_number(number)
        label = f"{keyword} {number}"
        end = match.end() if title else match.end("kwnum")
        text = clip(f"{label} {title}".strip(), 100)
        return _Heading(match.start(), end, level, text, "keyword", bool(title), clause)
    if match.group("roman"):
        title = _heading_title(match.group("rtitle"))
        if not title:
            return None
        text = clip(f"{match.group('roman')}. {title}", 100)
        return _Heading(match.start(), match.end(), _TOP_LEVEL, text, "roman")
    if match.group("num"):
        number, raw_title = match.group("num"), match.group("ntitle")
        if raw_title and not (raw_title[0].isupper() or raw_title[0] in "\"“'(["):
            return None  # "1.5 million ..." is prose
        title = _heading_title(raw_title)
        level = len([part for part in number.split(".") if part])
        end = match.end() if title else match.end("num")
        text = clip(f"{number} {title}".strip(), 100)
        clause = _clause_number(number)
        return _Heading(match.start(), end, level, text, "number", bool(title), clause)
    line = collapse(match.group("caps"))
    if not _is_caps_heading(line):
        return None
    return _Heading(match.start(), match.end(), 1, clip(line, 100), "caps")


def _heading_paths(headings: Sequence[_Heading]) -> list[tuple[str, ...]]:
    """The heading path in force right after each heading (nesting by level)."""
    stack: list[_Heading] = []
    paths: list[tuple[str, ...]] = []
    for heading in headings:
        while stack and stack[-1].level >= heading.level:
            stack.pop()
        stack.append(heading)
        paths.append(tuple(h.text for h in stack))
    return paths


def _first_line(text: str) -> str:
    """The first logical line of ``text`` with a letter or digit (ends at a newline or a 3+
    space run): never a rule of ``=`` signs."""
    for match in re.finditer(r"\S.*?(?=\n|[ \t\xa0]{3}|\Z)", text[:100_000]):
        if any(ch.isalnum() for ch in match.group()):
            return collapse(match.group())
    return ""


@dataclass(frozen=True)
class HeaderOutline:
    """Title and heading index of one document (:meth:`HeaderEnricher.outline`)."""

    title: str
    starts: list[int]
    """Start offset of each heading, ascending."""
    contexts: list[str]
    """The context of a chunk under each heading (rendered once per heading)."""
    untitled: str
    """The context of a chunk before the first heading."""


class HeaderEnricher(BaseEnricher):
    """Offline context: the document title and the section-heading path of each chunk.

    The title is ``metadata["title"]``, else the first line heading (Markdown ``#``, or a
    title underlined or overlined as in reStructuredText), else (plain text) the first
    ALL-CAPS heading line in the first 3,000 characters, else the first line with a letter
    or digit, else the base name of ``metadata["source"]``. Headings are those of the module
    docstring; each chunk takes the path of the headings that start before the end of its
    first line.

    Example context::

        Document: Master Services Agreement
        Section: ARTICLE IV TERM AND TERMINATION > 4.2 Termination for Cause
    """

    def __init__(
        self, *, max_title_chars: int = 100, max_depth: int = 4, first_line_chars: int = 200
    ) -> None:
        """``max_title_chars``: the title's length limit; ``max_depth``: the most innermost
        headings shown; ``first_line_chars``: a heading this close to a chunk's start, on its
        first line, belongs to the chunk."""
        self.max_title_chars = max_title_chars
        self.max_depth = max_depth
        self.first_line_chars = first_line_chars

    def outline(self, text: str, metadata: dict[str, Any]) -> HeaderOutline:
        """Title and headings of a document (used once per document)."""
        headings = [
            _Heading(h.start, h.end, h.level, clip(h.title, 100), h.kind)
            for h in line_headings(text)
        ]
        markdown = bool(headings)  # Markdown, reStructuredText, AsciiDoc
        if not markdown:
            headings = _plain_headings(text)
        title = ""
        meta_title = metadata.get("title")
        if isinstance(meta_title, str) and meta_title.strip():
            title = meta_title
        elif markdown:
            title = headings[0].text
        else:
            # A contract's name is usually its first line in capitals, after cover matter.
            caps = [h.text for h in headings[:10] if h.kind == "caps" and h.start < 3000]
            title = caps[0] if caps else _first_line(text)
        if not title:
            source = metadata.get("source")
            if source is not None and str(source).strip():
                title = os.path.basename(str(source).rstrip("/\\")) or str(source)
        title = clip(collapse(title), self.max_title_chars)
        document = f"Document: {title}" if title else ""
        folded_title = title.casefold()
        contexts = []
        for path in _heading_paths(headings):
            # The H1 (or capitals line) that is also the title is not repeated.
            shown = [h for h in path if h.casefold() != folded_title][-self.max_depth :]
            section = "Section: " + clip(" > ".join(shown), 300) if shown else ""
            contexts.append("\n".join(line for line in (document, section) if line))
        return HeaderOutline(title, [h.start for h in headings], contexts, document)

    def context_for(self, outline: HeaderOutline, text: str, chunk: Chunk) -> str:
        """The header text for one chunk given the document's outline."""
        limit = min(chunk.end_index, chunk.start_index + self.first_line_chars)
        line_break = _LINE_BREAK.search(text, chunk.start_index, limit)
        first_line_end = line_break.start() if line_break else limit
        i = bisect_left(outline.starts, max(first_line_end, chunk.start_index + 1)) - 1
        return outline.contexts[i] if i >= 0 else outline.untitled

    def enrich(
        self, doc_id: str, text: str, metadata: dict[str, Any], chunks: Sequence[Chunk]
    ) -> list[ChunkContext]:
        """One ``"header"`` context per chunk (``''`` when there is no title nor section)."""
        if not chunks:
            return []
        outline = self.outline(text, metadata)
        return [ChunkContext(self.context_for(outline, text, c), "header") for c in chunks]

    def fingerprint_settings(self) -> dict[str, Any]:
        """:data:`HEADER_VERSION` and the three options: all that shapes the header."""
        return {
            "version": HEADER_VERSION,
            "max_title_chars": self.max_title_chars,
            "max_depth": self.max_depth,
            "first_line_chars": self.first_line_chars,
        }

    def __repr__(self) -> str:
        return (
            f"HeaderEnricher(max_title_chars={self.max_title_chars}, "
            f"max_depth={self.max_depth}, first_line_chars={self.first_line_chars})"
        )
