"""Synthetic corpus, queries and a lookup embedder for the speed benchmark.

The corpus is made of real contract sentences (CUAD) shuffled into chunk-sized
paragraphs of 320-598 characters, grouped into documents of 50-100 paragraphs.
Paragraphs are separated by blank lines; one paragraph plus its kept separator fits
a 600-character chunk (``CHUNK_SIZE``, the retriever's setting here) and two never do,
so the splitter cuts exactly one chunk per paragraph and every chunk text is known in
advance.

Vectors are precomputed: each document has a random "topic" direction and each
chunk is a unit vector mixing its document's topic with its own noise; a query,
ten consecutive words of one chunk, points near that chunk. Dense search therefore
finds the query's document, as a real embedder would, while the embedder itself is
a dictionary lookup.

Every document is generated from its own seed, so the corpus can be produced in
batches (only one batch of text and vectors alive at a time, whatever the size)
and regenerated identically (``Corpus.document``).
"""

from __future__ import annotations

import hashlib
import re
import time
from pathlib import Path

import numpy as np
from common import require_data
from langchain_core.documents import Document
from langchain_core.embeddings import Embeddings

DIM = 384
CHUNK_SIZE = 600
"""The retriever's chunk size in these benchmarks (the library default is 300)."""
MIN_PARAGRAPH, MAX_PARAGRAPH = 320, 598  # + the kept "\n\n" separator fits 600; two never do
DOC_CHUNKS = (50, 100)
QUERY_WORDS = 10

_SENTENCE_END = re.compile(r"(?<=[.;:])\s+")
_WORD = re.compile(r"[A-Za-z]{3,}")


def text_key(text: str) -> int:
    """A 64-bit key for a text (the embedder's lookup key)."""
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "little")


def load_sentences(directory: Path | None = None) -> list[str]:
    """Unique, whitespace-normalised sentences of 40-300 characters from the contracts
    (``data_dir()/cuad/contracts`` by default: the process exits 0 with a message where
    the benchmark data is absent)."""
    directory = directory or require_data("cuad", "contracts")
    sentences: set[str] = set()
    for path in sorted(directory.glob("*.txt")):
        text = " ".join(path.read_text(encoding="utf-8", errors="replace").split())
        sentences.update(s for s in _SENTENCE_END.split(text) if 40 <= len(s) <= 300)
    if not sentences:
        raise FileNotFoundError(f"no contract text found under {directory}")
    return sorted(sentences)


def _unit(x: np.ndarray) -> np.ndarray:
    x /= np.linalg.norm(x, axis=-1, keepdims=True)
    return x


class LookupEmbeddings(Embeddings):
    """Deterministic fake embedder: precomputed unit vectors looked up by text.

    Holds the vectors of the queries and of the current batch of chunks. An indexed
    text that carries a context header (``"context\n\nchunk"``, as the retriever's
    enrichers write it) gets its chunk's vector. A text without a precomputed vector
    gets a hash-seeded random one (counted in ``misses``). ``seconds`` accumulates the
    time spent in the embedder, so callers can subtract it from index-build timings.
    """

    def __init__(self) -> None:
        self.queries: dict[int, np.ndarray] = {}
        self.chunks: dict[int, np.ndarray] = {}
        self.misses = 0
        self.seconds = 0.0

    def set_chunks(self, texts: list[str], vectors: np.ndarray, keep: bool = False) -> None:
        """Make ``vectors`` the answers for ``texts`` (replacing the last batch unless ``keep``)."""
        if not keep:
            self.chunks = {}
        self.chunks.update(zip(map(text_key, texts), vectors))

    def _vector(self, text: str) -> np.ndarray:
        key = text_key(text)
        vector = self.queries.get(key)
        if vector is None:
            vector = self.chunks.get(key)
        if vector is None and "\n\n" in text:
            vector = self.chunks.get(text_key(text.rsplit("\n\n", 1)[1]))
        if vector is None:
            self.misses += 1
            vector = _unit(np.random.default_rng(key).standard_normal(DIM, dtype=np.float32))
        return vector

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        start = time.perf_counter()
        out = np.stack([self._vector(t) for t in texts]).tolist()
        self.seconds += time.perf_counter() - start
        return out

    def embed_query(self, text: str) -> list[float]:
        start = time.perf_counter()
        out = self._vector(text).tolist()
        self.seconds += time.perf_counter() - start
        return out


class Corpus:
    """``num_chunks`` chunks in documents of 50-100 chunks (``doc_chunks``), and
    ``num_queries`` queries."""

    def __init__(
        self,
        num_chunks: int,
        num_queries: int,
        sentences: list[str],
        seed: int = 0,
        doc_chunks: tuple[int, int] = DOC_CHUNKS,
    ) -> None:
        self.sentences = sentences
        self.seed = seed
        rng = np.random.default_rng(seed)
        lengths: list[int] = []
        while sum(lengths) < num_chunks:
            lengths.append(int(rng.integers(doc_chunks[0], doc_chunks[1] + 1)))
        lengths[-1] -= sum(lengths) - num_chunks  # exact total; the last document is shorter
        self.lengths = lengths
        self.num_chunks = num_chunks
        self.embeddings = LookupEmbeddings()
        self.queries = self._make_queries(rng, num_queries)

    @property
    def num_documents(self) -> int:
        return len(self.lengths)

    def _paragraph(self, picks: np.ndarray) -> str:
        """Join sentences drawn from ``picks`` until the paragraph is chunk-sized."""
        parts: list[str] = []
        size = -1
        for i in picks:
            s = self.sentences[i]
            if size + 1 + len(s) > MAX_PARAGRAPH:
                if size >= MIN_PARAGRAPH:
                    break
                continue
            parts.append(s)
            size += 1 + len(s)
            if size >= MIN_PARAGRAPH + 150:
                break
        return " ".join(parts)

    def document(self, d: int) -> tuple[Document, list[str], np.ndarray]:
        """Document ``d``, its chunk texts and their vectors."""
        rng = np.random.default_rng([self.seed, d])
        picks = rng.integers(0, len(self.sentences), size=(self.lengths[d], 12))
        paragraphs = [self._paragraph(p) for p in picks]
        topic = _unit(rng.standard_normal(DIM, dtype=np.float32))
        noise = _unit(rng.standard_normal((len(paragraphs), DIM), dtype=np.float32))
        vectors = _unit(0.6 * topic + 0.8 * noise)
        doc = Document(
            page_content="\n\n".join(paragraphs),
            id=f"doc-{d:07d}",
            metadata={"source": f"synthetic/{d:07d}.txt", "title": f"Contract {d}"},
        )
        return doc, paragraphs, vectors

    def _make_queries(self, rng: np.random.Generator, num_queries: int) -> list[str]:
        """Ten consecutive words of a random chunk; the vector lies near that chunk's."""
        rows = np.sort(rng.choice(self.num_chunks, size=num_queries, replace=False))
        starts = np.cumsum([0, *self.lengths])
        queries = []
        for row in rows.tolist():
            d = int(np.searchsorted(starts, row, side="right")) - 1
            _, paragraphs, vectors = self.document(d)
            words = _WORD.findall(paragraphs[row - starts[d]])
            at = int(rng.integers(0, max(1, len(words) - QUERY_WORDS + 1)))
            query = " ".join(words[at : at + QUERY_WORDS])
            noise = _unit(rng.standard_normal(DIM, dtype=np.float32))
            self.embeddings.queries[text_key(query)] = _unit(vectors[row - starts[d]] + 0.7 * noise)
            queries.append(query)
        return [queries[i] for i in rng.permutation(len(queries))]
