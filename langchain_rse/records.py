"""The JSON records kept in the record store, and the document version fingerprint.

Per indexed document the record store (any ``BaseStore[str, bytes]``) holds:

- ``doc/<h>``: the **pointer**, a :class:`DocRecord` naming the current version, its
  metadata and its chunk spans. It is written last and read first by every query.
- ``body/<version>/<h>``: a :class:`DocBody`, the source text and chunk contexts of one
  version.
- ``ver/<h>/<version>``: a :class:`VersionRecord` for every version whose chunks may be in
  the stores (written before its chunks, removed after them), so :func:`vacuum
  <langchain_rse.indexing.Writer.vacuum>` can find what a killed or beaten writer left.

``<h>`` is a SHA-256 of the doc id, so any id is a valid key in every store.
"""

from __future__ import annotations

import functools
import hashlib
import json
import struct
import time
from array import array
from collections.abc import Iterable, Iterator, Sequence
from itertools import accumulate
from typing import Any, overload

import lz4.block
from langchain_text_splitters import TextSplitter
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_serializer,
    field_validator,
)

from langchain_rse.chunking import chunk_key, chunk_uuid
from langchain_rse.enrichment import ChunkContext

__all__ = [
    "BLOCKED_ABOVE",
    "BLOCK_CHARS",
    "RECORD_FORMAT",
    "Body",
    "BodyBlocks",
    "Contexts",
    "DocBody",
    "DocRecord",
    "Spans",
    "StaleRead",
    "VersionRecord",
    "body_key",
    "document_version",
    "json_bytes",
    "local_form",
    "plain_form",
    "read_body",
    "is_version_of",
    "pointer_key",
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


_BODY = "body/"


def body_key(doc_id: str, version: str) -> str:
    """Record-store key of one version's source text and contexts."""
    return f"{_BODY}{version}/" + _doc_hash(doc_id)


def version_key(doc_id: str, version: str | None = None) -> str:
    """Record-store key of a version record (``version=None``: the document's prefix)."""
    prefix = f"ver/{_doc_hash(doc_id)}/"
    return prefix if version is None else prefix + version


class _Record(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")

    def to_bytes(self) -> bytes:
        return self.model_dump_json().encode("utf-8", "surrogatepass")

    @classmethod
    def from_bytes(cls, raw: bytes) -> Any:
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
        self.flat: array[int] = array("q", items)

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


class DocRecord(_Record):
    """The pointer: the current version of one document, read by every query."""

    model_config = ConfigDict(arbitrary_types_allowed=True)  # merged with _Record's

    format: int = RECORD_FORMAT
    doc_id: str
    version: str
    metadata: dict[str, Any]
    spans: Spans
    """Half-open character range of each chunk, in chunk order (stored flat)."""
    fallbacks: int = 0
    """Chunks whose LLM context failed (header used): re-adding the document retries them."""

    @field_validator("spans", mode="before")
    @classmethod
    def _compact(cls, value: Any) -> Spans:
        return value if isinstance(value, Spans) else Spans(value)

    @field_serializer("spans")
    def _flatten(self, spans: Spans) -> list[int]:
        return spans.flat.tolist()

    @classmethod
    def from_bytes(cls, raw: bytes) -> DocRecord:
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


_LZ4 = b"\x04"
"""The first byte of a record compressed by :func:`compressed` (then an LZ4 block that
starts with its decompressed size): JSON starts with ``{``, a packed body with ``\x00``."""

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


_PACKED = b"\x00"
"""The first byte of a body in the form an in-process store keeps (see :meth:`DocBody.packed`);
JSON starts with ``{``."""


def json_bytes(raw: bytes) -> bytes:
    """A stored record as JSON: a body an in-process store keeps (compressed, packed or
    JSON) is decompressed, and a packed one written as JSON again."""
    if raw[:1] == b"{":
        return raw
    if raw[:1] == _BLOCKS:
        return DocBody.from_bytes(raw).to_bytes()
    raw = decompressed(raw)
    return DocBody.from_bytes(raw).to_bytes() if raw[:1] == _PACKED else raw


def plain_form(key: str, raw: bytes) -> bytes:
    """The inverse of :func:`local_form`: the record at ``key`` as plain JSON (for a save)."""
    return json_bytes(raw) if key.startswith(_BODY) else raw


def local_form(key: str, raw: bytes) -> bytes:
    """How a record store in this process keeps the JSON record ``raw`` stored at ``key``:
    bodies (most of the bytes, and read only for the documents a query returns) packed
    (:meth:`DocBody.packed`) and compressed (:func:`compressed`), or in blocks when long
    (:class:`BodyBlocks`); the rest stays JSON."""
    return DocBody.from_bytes(raw).local_bytes() if key.startswith(_BODY) else raw


class Contexts(Sequence[ChunkContext]):
    """The chunk contexts of a document, kept as the ``(text, method)`` pairs they are
    stored as; each :class:`ChunkContext` is made when it is read. A query decodes the
    body of every document it returns and reads one context or none: building them all
    (pydantic checking each as a dataclass) took three quarters of decoding a body."""

    __slots__ = ("_json", "_pairs")

    def __init__(self, contexts: Iterable[Any] = ()) -> None:
        """From :class:`ChunkContext`\\ s or ``[text, method]`` pairs."""
        pairs = [(c.text, c.method) if isinstance(c, ChunkContext) else c for c in contexts]
        if not all(
            isinstance(p, (list, tuple)) and len(p) == 2 and type(p[0]) is type(p[1]) is str
            for p in pairs
        ):
            raise ValueError("each chunk context must be a [text, method] pair of strings")
        self._pairs: list[Any] | None = pairs
        self._json: bytes | None = None

    @classmethod
    def from_json(cls, raw: bytes) -> Contexts:
        """The pairs of this JSON array, parsed (and checked) when first read: a query that
        returns segments reads none of them."""
        out = cls.__new__(cls)
        out._pairs, out._json = None, raw
        return out

    @property
    def pairs(self) -> list[Any]:
        """The ``[text, method]`` pairs."""
        pairs = self._pairs
        if pairs is None:  # two threads may both parse them: the same pairs
            pairs = self._pairs = Contexts(json.loads(self._json or b"[]")).pairs
        return pairs

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


class DocBody(_Record):
    """The source text of one document version and its chunk contexts.

    An in-process record store keeps it LZ4-compressed (about a third of the JSON; see
    :class:`~langchain_rse.record_store.RecordStore`); :meth:`from_bytes` reads either form.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)  # merged with _Record's

    text: str
    contexts: Contexts
    """One per chunk; stored as ``[text, method]`` pairs."""

    @field_validator("contexts", mode="before")
    @classmethod
    def _from_pairs(cls, value: Any) -> Contexts:
        return value if isinstance(value, Contexts) else Contexts(value)

    @field_serializer("contexts")
    def _to_pairs(self, contexts: Contexts) -> list[list[str]]:
        return [[text, method] for text, method in contexts.pairs]

    @property
    def chars(self) -> int:
        """The length of the text."""
        return len(self.text)

    def slice(self, start: int, end: int) -> str:
        """``text[start:end]`` (what :class:`BodyBlocks` reads without decoding the rest)."""
        return self.text[start:end]

    @classmethod
    def from_bytes(cls, raw: bytes) -> DocBody:
        """From JSON, or a form an in-process store keeps (:meth:`local_bytes`, or
        :meth:`packed` decompressed), the whole text decoded (see :func:`read_body`)."""
        if raw[:1] == _BLOCKS:
            blocks = BodyBlocks(raw)
            return cls.model_construct(text=blocks.text, contexts=blocks.contexts)
        if raw[:1] != b"{" and raw[:1] != _PACKED:
            raw = decompressed(raw)
        if raw[:1] == _PACKED:  # no JSON parse of the text, contexts parsed when read
            size = int.from_bytes(raw[1:5], "little")
            text = str(memoryview(raw)[5 + size :], "utf-8", "surrogatepass")
            return cls.model_construct(text=text, contexts=Contexts.from_json(raw[5 : 5 + size]))
        return cls.model_validate_json(raw)

    def packed(self) -> bytes:
        """``\\x00``, the length of the contexts' JSON (4 bytes, little-endian), that JSON,
        then the text in UTF-8: read back without parsing the text as a JSON string, its
        contexts only when a caller reads them (a query returning segments never does)."""
        contexts = json.dumps(self.contexts.pairs, ensure_ascii=False).encode(
            "utf-8", "surrogatepass"
        )
        text = self.text.encode("utf-8", "surrogatepass")
        return b"".join((_PACKED, len(contexts).to_bytes(4, "little"), contexts, text))

    def local_bytes(self) -> bytes:
        """How an in-process record store keeps this body: :meth:`packed`, then
        compressed, or, above :data:`BLOCKED_ABOVE` characters, in blocks
        (:meth:`BodyBlocks.encode`; see :func:`local_form`)."""
        if len(self.text) > BLOCKED_ABOVE:
            return BodyBlocks.encode(self)
        return compressed(self.packed())


_BLOCKS = b"\x05"
"""The first byte of a body kept in blocks (:class:`BodyBlocks`)."""

BLOCK_CHARS = 32_768
"""Characters of text per block of a long body."""
BLOCKED_ABOVE = 65_536
"""Bodies with more characters are kept in blocks. Each block is compressed alone, which
costs ratio (CUAD contracts: 0.387 of the UTF-8 text in 32K-character blocks, 0.334 whole),
so shorter bodies stay whole; a segment then decodes at most two blocks however long its
document is (``benchmarks/RESULTS.md``, session 20)."""


class BodyBlocks:
    """A long body as an in-process record store keeps it: the text in blocks of
    :data:`BLOCK_CHARS` characters and the contexts' JSON, each LZ4-compressed alone, so
    that :meth:`slice` decodes only the blocks it covers (each once; then kept here).

    Layout: :data:`_BLOCKS`; block size, block count and text length in characters
    (``<IIQ``); ``count + 2`` byte offsets (``<Q``) of the contexts' block, each text
    block and the end; then the blocks.
    """

    __slots__ = ("_blocks", "_contexts", "_ends", "_raw", "block_chars", "chars")

    _HEAD = struct.Struct("<IIQ")

    @classmethod
    def encode(cls, body: DocBody, block_chars: int | None = None) -> bytes:
        """``body`` in this form, in blocks of ``block_chars`` (:data:`BLOCK_CHARS`)."""
        block_chars = block_chars or BLOCK_CHARS
        text = body.text
        pairs = json.dumps(body.contexts.pairs, ensure_ascii=False)
        parts = [pairs] + [text[i : i + block_chars] for i in range(0, len(text), block_chars)]
        packed = [
            lz4.block.compress(part.encode("utf-8", "surrogatepass"), mode="high_compression",
                               compression=LZ4_LEVEL)
            for part in parts
        ]  # fmt: skip
        start = 1 + cls._HEAD.size + 8 * (len(parts) + 1)
        ends = list(accumulate((len(b) for b in packed), initial=start))
        head = cls._HEAD.pack(block_chars, len(parts) - 1, len(text))
        return b"".join([_BLOCKS, head, array("Q", ends).tobytes(), *packed])

    def __init__(self, raw: bytes) -> None:
        """Read the layout (a ``ValueError`` for bytes that do not hold one); no block
        is decompressed yet."""
        try:
            if raw[:1] != _BLOCKS:
                raise ValueError("no block marker")
            self.block_chars, count, self.chars = self._HEAD.unpack_from(raw, 1)
            ends = array("Q")
            ends.frombytes(raw[1 + self._HEAD.size : 1 + self._HEAD.size + 8 * (count + 2)])
            if len(ends) != count + 2 or ends[-1] != len(raw) or self.block_chars < 1:
                raise ValueError("offsets do not match the bytes")
        except (ValueError, struct.error) as exc:
            raise ValueError(f"not a body in blocks ({exc})") from None
        self._raw, self._ends = raw, ends
        self._blocks: dict[int, str] = {}
        self._contexts: Contexts | None = None

    def _part(self, i: int) -> bytes:
        """Part ``i`` decompressed (0: the contexts' JSON, then the text blocks)."""
        part = memoryview(self._raw)[self._ends[i] : self._ends[i + 1]]
        try:
            return lz4.block.decompress(part)  # type: ignore[no-any-return]
        except (lz4.block.LZ4BlockError, ValueError) as exc:  # (ValueError: a bad size)
            raise ValueError(f"a body block that does not decompress: {exc}") from None

    def _block(self, i: int) -> str:
        block = self._blocks.get(i)
        if block is None:  # two threads may both decode it: the same text
            block = self._blocks[i] = str(self._part(i + 1), "utf-8", "surrogatepass")
        return block

    @property
    def contexts(self) -> Contexts:
        """The chunk contexts (their JSON decompressed when first read)."""
        if self._contexts is None:
            self._contexts = Contexts.from_json(self._part(0))
        return self._contexts

    def slice(self, start: int, end: int) -> str:
        """``text[start:end]``, decoding only the blocks it covers."""
        start, end, _ = slice(start, end).indices(self.chars)
        if start >= end:
            return ""
        size = self.block_chars
        first, last = start // size, (end - 1) // size
        if first == last:
            return self._block(first)[start - first * size : end - first * size]
        text = "".join(self._block(i) for i in range(first, last + 1))
        return text[start - first * size : end - first * size]

    @property
    def text(self) -> str:
        """The whole text."""
        return self.slice(0, self.chars)


Body = DocBody | BodyBlocks
"""A body as a query reads it: a slice of its text (``slice``), its ``contexts``."""


def read_body(raw: bytes) -> Body:
    """A stored body for reading slices: :class:`BodyBlocks` for a long body kept in
    blocks (nothing decoded yet), else the :class:`DocBody`."""
    return BodyBlocks(raw) if raw[:1] == _BLOCKS else DocBody.from_bytes(raw)


class VersionRecord(_Record):
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


def _describe(value: Any) -> Any:
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


def splitter_fingerprint(splitter: TextSplitter | None, chunk_size: int, overlap: int) -> str:
    """What decides where chunks fall: the default splitter's size and overlap, or a custom
    splitter's class and its parameters (a length function by its qualified name)."""
    if splitter is None:
        return f"default:{chunk_size}/{overlap}"
    cls = type(splitter)
    params = {k: _describe(v) for k, v in vars(splitter).items()}
    return json.dumps(
        {"class": f"{cls.__module__}.{cls.__qualname__}", "params": params}, sort_keys=True
    )


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
