"""Document bodies: the source text and chunk contexts of one document version, and the
forms an in-process record store keeps them in.

A body is stored as UTF-8 JSON (:class:`DocBody`); a record store in this process keeps
that JSON LZ4-compressed (:func:`local_form`, about a third of the size). A save writes
plain JSON again (:func:`plain_form`). That is the one body codec.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, overload

import lz4.block
from pydantic import ConfigDict, field_serializer, field_validator

from langchain_rse.enrichment import ChunkContext
from langchain_rse.records import BODY_PREFIX, JsonRecord

__all__ = [
    "Body",
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
    :class:`~langchain_rse.record_store.RecordStore`); :meth:`from_bytes` reads either.
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
