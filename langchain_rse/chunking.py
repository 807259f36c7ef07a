"""Splitting source documents into chunks that remember their exact offsets.

Every chunk satisfies ``source_text[chunk.start_index:chunk.end_index] == chunk.text``
whatever the overlap, repeated passages, unicode or line endings of the source.
"""

from __future__ import annotations

import hashlib
import re
import uuid
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from langchain_core.documents import Document
from langchain_text_splitters import RecursiveCharacterTextSplitter, TextSplitter

__all__ = [
    "LEAD_CHARS",
    "Chunk",
    "chunk_key",
    "chunk_uuid",
    "doc_of",
    "doc_id_for",
    "document_leads",
    "in_docs",
    "make_splitter",
    "parse_chunk_key",
    "split_text",
]

DEFAULT_CHUNK_SIZE = 300
"""Default chunk size in characters: small chunks; RSE restores context by joining them
(300 beat 600 on both halves of the CUAD dev split, ``benchmarks/RESULTS.md``)."""

_CHUNK_NAMESPACE = uuid.UUID("6f1c1a52-2f7e-4c0c-9a53-0d8b1f2b9e11")


@dataclass(frozen=True)
class Chunk:
    """One chunk of a source document, located by character offsets (half-open)."""

    doc_id: str
    chunk_index: int
    start_index: int
    end_index: int
    text: str


_SEP = "\x1f"


def chunk_key(doc_id: str, version: str, chunk_index: int) -> str:
    """The id of a chunk in the lexical index and in fusion: doc id, version, index.

    ``version`` identifies one indexed version of the document, so chunks of a
    replaced version can never be mistaken for the current one.
    """
    return f"{doc_id}{_SEP}{version}{_SEP}{chunk_index}"


def parse_chunk_key(key: str) -> tuple[str, str, int]:
    """Inverse of :func:`chunk_key` (the doc id may itself contain anything)."""
    doc_id, version, index = key.rsplit(_SEP, 2)
    return doc_id, version, int(index)


def doc_of(key: str) -> str:
    """The doc id of a chunk key (:func:`parse_chunk_key`'s first part, parsed alone)."""
    return key.rsplit(_SEP, 2)[0]


def in_docs(keys: Sequence[str], docs: Collection[str]) -> np.ndarray:
    """Whether each chunk key belongs to one of ``docs`` (a boolean array): a key that
    starts like one of theirs does when it has two separators more than the doc id (its
    version and index have none; a doc id may have some)."""
    prefixes = tuple(f"{d}{_SEP}" for d in docs)
    counts = {d.count(_SEP) + 2 for d in docs}
    if len(counts) > 1:  # doc ids with different separator counts: parse the key
        test = (k.startswith(prefixes) and doc_of(k) in docs for k in keys)
    else:
        n = counts.pop() if counts else 2
        test = (k.startswith(prefixes) and k.count(_SEP) == n for k in keys)
    return np.fromiter(test, dtype=bool, count=len(keys))


def chunk_uuid(key: str) -> str:
    """Deterministic UUID for a chunk key: a vector-store id valid in every store."""
    return str(uuid.uuid5(_CHUNK_NAMESPACE, key))


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


def make_splitter(chunk_size: int = DEFAULT_CHUNK_SIZE, chunk_overlap: int = 0) -> TextSplitter:
    """The default splitter: paragraphs, then lines, then sentences, then words."""
    if chunk_size <= 0:
        raise ValueError(f"chunk_size must be positive, got {chunk_size}")
    if chunk_overlap < 0 or chunk_overlap >= chunk_size:
        raise ValueError(
            f"chunk_overlap must be in [0, chunk_size), got {chunk_overlap} "
            f"with chunk_size={chunk_size}"
        )
    return RecursiveCharacterTextSplitter(
        chunk_size=chunk_size,
        chunk_overlap=chunk_overlap,
        separators=["\n\n", "\n", ". ", " ", ""],
        keep_separator="end",
        strip_whitespace=True,
    )


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
