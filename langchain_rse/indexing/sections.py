"""Headings that are whole lines: Markdown ``#`` headings and underlined or overlined titles
(reStructuredText, AsciiDoc's two-line titles, Markdown's setext headings).

The header enricher names a chunk's section with them, and the default splitter starts a
chunk at each of them (:func:`section_starts`), so no chunk ends on the next section's title.
"""

from __future__ import annotations

import re
from bisect import bisect_left
from collections.abc import Iterator
from typing import NamedTuple

__all__ = ["LineHeading", "line_headings", "section_starts"]

# ``^`` in MULTILINE mode is slow (tried at every position): line-anchored patterns start
# with a literal newline instead, and the text's first line is matched separately. Closing
# ``#``\ s are cut in Python (``_md_title``): a lazy title would backtrack quadratically.
_MD_HEADING_BODY = r"(?P<h> {0,3}(?P<hashes>#{1,6})[ \t]+(?P<title>\S.*)$)"
_MD_HEADING = (re.compile(r"\n" + _MD_HEADING_BODY, re.M), re.compile(_MD_HEADING_BODY, re.M))
_MD_FENCE_BODY = r"(?P<h> {0,3}(?P<fence>`{3,}|~{3,}))"
_MD_FENCE = (re.compile(r"\n" + _MD_FENCE_BODY), re.compile(_MD_FENCE_BODY))
_ADORNMENT_BODY = r"(?P<h>[!-/:-@\[-_{-~]{3,})[ \t]*\r?$"
"""A line of punctuation (not a backtick: Markdown's fence), 3 or more long; an adornment
when it is one character repeated (checked in Python: a backreference repeated in the
pattern costs memory per character)."""
_ADORNMENT = (re.compile(r"\n" + _ADORNMENT_BODY, re.M), re.compile(_ADORNMENT_BODY, re.M))
_MAX_TITLE_CHARS = 120
"""An underlined line longer than this is prose over a rule, not a title."""


class LineHeading(NamedTuple):
    """One heading: ``text[start:end]`` is its title line and adornment lines."""

    start: int
    end: int
    level: int
    """1 for the outermost style (Markdown's ``#``; the first underline style seen)."""
    title: str
    kind: str
    """``"markdown"`` (``#``) or ``"underlined"`` (with or without an overline)."""


def _line_matches(
    patterns: tuple[re.Pattern[str], re.Pattern[str]], text: str
) -> Iterator[re.Match[str]]:
    """Matches of a line-anchored pattern pair ``(after a newline, at the text start)``."""
    after_newline, at_start = patterns
    first = at_start.match(text)
    if first is not None:
        yield first
    yield from after_newline.finditer(text)


def _md_title(line: str) -> str:
    """A Markdown heading's title: the rest of its line less a closing ``#`` sequence
    (one that follows a blank: ``## Term ##`` -> ``Term``, ``## C#`` stays ``C#``)."""
    title = line.rstrip(" \t\r")
    bare = title.rstrip("#")
    return bare.rstrip(" \t") if bare != title and bare[-1:] in (" ", "\t") else title


def _line_at(text: str, end: int) -> tuple[int, str]:
    """The start and text of the line that ends at ``end`` (the newline before a line)."""
    start = text.rfind("\n", 0, max(end, 0)) + 1
    return start, text[start:end]


def _fenced_spans(text: str, skip: set[int]) -> list[tuple[int, int]]:
    """``(start, end)`` of the fenced code blocks of a Markdown text (unclosed: to the end);
    fence-like lines starting at an offset in ``skip`` (title adornments) are not fences."""
    spans: list[tuple[int, int]] = []
    open_at: int | None = None
    open_fence = ""
    for match in _line_matches(_MD_FENCE, text):
        if match.start("h") in skip:
            continue
        fence = match.group("fence")
        if open_at is None:
            open_at, open_fence = match.start("h"), fence
        elif fence[0] == open_fence[0] and len(fence) >= len(open_fence):
            spans.append((open_at, match.end()))
            open_at = None
    if open_at is not None:
        spans.append((open_at, len(text)))
    return spans


def _underlined(text: str) -> list[tuple[int, int, str, str, tuple[int, ...]]]:
    """``(start, end, title, style, adornment starts)`` of each underlined or overlined title.

    A title is one line with a letter or digit, not indented unless overlined, after a blank
    line (or the text's start); the adornment is a line of one punctuation character, 3 or
    more long; an overline must be the same character. The style is the character
    (``"over"`` and the character when overlined: reStructuredText tells the two apart).
    """
    found: list[tuple[int, int, str, str, tuple[int, ...]]] = []
    taken_to = -1
    adornments = [
        m for m in _line_matches(_ADORNMENT, text) if not m.group("h").strip(m.group("h")[0])
    ]
    for n, match in enumerate(adornments):
        line_start = match.start("h")
        if line_start < taken_to:
            continue
        ch = match.group("h")[0]
        # Overlined: this line, a title line, then the same adornment.
        title_start = match.end() + 1
        if n + 1 < len(adornments) and title_start < len(text):
            under = adornments[n + 1]
            title_end = text.find("\n", title_start)
            if (
                under.group("h")[0] == ch
                and title_end >= 0
                and under.start("h") == title_end + 1
                and _is_title(text[title_start:title_end].strip())
            ):
                title = text[title_start:title_end].strip()
                rules = (line_start, under.start("h"))
                found.append((line_start, under.end(), title, "over" + ch, rules))
                taken_to = under.end()
                continue
        # Underlined: the line above is the title, after a blank line or the text's start.
        if line_start == 0:
            continue
        title_start, title = _line_at(text, line_start - 1)
        title = title.rstrip(" \t\r")
        if title[:1] in ("", " ", "\t") or not _is_title(title):
            continue
        if title_start > 0 and _line_at(text, title_start - 1)[1].strip():
            continue  # the last line of a paragraph over a rule
        found.append((title_start, match.end(), title, ch, (line_start,)))
        taken_to = match.end()
    return found


def _is_title(line: str) -> bool:
    return 0 < len(line) <= _MAX_TITLE_CHARS and any(c.isalnum() for c in line)


def line_headings(text: str) -> list[LineHeading]:
    """The document's line headings in text order: underlined or overlined titles, and
    Markdown ``#`` headings when the text is Markdown (two or more of them, or one on its
    first line: a lone ``# of Units`` line is not), none inside a fenced code block.

    Levels: ``#`` counts; underline styles are numbered in the order they first appear
    (reStructuredText's rule), after ``#`` and ``##`` when the text has ``#`` headings (so
    setext ``===`` is a level-1 and ``---`` a level-2 heading there).
    """
    underlined = _underlined(text)
    spans = _fenced_spans(text, {rule for u in underlined for rule in u[4]})
    span_starts = [s for s, _ in spans]

    def fenced(start: int) -> bool:
        i = bisect_left(span_starts, start + 1) - 1
        return i >= 0 and start < spans[i][1]

    markdown: list[LineHeading] = []
    for match in _line_matches(_MD_HEADING, text):
        start = match.start("h")
        if fenced(start):
            continue  # a '# comment' inside a code block
        title = " ".join(_md_title(match.group("title")).split())
        if any(ch.isalnum() for ch in title):
            level = len(match.group("hashes"))
            markdown.append(LineHeading(start, match.end(), level, title, "markdown"))
    if not (len(markdown) >= 2 or (markdown and not text[: markdown[0].start].strip())):
        markdown = []
    styles: dict[str, int] = {"=": 1, "-": 2} if markdown else {}
    headings = list(markdown)
    for start, end, title, style, _ in underlined:
        if fenced(start):
            continue
        level = styles.setdefault(style, len(styles) + 1)
        headings.append(LineHeading(start, end, level, " ".join(title.split()), "underlined"))
    headings.sort()
    return headings


def section_starts(text: str) -> list[int]:
    """Where each section starts: the offset of every line heading (:func:`line_headings`)."""
    return [h.start for h in line_headings(text)]
