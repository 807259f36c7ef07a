"""The in-process BM25 index alone, up to 1M chunks: build, memory, queries, writes.

Same synthetic CUAD corpus and queries as ``bench_speed.py`` (``speed_corpus.py``), no
vectors. Each size runs in a fresh process. Per size: build time (chunks added one
document per call, as ``add_documents`` does), resident memory per chunk, segments, query
latency, and adding or deleting one document until the next search sees it.

    python benchmarks/bench_lexical_scale.py [--sizes 100000,300000,1000000]
"""

from __future__ import annotations

import argparse
import multiprocessing
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))


def run(size: int, queries: int) -> dict[str, float]:
    from speed_corpus import Corpus, load_sentences
    from speed_query import rss as resident

    from langchain_rse.lexical import BM25Index

    corpus = Corpus(size, queries, load_sentences())
    before = resident()
    index = BM25Index()
    build = 0.0
    for d in range(corpus.num_documents):
        doc, paragraphs, _ = corpus.document(d)
        keys = [f"{doc.id}\x1fv0\x1f{i}" for i in range(len(paragraphs))]
        start = time.perf_counter()
        index.add(keys, paragraphs)
        build += time.perf_counter() - start
    start = time.perf_counter()
    index.refresh()  # background merges settle
    settle = time.perf_counter() - start
    rss = resident() - before  # after a GC and malloc_trim, as bench_speed.py measures
    for q in corpus.queries[:3]:
        index.search(q, 50)
    wall, cpu = [], []
    for q in corpus.queries[3:]:
        w, c = time.perf_counter(), time.process_time()
        index.search(q, 50)
        cpu.append((time.process_time() - c) * 1e3)
        wall.append((time.perf_counter() - w) * 1e3)
    _, paragraphs, _ = corpus.document(0)
    add, delete, add_cpu, delete_cpu = [], [], [], []
    for i in range(10):
        keys = [f"new-{i}\x1fv0\x1f{j}" for j in range(len(paragraphs))]
        texts = [*paragraphs[:-1], f"{paragraphs[-1]} zqxonly{i}"]
        start, c = time.perf_counter(), time.process_time()
        index.add(keys, texts)
        assert index.search(f"zqxonly{i}", 5)[0][0] == keys[-1]
        add.append((time.perf_counter() - start) * 1e3)
        add_cpu.append((time.process_time() - c) * 1e3)
        start, c = time.perf_counter(), time.process_time()
        index.delete(keys)
        assert index.search(f"zqxonly{i}", 5) == []
        delete.append((time.perf_counter() - start) * 1e3)
        delete_cpu.append((time.process_time() - c) * 1e3)
    return {
        "size": size,
        "build_s": build,
        "settle_s": settle,
        "rss_per_chunk": rss / size,
        "array_bytes_per_chunk": index.nbytes / size,
        "segments": index.segments,
        "p50": float(np.median(wall)),
        "p95": float(np.percentile(wall, 95)),
        "cpu_p50": float(np.median(cpu)),
        "add_p50": float(np.median(add)),
        "add_max": max(add),
        "delete_p50": float(np.median(delete)),
        "delete_max": max(delete),
        "add_cpu_p50": float(np.median(add_cpu)),
        "delete_cpu_p50": float(np.median(delete_cpu)),
        "doc_chunks": len(paragraphs),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="100000,300000,1000000")
    p.add_argument("--queries", type=int, default=103)
    args = p.parse_args()
    sizes = [int(float(s)) for s in args.sizes.split(",")]
    rows = []
    spawn = multiprocessing.get_context("spawn")
    for size in sizes:
        with ProcessPoolExecutor(max_workers=1, mp_context=spawn) as pool:
            r = pool.submit(run, size, args.queries).result()
        rows.append(r)
        print(r, file=sys.stderr, flush=True)
    head = ("| N chunks | build s (add one document per call) | chunks/s | RSS B/chunk | of which "
            "arrays | segments | search p50 ms | p95 ms | CPU p50 ms | add 1 doc + search p50 / "
            "max ms | (CPU p50) | delete 1 doc + search p50 / max ms | (CPU p50) |")  # fmt: skip
    lines = [head, "|" + "---|" * 13]
    for r in rows:
        lines.append(
            f"| {r['size']:,} | {r['build_s']:,.1f} | {r['size'] / r['build_s']:,.0f} | "
            f"{r['rss_per_chunk']:,.0f} | {r['array_bytes_per_chunk']:,.0f} | {r['segments']} | "
            f"{r['p50']:.2f} | {r['p95']:.2f} | {r['cpu_p50']:.2f} | {r['add_p50']:.1f} / "
            f"{r['add_max']:.1f} | {r['add_cpu_p50']:.1f} | {r['delete_p50']:.1f} / "
            f"{r['delete_max']:.1f} | {r['delete_cpu_p50']:.1f} |"
        )
    if len(rows) >= 2:
        n = np.log([r["size"] for r in rows])
        for key in ("p50", "cpu_p50", "rss_per_chunk"):
            slope = np.polyfit(n, np.log([r[key] for r in rows]), 1)[0]
            lines.append(f"\nfitted growth of {key} with N: N^{slope:.2f}")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
