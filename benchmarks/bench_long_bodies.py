"""Long documents: what a query pays to read a segment of a document it returns.

An in-process record store keeps each document's source text compressed; a query
decodes the body of every document it returns whose body is not cached. Bodies above
``bodies.BLOCKED_ABOVE`` characters are kept in blocks of ``bodies.BLOCK_CHARS``
characters, each compressed alone, so a segment decodes the blocks it covers. This
measures both forms on texts made of CUAD contracts (dev and test alike: only their
bytes matter here) at several lengths:

- stored bytes per character of text (UTF-8 is about 1 byte a character here);
- reading one 2,000-character segment from the stored bytes (the body not cached);
- decoding the whole text;
- end to end: ``invoke`` over a retriever holding a few long documents, record caches
  cold before each query, and the CPU time of its record-body reads.

    python benchmarks/bench_long_bodies.py [--lengths 35000,200000,1000000,3000000]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from unittest import mock

from common import require_data
from langchain_core.documents import Document
from langchain_core.embeddings import DeterministicFakeEmbedding

import langchain_rse.bodies as bodies
import langchain_rse.records as records
from langchain_rse import RSERetriever
from langchain_rse.bodies import DocBody, read_body
from langchain_rse.persistence import default_vectorstore
from langchain_rse.record_store import RecordStore

SEGMENT = 2_000


def best_ms(fn: Callable[[], object], repeats: int = 7) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times) * 1e3


def codec_rows(text: str, lengths: list[int]) -> list[str]:
    rows = []
    for n in lengths:
        body = DocBody(text=text[:n], contexts=[["", "none"]] * (n // 300))
        whole = bodies.compressed(body.packed())
        blocked = bodies.BodyBlocks.encode(body)
        at = n // 2 - SEGMENT // 2
        cells = []
        for raw in (whole, blocked):
            read = best_ms(lambda raw=raw, at=at: read_body(raw).slice(at, at + SEGMENT))
            full = best_ms(lambda raw=raw: DocBody.from_bytes(raw).text)
            cells += [f"{len(raw) / n:.3f}", f"{read:.3f}", f"{full:.3f}"]
        rows.append(f"| {n:,} | " + " | ".join(cells) + " |")
    return rows


def end_to_end(text: str, length: int, docs: int, blocked: bool) -> tuple[float, float, float]:
    """Median ``invoke`` wall ms, its CPU ms and the record-body reads' CPU ms, caches cold."""
    above = bodies.BLOCKED_ABOVE if blocked else 10**12
    corpus = [Document(text[i * length : (i + 1) * length], id=f"d{i}") for i in range(docs)]
    with mock.patch.object(bodies, "BLOCKED_ABOVE", above):
        r = RSERetriever(vectorstore=default_vectorstore(DeterministicFakeEmbedding(size=64)))
        r.add_documents(corpus)
    words = text[: length * docs].split()
    queries = [" ".join(words[i : i + 6]) for i in range(0, len(words) - 6, len(words) // 40)]
    spent = [0.0]
    read_bodies = RecordStore.bodies

    def timed(self: RecordStore, recs: list[records.DocRecord]) -> list[bodies.Body]:
        start = time.thread_time()
        try:
            return read_bodies(self, recs)
        finally:
            spent[0] += time.thread_time() - start

    walls, cpus = [], []
    with mock.patch.object(RecordStore, "bodies", timed):
        for q in queries:
            r._records._bodies.clear()
            r._records._pointers.clear()
            wall, cpu = time.perf_counter(), time.process_time()
            r.invoke(q)
            walls.append(time.perf_counter() - wall)
            cpus.append(time.process_time() - cpu)
    ms = 1e3
    return statistics.median(walls) * ms, statistics.median(cpus) * ms, spent[0] / len(queries) * ms


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lengths", default="35000,200000,1000000,3000000")
    p.add_argument("--docs", type=int, default=4, help="documents in the end-to-end run")
    p.add_argument("--doc-chars", type=int, default=500_000, help="their length")
    args = p.parse_args()
    lengths = [int(x) for x in args.lengths.split(",")]
    contracts = require_data("cuad", "contracts")
    parts, total = [], 0
    for path in sorted(contracts.glob("*.txt")):
        parts.append(path.read_text(encoding="utf-8", errors="replace"))
        total += len(parts[-1])
        if total > max(max(lengths), args.docs * args.doc_chars):
            break
    text = "\n\n".join(parts)

    print(f"block size {bodies.BLOCK_CHARS:,} characters; bodies above "
          f"{bodies.BLOCKED_ABOVE:,} in blocks; a {SEGMENT:,}-character segment read "
          "from the middle; best of 7, ms\n")  # fmt: skip
    print("| characters | whole: bytes/char | whole: segment ms | whole: all ms "
          "| blocks: bytes/char | blocks: segment ms | blocks: all ms |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    print("\n".join(codec_rows(text, lengths)))

    print(f"\nend to end: {args.docs} documents of {args.doc_chars:,} characters, default "
          "retriever (FAISS, fake 64-d embeddings), about 40 queries, record caches cold "
          "before each; medians, body reads averaged\n")  # fmt: skip
    print("| bodies kept | invoke wall ms | invoke CPU ms | body reads CPU ms |")
    print("|---|---|---|---|")
    for blocked in (False, True):
        wall, cpu, body = end_to_end(text, args.doc_chars, args.docs, blocked)
        label = "in blocks" if blocked else "whole"
        print(f"| {label} | {wall:.2f} | {cpu:.2f} | {body:.3f} |")


if __name__ == "__main__":
    main()
