"""The JSON records kept in the record store, their keys, and the document version
fingerprint, the chunk keys, and the bodies with their one codec.

Per indexed document the record store (any ``BaseStore[str, bytes]``) holds:

- ``doc/<h>``: the **pointer**, a :class:`Pointer` naming the current version, its
  metadata and its chunk spans. It is written last and read first by every query.
- ``body/<version>/<h>``: a :class:`~langchain_rse.indexing.records.DocBody`, the source text and
  chunk contexts of one version.
- ``ver/<h>/<version>``: a :class:`VersionRecord` for every version whose chunks may be in
  the stores (written before its chunks, removed after them), so :func:`vacuum
  <langchain_rse.indexing.Writer.vacuum>` can find what a killed or beaten writer left.

``<h>`` is a SHA-256 of the doc id, so any id is a valid key in every store.
"""

from __future__ import annotations

import functools
import hashlib
import json
import time
import uuid
from array import array
from collections.abc import Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, overload

import lz4.block
import numpy as np
from langchain_text_splitters import TextSplitter
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_serializer,
    field_validator,
)

from langchain_rse.indexing.chunking import make_splitter

__all__ = [
    "BODY_PREFIX",
    "RECORD_FORMAT",
    "Body",
    "ChunkContext",
    "Contexts",
    "DocBody",
    "JsonRecord",
    "Pointer",
    "Spans",
    "StaleRead",
    "VersionRecord",
    "body_key",
    "chunk_key",
    "chunk_uuid",
    "compressed",
    "decompressed",
    "doc_of",
    "document_version",
    "in_docs",
    "is_version_of",
    "json_bytes",
    "local_form",
    "parse_chunk_key",
    "plain_form",
    "pointer_key",
    "read_body",
    "default_splitter_params",
    "splitter_fingerprint",
    "version_key",
]

RECORD_FORMAT = 1
"""Version of the JSON records kept in the record store."""


class StaleRead(Exception):
    """A document changed while a query was reading it; the query re-reads."""


@functools.lru_cache(maxsize=4096)
def _doc_hash(doc_id: str) -> str:
    """The doc id's SHA-256 (hex, 40 digits): a query hashes the id of every candidate
    document for its pointer and of every returned one for its body; hot ones are kept."""
    return hashlib.sha256(doc_id.encode("utf-8", "surrogatepass")).hexdigest()[:40]


def pointer_key(doc_id: str) -> str:
    """Record-store key of a document's pointer."""
    return "doc/" + _doc_hash(doc_id)


BODY_PREFIX = "body/"
"""The prefix of every body key (:func:`body_key`)."""


def body_key(doc_id: str, version: str) -> str:
    """Record-store key of one version's source text and contexts."""
    return f"{BODY_PREFIX}{version}/" + _doc_hash(doc_id)


def version_key(doc_id: str, version: str | None = None) -> str:
    """Record-store key of a version record (``version=None``: the document's prefix)."""
    prefix = f"ver/{_doc_hash(doc_id)}/"
    return prefix if version is None else prefix + version


R = TypeVar("R", bound="JsonRecord")


class JsonRecord(BaseModel):
    """A record stored as UTF-8 JSON (frozen; fields it does not know are ignored)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    def to_bytes(self) -> bytes:
        return self.model_dump_json().encode("utf-8", "surrogatepass")

    @classmethod
    def from_bytes(cls: type[R], raw: bytes) -> R:
        return cls.model_validate_json(raw)  # UTF-8 JSON, parsed without a str copy


class Spans(Sequence[tuple[int, int]]):
    """Chunk spans ``(start, end)``, kept flat in one array of 64-bit integers: 16 bytes a
    chunk instead of ~120 as a list of tuples (a cached pointer holds every chunk's)."""

    __slots__ = ("flat",)

    def __init__(self, spans: Iterable[Any] = ()) -> None:
        """From ``(start, end)`` pairs or the flat ``[start, end, start, end, ...]``."""
        items: list[Any] = list(spans)
        if items and isinstance(items[0], (list, tuple)):
            items = [x for span in items for x in span]
        if len(items) % 2:
            raise ValueError("spans need a start and an end each")
        if not all(type(x) is int for x in items):
            raise ValueError("span starts and ends must be integers")
        try:
            self.flat: array[int] = array("q", items)
        except OverflowError:
            raise ValueError("a span start or end is out of range") from None

    def __len__(self) -> int:
        return len(self.flat) // 2

    @overload
    def __getitem__(self, i: int) -> tuple[int, int]: ...
    @overload
    def __getitem__(self, i: slice) -> list[tuple[int, int]]: ...
    def __getitem__(self, i: int | slice) -> tuple[int, int] | list[tuple[int, int]]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        n = len(self)
        if not -n <= i < n:
            raise IndexError("span index out of range")
        i %= n
        return int(self.flat[2 * i]), int(self.flat[2 * i + 1])

    def __iter__(self) -> Iterator[tuple[int, int]]:
        flat = self.flat
        return zip(flat[0::2], flat[1::2])

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Spans):
            return self.flat == other.flat
        return isinstance(other, (list, tuple)) and list(self) == [tuple(x) for x in other]

    def __hash__(self) -> int:
        return hash(self.flat.tobytes())

    def __repr__(self) -> str:
        return f"Spans({list(self)!r})"


class Pointer(JsonRecord):
    """The pointer: the current version of one document, read by every query."""

    model_config = ConfigDict(arbitrary_types_allowed=True)  # merged with JsonRecord's

    format: int = RECORD_FORMAT
    doc_id: str
    version: str
    metadata: dict[str, Any]
    spans: Spans
    """Half-open character range of each chunk, in chunk order (stored flat)."""
    fallbacks: int = 0
    """Chunks whose LLM context failed (header used): re-adding the document retries them."""
    headed: bool = False
    """The text has line headings (``indexing.sections``): its segments may run to
    ``RSEParams.headed_segment_chunks``."""

    @field_validator("spans", mode="before")
    @classmethod
    def _compact(cls, value: object) -> Spans:
        if isinstance(value, Spans):
            return value
        if not isinstance(value, (list, tuple)):
            raise ValueError(f"spans must be a list, not {type(value).__name__}")
        return Spans(value)

    @field_serializer("spans")
    def _flatten(self, spans: Spans) -> list[int]:
        return spans.flat.tolist()

    @classmethod
    def from_bytes(cls, raw: bytes) -> Pointer:
        """Parsed and checked by pydantic's JSON parser (half the time of ``json.loads``
        and a dict); anything it rejects, or another format, is read again with
        ``json.loads`` to say why: a format this version does not read, or the error."""
        try:
            record = cls.model_validate_json(raw)
        except ValidationError:
            pass
        else:  # the format written in the record, not its default
            if record.format == RECORD_FORMAT and "format" in record.model_fields_set:
                return record
        data = json.loads(raw)  # not JSON: its JSONDecodeError (a ValueError)
        found = data.get("format") if isinstance(data, dict) else None
        if found != RECORD_FORMAT:
            raise ValueError(
                f"record store entry has format {found!r}; "
                f"this version of langchain-rse reads format {RECORD_FORMAT}"
            )
        return cls.model_validate(data)

    def chunk_keys(self) -> list[str]:
        return [chunk_key(self.doc_id, self.version, i) for i in range(len(self.spans))]

    def version_record(self) -> VersionRecord:
        return VersionRecord(doc_id=self.doc_id, version=self.version, chunks=len(self.spans))


class VersionRecord(JsonRecord):
    """A version whose chunks may be in the stores: enough to delete them all."""

    doc_id: str
    version: str
    chunks: int
    written_at: float = Field(default_factory=time.time)

    def chunk_keys(self) -> list[str]:
        return [chunk_key(self.doc_id, self.version, i) for i in range(self.chunks)]

    def chunk_ids(self) -> list[str]:
        return [chunk_uuid(key) for key in self.chunk_keys()]


# ---------------------------------------------------------------- version fingerprint

_PRIMITIVE = (str, int, float, bool, type(None))


def _describe(value: object) -> object:
    """A process-independent description: primitives as they are, functions by their
    qualified name and the primitives they close over, other objects by class name."""
    if isinstance(value, _PRIMITIVE):
        return value
    if isinstance(value, (list, tuple, frozenset, set)):
        items = [_describe(v) for v in value]
        return sorted(items, key=repr) if isinstance(value, (set, frozenset)) else items
    if isinstance(value, dict):
        return {str(k): _describe(v) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    if callable(value) and hasattr(value, "__qualname__"):
        closure = [
            _describe(cell.cell_contents)
            for cell in getattr(value, "__closure__", None) or ()
            if isinstance(cell.cell_contents, _PRIMITIVE + (list, tuple, dict))
        ]
        return {"fn": f"{getattr(value, '__module__', '')}.{value.__qualname__}", "cells": closure}
    cls = type(value)
    return {"object": f"{cls.__module__}.{cls.__qualname__}"}


def _described(splitter: TextSplitter) -> str:
    cls = type(splitter)
    params = {k: _describe(v) for k, v in vars(splitter).items()}
    return json.dumps(
        {"class": f"{cls.__module__}.{cls.__qualname__}", "params": params}, sort_keys=True
    )


def default_splitter_params(splitter: TextSplitter) -> tuple[int, int] | None:
    """``(chunk_size, chunk_overlap)`` when ``splitter`` splits as ``make_splitter`` with
    them does (the default splitter, as the former ``chunk_overlap`` made it), else None."""
    size, overlap = (
        getattr(splitter, "_chunk_size", None),
        getattr(splitter, "_chunk_overlap", None),
    )
    if not (isinstance(size, int) and isinstance(overlap, int) and 0 <= overlap < size):
        return None
    same = _described(splitter) == _described(make_splitter(size, overlap))
    return (size, overlap) if same else None


def splitter_fingerprint(splitter: TextSplitter | None, chunk_size: int) -> str:
    """What decides where chunks fall: the default splitter's size and overlap, or a custom
    splitter's class and its parameters (a length function by its qualified name)."""
    if splitter is None:
        return f"default:{chunk_size}/0"
    if (params := default_splitter_params(splitter)) is not None:
        return "default:{}/{}".format(*params)
    return _described(splitter)


def document_version(text: str, metadata: dict[str, Any], splitter: str, enricher: str) -> str:
    """The version fingerprint of a document: its text and metadata, the splitter and the
    enricher fingerprints. Never a ``repr``, an address, a concurrency or a retry setting,
    so an unchanged document has the same version in every process."""
    h = hashlib.sha256()
    h.update(text.encode("utf-8", "surrogatepass"))
    h.update(b"\x00" + json.dumps(metadata, sort_keys=True, default=str).encode())
    h.update(b"\x00" + splitter.encode() + b"\x00" + enricher.encode())
    return h.hexdigest()[:16]


def is_version_of(version: str, base: str) -> bool:
    """Whether ``version`` is ``base`` or a re-indexing of it (``base.<suffix>``)."""
    return version.split(".")[0] == base


# ---------------------------------------------------------------- chunk keys

_CHUNK_NAMESPACE = uuid.UUID("6f1c1a52-2f7e-4c0c-9a53-0d8b1f2b9e11")
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


# ---------------------------------------------------------------- bodies


@dataclass(frozen=True)
class ChunkContext:
    """The context written for one chunk and how it was made."""

    text: str
    """Plain-text context ('' for none)."""
    method: str
    """``"none"``, ``"header"``, ``"llm"`` or ``"fallback"`` (LLM failed, header used)."""


_LZ4 = b"\x04"
"""The first byte of a record compressed by :func:`compressed` (then an LZ4 block that
starts with its decompressed size): JSON starts with ``{``."""

LZ4_LEVEL = 9
"""LZ4's high-compression level: on CUAD contracts 0.33 of the text (Zstandard at level 3:
0.28), decompressed at 2.9 GB/s (Zstandard: 0.6), compressed at 37 MB/s
(``benchmarks/RESULTS.md``, session 19). A query decodes the body of every document it
returns; a document is compressed once, when it is written."""


def compressed(raw: bytes) -> bytes:
    """``raw`` compressed: :data:`_LZ4`, then an LZ4 block at :data:`LZ4_LEVEL` (the block
    functions keep no state, so threads share them)."""
    return _LZ4 + lz4.block.compress(raw, mode="high_compression", compression=LZ4_LEVEL)


def decompressed(raw: bytes) -> bytes:
    """The inverse of :func:`compressed`; a ``ValueError`` for anything else."""
    if raw[:1] != _LZ4:
        raise ValueError(f"not a compressed record (it starts with {raw[:4]!r})")
    try:
        return lz4.block.decompress(memoryview(raw)[1:])  # type: ignore[no-any-return]
    except lz4.block.LZ4BlockError as exc:
        raise ValueError(f"a compressed record that does not decompress: {exc}") from None


def json_bytes(raw: bytes) -> bytes:
    """A stored body as plain JSON (for a save): a compressed one decompressed."""
    return decompressed(raw) if raw[:1] == _LZ4 else raw


def plain_form(key: str, raw: bytes) -> bytes:
    """The record at ``key`` as plain JSON (for a save)."""
    return json_bytes(raw) if key.startswith(BODY_PREFIX) else raw


def local_form(key: str, raw: bytes) -> bytes:
    """How a record store in this process keeps the JSON record ``raw`` stored at ``key``:
    bodies (most of the bytes) compressed (:func:`compressed`); the rest stays JSON."""
    return compressed(json_bytes(raw)) if key.startswith(BODY_PREFIX) else raw


class Contexts(Sequence[ChunkContext]):
    """The chunk contexts of a document, kept as the ``(text, method)`` pairs they are
    stored as; each :class:`ChunkContext` is made when it is read (building them all, as
    pydantic dataclasses, took three quarters of decoding a body)."""

    __slots__ = ("pairs",)

    def __init__(self, contexts: Iterable[Any] = ()) -> None:
        """From :class:`ChunkContext`\\ s or ``[text, method]`` pairs."""
        pairs = [(c.text, c.method) if isinstance(c, ChunkContext) else c for c in contexts]
        if not all(
            isinstance(p, (list, tuple)) and len(p) == 2 and type(p[0]) is type(p[1]) is str
            for p in pairs
        ):
            raise ValueError("each chunk context must be a [text, method] pair of strings")
        self.pairs: list[Any] = pairs

    def __len__(self) -> int:
        return len(self.pairs)

    @overload
    def __getitem__(self, i: int) -> ChunkContext: ...
    @overload
    def __getitem__(self, i: slice) -> list[ChunkContext]: ...
    def __getitem__(self, i: int | slice) -> ChunkContext | list[ChunkContext]:
        if isinstance(i, slice):
            return [ChunkContext(*p) for p in self.pairs[i]]
        return ChunkContext(*self.pairs[i])

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Contexts):
            return list(map(tuple, self.pairs)) == list(map(tuple, other.pairs))
        return isinstance(other, (list, tuple)) and list(self) == list(other)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Contexts({list(self)!r})"


class DocBody(JsonRecord):
    """The source text of one document version and its chunk contexts.

    An in-process record store keeps its JSON LZ4-compressed (see
    :class:`~langchain_rse.indexing.recordstore.RecordStore`); :meth:`from_bytes` reads either.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)  # merged with JsonRecord's

    text: str
    contexts: Contexts
    """One per chunk; stored as ``[text, method]`` pairs."""

    @field_validator("contexts", mode="before")
    @classmethod
    def _from_pairs(cls, value: object) -> Contexts:
        if isinstance(value, Contexts):
            return value
        if not isinstance(value, (list, tuple)):
            raise ValueError(f"contexts must be a list, not {type(value).__name__}")
        return Contexts(value)

    @field_serializer("contexts")
    def _to_pairs(self, contexts: Contexts) -> list[list[str]]:
        return [[text, method] for text, method in contexts.pairs]

    @property
    def chars(self) -> int:
        """The length of the text."""
        return len(self.text)

    def slice(self, start: int, end: int) -> str:
        """``text[start:end]``."""
        return self.text[start:end]

    @classmethod
    def from_bytes(cls, raw: bytes) -> DocBody:
        """From JSON, or JSON compressed by :meth:`local_bytes`."""
        return cls.model_validate_json(decompressed(raw) if raw[:1] == _LZ4 else raw)

    def local_bytes(self) -> bytes:
        """How an in-process record store keeps this body: its JSON, compressed."""
        return compressed(self.to_bytes())


Body = DocBody
"""A body as a query reads it: a slice of its text (``slice``), its ``contexts``."""


def read_body(raw: bytes) -> Body:
    """A stored body (plain or compressed JSON), decoded."""
    return DocBody.from_bytes(raw)
