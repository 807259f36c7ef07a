"""Shared test helpers: a small deterministic embedding model with real lexical semantics."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
from langchain_core.embeddings import Embeddings

from langchain_rse.lexical import tokenize


class HashingEmbeddings(Embeddings):
    """Bag-of-words feature hashing, L2-normalised: texts sharing words are close."""

    def __init__(self, dim: int = 256) -> None:
        self.dim = dim
        self.calls = 0

    def _embed(self, text: str) -> list[float]:
        vec = np.zeros(self.dim)
        for tok in tokenize(text):
            h = int.from_bytes(hashlib.blake2b(tok.encode(), digest_size=8).digest(), "little")
            vec[h % self.dim] += 1.0 if (h >> 32) & 1 else -1.0
        norm = np.linalg.norm(vec)
        return list(vec / norm) if norm else list(np.full(self.dim, 1.0 / np.sqrt(self.dim)))

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        self.calls += 1
        return [self._embed(t) for t in texts]

    def embed_query(self, text: str) -> list[float]:
        self.calls += 1
        return self._embed(text)


def make_contract(name: str, topics: list[str], filler_paragraphs: int = 8) -> str:
    """A long synthetic document: numbered sections, one per topic, with filler around."""
    parts = [f"{name.upper()} AGREEMENT\n"]
    for n, topic in enumerate(topics, start=1):
        parts.append(f"{n}. {topic.title()}\n")
        for p in range(filler_paragraphs):
            parts.append(
                f"{n}.{p + 1} The parties agree that the {topic} provisions of the {name} "
                f"agreement apply as described in paragraph {p + 1}, and that each obligation "
                f"on {topic} survives for the period stated herein, subject to clause {n}.\n"
            )
    return "\n".join(parts)


def stored_metadata(vs) -> list[dict]:
    """Metadata of every document held by an InMemoryVectorStore, the default FaissStore
    or LangChain's FAISS."""
    if hasattr(vs, "store"):
        return [v["metadata"] for v in vs.store.values()]
    if hasattr(vs, "metadatas"):
        return list(vs.metadatas)
    return [d.metadata for d in vs.docstore._dict.values()]


def index_texts(r) -> dict[tuple[str, int], str]:
    """The text each chunk of retriever ``r`` is indexed with (context + chunk), by
    ``(doc_id, chunk_index)``, rebuilt from its record store."""
    from langchain_rse.enrichment import index_text

    doc_ids = sorted({m["doc_id"] for m in stored_metadata(r.vectorstore)})
    pointers = [p for p in r.index.records.pointers(doc_ids) if p is not None]
    out = {}
    for p, body in zip(pointers, r.index.records.bodies(pointers)):
        for i, (start, end) in enumerate(p.spans):
            out[(p.doc_id, i)] = index_text(body.contexts[i], body.text[start:end])
    return out


def count_words(text: str) -> int:
    """A length function for word-counted splitters (module-level: same name everywhere)."""
    return len(text.split())


def cached_vectors() -> int:
    """Vectors in the default embedding cache (committed ones only)."""
    from langchain_rse.embeddings import VectorCache

    return VectorCache().count()


def write_corpus(folder: Path, files: int = 4, clauses: int = 30) -> None:
    """``files`` small contracts of numbered clauses, for the command's tests."""
    folder.mkdir()
    for f in range(files):
        body = "\n\n".join(
            f"{f}.{c} Clause {c} of contract {f}: the supplier ships order {f * 100 + c} "
            f"within {c + 2} days."
            for c in range(clauses)
        )
        (folder / f"contract{f}.txt").write_text(f"CONTRACT {f}\n\n{body}\n")


def search_branches(r):
    """The search branches ``r`` searches with at its current settings."""
    s = r._retrieval_settings()
    return r.index.branches(s.fetch_k, s.filter_translator)
