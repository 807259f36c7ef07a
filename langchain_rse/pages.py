"""Page numbers for segments: page boundaries kept as character offsets of the source.

A source document with pages carries ``metadata["page_offsets"]``: the offset in its text
where each page starts (page 1 at 0, strictly increasing). Every segment cut from it gets
``page_start`` and ``page_end`` (1-based, inclusive). :func:`combine_pages` builds such a
document from one ``Document`` per page (as LangChain's PDF loaders return them, or
built from ``pypdf`` directly).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from typing import Any

from langchain_core.documents import Document

__all__ = ["PAGE_OFFSETS", "check_page_offsets", "combine_pages", "join_pages", "page_range"]

PAGE_OFFSETS = "page_offsets"
"""The metadata key holding the start offset of every page."""

PAGE_SEPARATOR = "\n\n"

_PER_PAGE_KEYS = ("page", "page_label", "page_number")
"""Metadata of a single page that does not describe the combined document."""


def join_pages(pages: Sequence[str], separator: str = PAGE_SEPARATOR) -> tuple[str, list[int]]:
    """The pages' texts joined by ``separator``, and the offset where each page starts."""
    offsets, position = [], 0
    for n, page in enumerate(pages):
        if n:
            position += len(separator)
        offsets.append(position)
        position += len(page)
    return separator.join(pages), offsets


def combine_pages(pages: Sequence[Document], separator: str = PAGE_SEPARATOR) -> Document:
    """One source document from per-page documents (in page order), page offsets kept.

    The metadata is the first page's, less its per-page keys (``page``, ``page_label``,
    ``page_number``), plus ``page_offsets``; the id is the first page's. Segments of the
    result carry ``page_start`` / ``page_end`` counted from 1 in the order given, e.g.::

        from pypdf import PdfReader

        pages = [Document(p.extract_text(), metadata={"source": "contract.pdf"})
                 for p in PdfReader("contract.pdf").pages]
        retriever.add_documents([combine_pages(pages)])
    """
    if not pages:
        raise ValueError("combine_pages needs at least one page")
    text, offsets = join_pages([p.page_content for p in pages], separator)
    metadata = {k: v for k, v in pages[0].metadata.items() if k not in _PER_PAGE_KEYS}
    metadata[PAGE_OFFSETS] = offsets
    return Document(page_content=text, metadata=metadata, id=pages[0].id)


def check_page_offsets(value: Any, text_length: int, doc_id: str) -> None:
    """``ValueError`` unless ``value`` is valid page offsets for a text of that length."""
    ok = (
        isinstance(value, list)
        and len(value) > 0
        and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
        and value[0] == 0
        and all(a < b for a, b in zip(value, value[1:]))
        and value[-1] <= text_length
    )
    if not ok:
        raise ValueError(
            f"metadata[{PAGE_OFFSETS!r}] of document {doc_id!r} must be a list of increasing "
            f"integer offsets starting at 0 and not past the text's end ({text_length})"
        )


def page_range(offsets: Sequence[int], start: int, end: int) -> tuple[int, int]:
    """The first and last page (1-based, inclusive) of the characters ``[start, end)``."""
    first = bisect_right(offsets, start)
    last = bisect_right(offsets, max(start, end - 1))
    return first, last
