"""Document bodies: the source text and chunk contexts of one document version, and the
forms an in-process record store keeps them in.

A body is stored as JSON (:class:`DocBody`); a record store in this process keeps it
packed and LZ4-compressed (:func:`local_form`), or, when long, in blocks compressed one by
one (:class:`BodyBlocks`), so a query decodes only the text its segments cover. A save
writes JSON again (:func:`plain_form`).
"""

from __future__ import annotations

import json
import struct
from array import array
from collections.abc import Iterable, Sequence
from itertools import accumulate
from typing import Any, overload

import lz4.block
from pydantic import ConfigDict, field_serializer, field_validator

from langchain_rse.enrichment import ChunkContext
from langchain_rse.records import BODY_PREFIX, JsonRecord

__all__ = [
    "BLOCKED_ABOVE",
    "BLOCK_CHARS",
    "Body",
    "BodyBlocks",
    "Contexts",
    "DocBody",
    "compressed",
    "decompressed",
    "json_bytes",
    "local_form",
    "plain_form",
    "read_body",
]

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

_BLOCKS = b"\x05"
"""The first byte of a body kept in blocks (:class:`BodyBlocks`)."""


def json_bytes(raw: bytes) -> bytes:
    """A stored body as JSON: JSON as it is, any form an in-process store keeps
    (:meth:`DocBody.from_bytes` reads them all) written as JSON again."""
    return raw if raw[:1] == b"{" else DocBody.from_bytes(raw).to_bytes()


def plain_form(key: str, raw: bytes) -> bytes:
    """The inverse of :func:`local_form`: the record at ``key`` as plain JSON (for a save)."""
    return json_bytes(raw) if key.startswith(BODY_PREFIX) else raw


def local_form(key: str, raw: bytes) -> bytes:
    """How a record store in this process keeps the JSON record ``raw`` stored at ``key``:
    bodies (most of the bytes, and read only for the documents a query returns) packed
    (:meth:`DocBody.packed`) and compressed (:func:`compressed`), or in blocks when long
    (:class:`BodyBlocks`); the rest stays JSON."""
    return DocBody.from_bytes(raw).local_bytes() if key.startswith(BODY_PREFIX) else raw


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


class DocBody(JsonRecord):
    """The source text of one document version and its chunk contexts.

    An in-process record store keeps it LZ4-compressed (about a third of the JSON; see
    :class:`~langchain_rse.record_store.RecordStore`); :meth:`from_bytes` reads either form.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)  # merged with JsonRecord's

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
