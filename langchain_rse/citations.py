"""Check an agent's answer against the sources it cites.

The search tool (:func:`langchain_rse.agents.create_search_tool`) returns numbered sources
whose exact text and ranges are in the ``ToolMessage`` artifact: source ``[n]`` is
``artifact[n - 1]``. :func:`check_citations` reads every ``[n]`` in an answer, with the
passage quoted just before it (``"..." [n]``), and finds that passage in the exact text of
source ``n``: the document, the quote's character range in the *source document*, and
whether the quote is verbatim. :func:`citation_annotations` returns the same as LangChain
``Citation`` content blocks, to annotate the answer's text block.

Example:
    .. code-block:: python

        from langchain_rse.citations import check_citations

        tool_message = next(m for m in result["messages"] if m.type == "tool")
        for check in check_citations(result["messages"][-1].text, tool_message.artifact):
            print(check.n, check.status, check.doc_id, check.start, check.end)
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Literal

from langchain_core.documents import Document
from langchain_core.messages.content import Citation, create_citation

__all__ = ["CitationCheck", "CitationStatus", "check_citations", "citation_annotations"]

CitationStatus = Literal["verbatim", "whitespace", "misquoted", "unquoted", "no such source"]
"""What a check found: the quote is the source's exact text (``verbatim``); the same words
with other spacing or line breaks (``whitespace``); not in the source (``misquoted``); no
quote before the citation (``unquoted``: the range is the whole source passage); or the
number names no source (``no such source``)."""

_MARKER = re.compile(r"\[(\d{1,6}(?:\s*,\s*\d{1,6})*)\]")
_QUOTE = re.compile(r'(?:"([^"]+)"|“([^”]+)”|«\s?([^»]+?)\s?»)[\s,.;:]*\Z')
_BETWEEN_MARKERS = re.compile(r"[\s,;]*")
_CLOSING = ".,;:!?"


@dataclass(frozen=True)
class CitationCheck:
    """One ``[n]`` of an answer, checked against source ``n``'s exact text."""

    n: int
    """The number cited."""
    answer_start: int
    """Where the citation (its quote, else the ``[n]`` marker) starts in the answer."""
    answer_end: int
    """Where the ``[n]`` marker ends in the answer."""
    quote: str | None
    """The passage quoted just before ``[n]``, if any."""
    status: CitationStatus
    """What the check found (see :data:`CitationStatus`)."""
    doc_id: str | None = None
    """The cited document's id (None: no such source)."""
    source: str | None = None
    """The cited document's ``source`` metadata."""
    title: str | None = None
    """The cited document's title."""
    start: int | None = None
    """Start of the quote (else of the cited passage) in the source document."""
    end: int | None = None
    """End (exclusive) of the quote (else of the cited passage) in the source document."""

    @property
    def verbatim(self) -> bool:
        """Whether the quote is the source's exact text."""
        return self.status == "verbatim"


def _find(quote: str, text: str) -> tuple[CitationStatus, int, int] | None:
    """Where ``quote`` is in ``text``: exactly (closing punctuation inside the quotation
    marks aside), or with other whitespace; None if not there."""
    for candidate in (quote, quote.rstrip(_CLOSING)):
        if candidate and (at := text.find(candidate)) >= 0:
            return "verbatim", at, at + len(candidate)
    words = quote.rstrip(_CLOSING).split()
    if words:
        found = re.search(r"\s+".join(map(re.escape, words)), text)
        if found:
            return "whitespace", found.start(), found.end()
    return None


def check_citations(answer: str, artifact: Sequence[Document]) -> list[CitationCheck]:
    """Check every ``[n]`` citation of ``answer`` against the sources in ``artifact``.

    A quotation (``"..."``, ``“...”`` or ``«...»``) that ends right before a citation (or
    before a run of them: ``"..." [1][2]``, ``[1, 2]``) is its quote; it is looked up in
    the exact text of source ``n``.

    Args:
        answer: The model's answer text.
        artifact: The search tool's ``ToolMessage.artifact`` (source ``[n]`` is
            ``artifact[n - 1]``), segments with ``start_index``/``end_index`` metadata.

    Returns:
        One :class:`CitationCheck` per cited number, in the answer's order: the document,
        the character range in the source document (the quote's when it is found, else
        the whole cited passage's; none for a misquote or an unknown number) and the
        status.
    """
    checks: list[CitationCheck] = []
    previous_end = 0
    quote: tuple[str, int] | None = None
    for marker in _MARKER.finditer(answer):
        before = answer[previous_end : marker.start()]
        if not (checks and _BETWEEN_MARKERS.fullmatch(before)):  # a new run of citations
            found = _QUOTE.search(before)
            quote = (
                (next(g for g in found.groups() if g is not None), previous_end + found.start())
                if found
                else None
            )
        previous_end = marker.end()
        for number in marker.group(1).split(","):
            n = int(number)
            checks.append(_check(n, quote, marker, artifact))
    return checks


def _check(
    n: int, quote: tuple[str, int] | None, marker: re.Match[str], artifact: Sequence[Document]
) -> CitationCheck:
    text, at = quote if quote is not None else (None, marker.start())
    check = CitationCheck(n, at, marker.end(), text, "no such source")
    if not 1 <= n <= len(artifact):
        return check
    meta = artifact[n - 1].metadata
    check = replace(
        check,
        doc_id=None if meta.get("doc_id") is None else str(meta["doc_id"]),
        source=None if meta.get("source") is None else str(meta["source"]),
        title=None if meta.get("title") is None else str(meta["title"]),
    )
    offset = int(meta["start_index"])
    if text is None:
        return replace(check, status="unquoted", start=offset, end=int(meta["end_index"]))
    found = _find(text, artifact[n - 1].page_content)
    if found is None:
        return replace(check, status="misquoted")
    status, start, end = found
    return replace(check, status=status, start=offset + start, end=offset + end)


def citation_annotations(answer: str, artifact: Sequence[Document]) -> list[Citation]:
    """:func:`check_citations` as LangChain ``Citation`` content blocks, to annotate the
    answer's text block (``create_text_block(answer, annotations=...)``).

    Each block's ``start_index``/``end_index`` locate the citation in the answer (as
    LangChain defines them), ``cited_text`` is the source's exact text at the checked
    range, ``url`` the document's ``source``; ``extras`` hold ``n``, ``doc_id``,
    ``status``, ``verbatim``, ``quote`` and the range in the source document
    (``source_start``, ``source_end``). A citation of a number that names no source gets
    a block too, with ``status`` ``"no such source"`` and no document.

    Args:
        answer: The model's answer text.
        artifact: The search tool's ``ToolMessage.artifact``.

    Returns:
        One ``Citation`` per cited number, in the answer's order.
    """
    blocks = []
    for check in check_citations(answer, artifact):
        cited = None
        if check.start is not None and check.end is not None:
            segment = artifact[check.n - 1]
            offset = int(segment.metadata["start_index"])
            cited = segment.page_content[check.start - offset : check.end - offset]
        blocks.append(
            create_citation(
                url=check.source,
                title=check.title or check.source or check.doc_id,
                start_index=check.answer_start,
                end_index=check.answer_end,
                cited_text=cited,
                n=check.n,
                doc_id=check.doc_id,
                status=check.status,
                verbatim=check.verbatim,
                quote=check.quote,
                source_start=check.start,
                source_end=check.end,
            )
        )
    return blocks
