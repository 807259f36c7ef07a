"""Read-your-writes latency: add or delete one document, then query until it is seen.

Timed on the built retriever of one size (``speed_query.run_size``): each repetition adds
a new document (its chunks embed by lookup; one carries a unique word), then runs the
query that must find it through the lexical branch; then deletes it and runs the query
that must no longer return it. The same is timed on the ``BM25Index`` alone.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from langchain_core.documents import Document


@dataclass
class WriteTiming:
    """Milliseconds per repetition."""

    chunks: int  # chunks of the added document
    add_ms: list[float] = field(default_factory=list)  # add_documents
    add_seen_ms: list[float] = field(default_factory=list)  # add + the first query that sees it
    add_vs_ms: list[float] = field(default_factory=list)  # of add: inside the vector store
    delete_ms: list[float] = field(default_factory=list)
    delete_gone_ms: list[float] = field(default_factory=list)
    delete_vs_ms: list[float] = field(default_factory=list)
    bm25_add_seen_ms: list[float] = field(default_factory=list)  # BM25Index alone
    bm25_delete_gone_ms: list[float] = field(default_factory=list)


def _timed(obj: Any, name: str, into: list[float]) -> None:
    """Accumulate the wall time of ``obj.name`` calls into ``into[-1]``."""
    original = getattr(obj, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            into[-1] += (time.perf_counter() - start) * 1e3

    setattr(obj, name, wrapper)


def time_writes(retriever: Any, store: Any, corpus: Any, repeats: int = 10) -> WriteTiming:
    """Add/delete one document ``repeats`` times on ``retriever`` (over ``store``)."""
    doc0, paragraphs, vectors = corpus.document(0)
    timing = WriteTiming(chunks=len(paragraphs))
    vs_ms: list[float] = [0.0]
    _timed(store, "add_documents", vs_ms)
    _timed(store, "delete", vs_ms)
    # The new document copies document 0 (same vectors, same lead) but for a marker word
    # that only BM25 sees: what is timed is its visibility, so the reading copy fuses 1:1
    # and does not route (dense-heavy weights let document 0's equal vectors outrank it).
    reader = retriever.model_copy(update={"router": None, "weights": (1.0, 1.0)})
    try:
        for i in range(repeats):
            word = f"zqxmarker{i}"
            texts = list(paragraphs)
            texts[1] = texts[1][: 580 - len(word)] + " " + word
            corpus.embeddings.set_chunks(texts, vectors)
            doc = Document(page_content="\n\n".join(texts), id=f"new-{i}", metadata=doc0.metadata)
            query = f"{word} {texts[1][:60]}"

            def seen(q: str = query, doc_id: str = f"new-{i}") -> bool:
                return any(d.metadata["doc_id"] == doc_id for d in reader.invoke(q, mode="chunks"))

            vs_ms[-1] = 0.0
            start = time.perf_counter()
            retriever.add_documents([doc])
            timing.add_ms.append((time.perf_counter() - start) * 1e3)
            timing.add_vs_ms.append(vs_ms[-1])
            if not seen():
                raise RuntimeError(f"document new-{i} not found by the query right after add")
            timing.add_seen_ms.append((time.perf_counter() - start) * 1e3)
            vs_ms[-1] = 0.0
            start = time.perf_counter()
            retriever.delete([f"new-{i}"])
            timing.delete_ms.append((time.perf_counter() - start) * 1e3)
            timing.delete_vs_ms.append(vs_ms[-1])
            if seen():
                raise RuntimeError(f"document new-{i} still found right after delete")
            timing.delete_gone_ms.append((time.perf_counter() - start) * 1e3)
    finally:
        for name in ("add_documents", "delete"):
            del store.__dict__[name]
    lexical = retriever._lexical
    for i in range(repeats):
        keys = [f"bm25-new-{i}\x1fv\x1f{j}" for j in range(len(paragraphs))]
        texts = [*paragraphs[:-1], f"{paragraphs[-1]} zqxonly{i}"]
        start = time.perf_counter()
        lexical.add(keys, texts)
        if lexical.search(f"zqxonly{i}", 5)[0][0] != keys[-1]:
            raise RuntimeError("BM25Index did not see its own write")
        timing.bm25_add_seen_ms.append((time.perf_counter() - start) * 1e3)
        start = time.perf_counter()
        lexical.delete(keys)
        if lexical.search(f"zqxonly{i}", 5):
            raise RuntimeError("BM25Index still returns a deleted chunk")
        timing.bm25_delete_gone_ms.append((time.perf_counter() - start) * 1e3)
    return timing


def write_rows(size: int, t: WriteTiming) -> list[list[str]]:
    def med(xs: list[float]) -> str:
        return f"{np.median(xs):,.1f}" if xs else "-"

    def p95(xs: list[float]) -> str:
        return f"{np.percentile(xs, 95):,.1f}" if xs else "-"

    return [
        [f"{size:,}", f"add 1 document ({t.chunks} chunks)", str(len(t.add_ms)), med(t.add_ms),
         med(t.add_vs_ms), med(t.add_seen_ms), p95(t.add_seen_ms), med(t.bm25_add_seen_ms)],
        [f"{size:,}", "delete it", str(len(t.delete_ms)), med(t.delete_ms), med(t.delete_vs_ms),
         med(t.delete_gone_ms), p95(t.delete_gone_ms), med(t.bm25_delete_gone_ms)],
    ]  # fmt: skip


WRITE_HEADERS = [
    "N chunks",
    "write",
    "repeats",
    "write call median ms",
    "of which vector store ms",
    "until the next query sees it, median ms",
    "p95 ms",
    "BM25Index alone: write + query, median ms",
]
