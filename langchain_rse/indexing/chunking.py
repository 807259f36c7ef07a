"""Checking source documents (:func:`validate_documents`) and splitting them into chunks
that remember their exact offsets.

Every chunk satisfies ``source_text[chunk.start_index:chunk.end_index] == chunk.text``
whatever the overlap, repeated passages, unicode or line endings of the source.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from langchain_core.documents import Document
from langchain_text_splitters import RecursiveCharacterTextSplitter, TextSplitter

from langchain_rse.indexing.sections import LineHeading, line_headings

__all__ = [
    "LEAD_CHARS",
    "PAGE_OFFSETS",
    "Chunk",
    "SectionSplitter",
    "check_page_offsets",
    "combine_pages",
    "doc_id_for",
    "document_leads",
    "join_pages",
    "looks_binary",
    "make_splitter",
    "page_range",
    "split_text",
    "validate_documents",
]

DEFAULT_CHUNK_SIZE = 300
"""Default chunk size in characters: small chunks; RSE restores context by joining them
(300 beat 600 on both halves of the CUAD dev split, ``benchmarks/RESULTS.md``)."""


@dataclass(frozen=True)
class Chunk:
    """One chunk of a source document, located by character offsets (half-open)."""

    doc_id: str
    chunk_index: int
    start_index: int
    end_index: int
    text: str


def doc_id_for(document: Document) -> str:
    """``Document.id`` if set, else ``metadata["source"]``, else a hash of the content."""
    if document.id:
        return str(document.id)
    source: Any = document.metadata.get("source")
    if source is not None and str(source) != "":
        return str(source)
    digest = hashlib.sha256(document.page_content.encode("utf-8", "surrogatepass"))
    return "sha256:" + digest.hexdigest()[:32]


LEAD_CHARS = 2000
"""The opening a document's lead keeps (:func:`document_leads`). Long enough to get past
the cover matter many filed documents open with (an exhibit number, a several-hundred
character legend on omitted confidential information, a cover page) to the title, parties
and date; 300 characters, the first choice, routed 30% of the CUAD questions of an unseen
sample wrongly or not at all (``benchmarks/RESULTS.md``)."""


def document_leads(documents: Iterable[Document], max_chars: int = LEAD_CHARS) -> list[Document]:
    """One short document per input for a document router: its title and opening.

    The text is ``metadata["title"]`` (when set) and the first ``max_chars`` characters of
    the document with whitespace collapsed — for contracts, reports and papers, the name,
    parties, date or abstract that a query naming the document matches, also behind a
    cover legend (:data:`LEAD_CHARS`). Each lead keeps the input's id (:func:`doc_id_for`)
    as its ``id`` and ``metadata["doc_id"]``, so routing maps back to the indexed document,
    and the input's scalar metadata (strings, numbers, booleans: what a filter compares), so
    a router searched with a retriever's filter sees only the documents the filter allows.
    Index the leads in any retriever, e.g.::

        router = RSERetriever.from_documents(
            document_leads(docs), embedding=embeddings, mode="chunks", enricher=NoEnricher()
        )
        retriever = RSERetriever(vectorstore=vs, router=router)
    """
    if max_chars < 1:
        raise ValueError(f"max_chars must be >= 1, got {max_chars}")
    leads = []
    for doc in documents:
        doc_id = doc_id_for(doc)
        opening = " ".join(doc.page_content[: max_chars * 4].split())[:max_chars]
        title = doc.metadata.get("title")
        text = f"{title}\n{opening}" if isinstance(title, str) and title.strip() else opening
        meta = {k: v for k, v in doc.metadata.items() if isinstance(v, (str, int, float, bool))}
        meta["doc_id"] = doc_id
        if "source" in doc.metadata:
            meta["source"] = doc.metadata["source"]
        leads.append(Document(page_content=text or doc_id, id=doc_id, metadata=meta))
    return leads


_BREAKS = (
    re.compile(r"\S(?=[ \t]*\r?\n[ \t]*\r?\n)"),  # a paragraph's end (a blank line follows)
    re.compile(r"\S(?=[ \t]*\r?\n)"),  # a line's end
    re.compile(r"[.!?;:](?=\s)"),  # a sentence's or clause's end
    re.compile(r"\S(?=\s)"),  # a word's end
)
"""Where a chunk may end, strongest first: the offset just after each match."""


class SectionSplitter(TextSplitter):
    """The default splitter: chunks of about ``chunk_size`` characters that end where the
    text pauses, and sections for documents with headings.

    Text without line headings is split as it always was: a recursive splitter on
    paragraphs, then lines, sentences and words (the chunks the RSE presets were tuned on).
    Text with line headings (``indexing.sections``: Markdown ``#`` headings, titles
    underlined or overlined as in reStructuredText and AsciiDoc) is split in one pass: each
    chunk ends at the strongest break in the second half of its window (a section's end,
    then a paragraph's, a line's, a sentence's, a word's), the latest of that strength, and
    never inside or right after a title. So a section too short to fill half a chunk is
    packed with what follows, short paragraphs are packed together, and wrapped
    reStructuredText and Markdown make chunks about as long as plain text does. Chunks
    start at the next non-blank character (with ``chunk_overlap``, at the first word that
    many characters before the previous chunk's end). Every chunk is an exact slice.
    """

    def __init__(self, chunk_size: int, chunk_overlap: int = 0) -> None:
        super().__init__(chunk_size=chunk_size, chunk_overlap=chunk_overlap)
        self._plain = RecursiveCharacterTextSplitter(
            chunk_size=chunk_size,
            chunk_overlap=chunk_overlap,
            separators=["\n\n", "\n", ". ", " ", ""],
            keep_separator="end",
            strip_whitespace=True,
        )

    def split_text(self, text: str) -> list[str]:
        """The chunks of ``text``, in text order."""
        headings = line_headings(text)
        if not headings:
            return self._plain.split_text(text)
        return [text[s:e] for s, e in self._spans(text, headings)]

    def _spans(self, text: str, headings: list[LineHeading]) -> list[tuple[int, int]]:
        titles = [(h.start, h.end) for h in headings]
        section_ends = [len(text[: h.start].rstrip()) for h in headings if h.start > 0]
        breaks = [
            [p for p in offsets if not _in_title(titles, p)]
            for offsets in (section_ends, *([m.end() for m in b.finditer(text)] for b in _BREAKS))
        ]
        spans: list[tuple[int, int]] = []
        start, stop = len(text) - len(text.lstrip()), len(text.rstrip())
        size, overlap = self._chunk_size, self._chunk_overlap
        while start < stop:
            end = stop if stop - start <= size else _best_break(breaks, start, size)
            spans.append((start, end))
            if end >= stop:
                break
            nxt = end
            if overlap:
                words = breaks[-1]
                i = bisect_right(words, end - overlap - 1)
                nxt = words[i] if i < len(words) and words[i] < end else end
            found = _NON_SPACE.search(text, nxt, stop)
            following = found.start() if found else stop
            start = following if following > start else end
        return spans


def _in_title(titles: list[tuple[int, int]], offset: int) -> bool:
    """Whether a chunk ending at ``offset`` would end inside or right after a title."""
    i = bisect_left(titles, (offset, -1)) - 1
    return i >= 0 and titles[i][0] < offset <= titles[i][1]


def _best_break(breaks: list[list[int]], start: int, size: int) -> int:
    """The end of a chunk starting at ``start``: the strongest break in the second half of
    its window, the latest of that strength; else the strongest, latest in the first half;
    else a hard cut at ``size``."""
    hi, half = start + size, start + size // 2
    fallback = 0
    for offsets in breaks:
        i = bisect_right(offsets, hi) - 1
        if i >= 0 and offsets[i] > start:
            if offsets[i] >= half:
                return offsets[i]
            fallback = fallback or offsets[i]
    return fallback or hi


def make_splitter(chunk_size: int = DEFAULT_CHUNK_SIZE, chunk_overlap: int = 0) -> TextSplitter:
    """The default splitter (:class:`SectionSplitter`): chunks of about ``chunk_size``
    characters ending at a paragraph's, line's, sentence's or word's end, and at sections
    in documents with headings."""
    if chunk_size <= 0:
        raise ValueError(f"chunk_size must be positive, got {chunk_size}")
    if chunk_overlap < 0 or chunk_overlap >= chunk_size:
        raise ValueError(
            f"chunk_overlap must be in [0, chunk_size), got {chunk_overlap} "
            f"with chunk_size={chunk_size}"
        )
    return SectionSplitter(chunk_size=chunk_size, chunk_overlap=chunk_overlap)


_NON_SPACE = re.compile(r"\S")


def _locate(text: str, piece: str, prev: tuple[int, int] | None, char_overlap: int | None) -> int:
    """Where ``piece`` starts: after the previous chunk's start and no later than the first
    non-whitespace character after its end (so no text is skipped), hence in text order."""
    if prev is None:
        lo, end = 0, 0
    else:
        lo, end = prev[0] + 1, prev[1]
    nxt = _NON_SPACE.search(text, end)
    hi = (nxt.start() if nxt else len(text)) + len(piece)  # find() bound: start <= first
    if char_overlap is not None:  # overlap counted in characters: the true start is near
        start = text.find(piece, max(lo, end - char_overlap), hi)
        if start >= 0:
            return start
    # Overlap in other units (words, tokens): the overlap is the previous chunk's tail, so
    # the latest occurrence that skips nothing.
    start = text.rfind(piece, lo, hi)
    if start < 0:  # the splitter dropped text: the next occurrence, still in order
        start = text.find(piece, lo)
    return start if start >= 0 else text.find(piece)


def split_text(text: str, doc_id: str, splitter: TextSplitter | None = None) -> list[Chunk]:
    """Split ``text`` into chunks with exact offsets.

    The splitter decides where chunks break; the offsets are found here, in text order:
    each chunk is searched for between the previous chunk's start and the first text the
    previous chunk did not cover, so with any overlap — counted in characters, words or
    tokens — and with repeated passages, chunks follow the text and cover all of it. Only
    in text that repeats with a period shorter than the overlap may a chunk be placed at
    a text-identical neighbouring occurrence. Chunks have no duplicate spans.
    """
    splitter = splitter or make_splitter()
    overlap = int(getattr(splitter, "_chunk_overlap", 0) or 0)
    char_overlap = overlap if getattr(splitter, "_length_function", len) is len else None
    spans: list[tuple[int, int]] = []
    for piece in splitter.split_text(text):
        if not piece or piece.isspace():
            continue
        start = _locate(text, piece, spans[-1] if spans else None, char_overlap)
        if start < 0:
            raise ValueError(
                "the splitter produced a chunk that is not a substring of the source; "
                "use a splitter that keeps separators (keep_separator=True)"
            )
        spans.append((start, start + len(piece)))
    spans = sorted(set(spans))
    return [Chunk(doc_id, n, s, e, text[s:e]) for n, (s, e) in enumerate(spans)]


# ---------------------------------------------------------------- pages

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


_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


def looks_binary(text: str) -> bool:
    """NUL characters, or over 10% control/replacement characters in the first 100k."""
    if "\x00" in text:
        return True
    head = text[:100_000]
    odd = len(_CONTROL.findall(head)) + head.count("\ufffd")
    return odd > 0.1 * max(len(head), 1)


_SURROGATE = (
    "contains a lone surrogate (e.g. from json.loads('\"\\ud800\"')), which is not valid "
    "UTF-8 and cannot be stored; replace it first (s.encode('utf-8', 'replace').decode())"
)


def _is_utf8(text: str) -> bool:
    """Whether ``text`` encodes to UTF-8 (no lone surrogates)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _json_problem(value: Any) -> str | None:
    """What keeps a JSON-serialisable value from being stored and filtered exactly: a lone
    surrogate in a string, or NaN / infinity (JSON has neither; they came back as ``null``)."""
    if isinstance(value, str):
        return None if _is_utf8(value) else _SURROGATE
    if isinstance(value, float) and not math.isfinite(value):
        return (
            f"contains {value!r}: NaN and infinity are not JSON numbers, so they could be "
            "neither stored nor filtered on (use None or a finite number)"
        )
    if isinstance(value, dict):
        items = [*value.keys(), *value.values()]
    elif isinstance(value, (list, tuple)):
        items = list(value)
    else:
        return None
    return next((p for p in map(_json_problem, items) if p), None)


def validate_documents(
    documents: Sequence[Document], ids: Sequence[str] | None, max_document_chars: int
) -> list[str]:
    """The doc id of each document; raises before anything is written if one is invalid
    (not a ``Document``, binary, too long, metadata that is not JSON, a lone surrogate in
    the id, text or metadata, NaN or infinity in metadata, duplicate ids)."""
    if isinstance(documents, (str, Document)):
        raise TypeError("add_documents expects a list of Documents")
    if ids is not None and len(ids) != len(documents):
        raise ValueError(f"got {len(ids)} ids for {len(documents)} documents")
    doc_ids: list[str] = []
    for n, doc in enumerate(documents):
        if not isinstance(doc, Document):
            raise TypeError(f"documents[{n}] is {type(doc).__name__}, not a Document")
        if not isinstance(doc.page_content, str):
            raise TypeError(f"documents[{n}].page_content is not a string")
        doc_id = str(ids[n]) if ids is not None else doc_id_for(doc)
        if len(doc.page_content) > max_document_chars:
            raise ValueError(
                f"document {doc_id!r} has {len(doc.page_content):,} characters; the limit "
                f"is max_document_chars={max_document_chars:,} (split it, or raise the limit)"
            )
        if looks_binary(doc.page_content):
            raise ValueError(
                f"document {doc_id!r} looks like binary data decoded as text (NUL or "
                "many control characters); extract its text first"
            )
        if not _is_utf8(doc_id):
            raise ValueError(f"document id {doc_id!r} {_SURROGATE}")
        if not _is_utf8(doc.page_content):
            raise ValueError(f"the text of document {doc_id!r} {_SURROGATE}")
        for key, value in doc.metadata.items():
            try:
                json.dumps(value)
            except (TypeError, ValueError) as exc:
                raise TypeError(
                    f"metadata[{key!r}] of document {doc_id!r} is not JSON-serialisable "
                    f"({type(value).__name__}); convert it to a string or number first"
                ) from exc
            problem = _json_problem(key) or _json_problem(value)
            if problem:
                raise ValueError(f"metadata[{key!r}] of document {doc_id!r} {problem}")
        if PAGE_OFFSETS in doc.metadata:
            check_page_offsets(doc.metadata[PAGE_OFFSETS], len(doc.page_content), doc_id)
        doc_ids.append(doc_id)
    if len(set(doc_ids)) != len(doc_ids):
        dup = next(d for d in doc_ids if doc_ids.count(d) > 1)
        raise ValueError(f"duplicate document id {dup!r} in one add_documents call")
    return doc_ids
