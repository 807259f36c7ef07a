"""Resident memory per chunk by document length, with and without the document router.

The speed benchmark's corpus (``speed_corpus.py``: CUAD sentences, precomputed vectors) at
one size, its documents drawn at several lengths; each build runs in a fresh process and is
measured as ``bench_speed.py`` measures memory: resident memory after a GC and
``malloc_trim``, beyond the FAISS vectors. Without the router, the retriever keeps no lead
index: the difference is what the leads cost.

    python benchmarks/bench_memory_docs.py [--size 100000] [--lengths 50-100,3-8,1-2]
"""

from __future__ import annotations

import argparse
import multiprocessing
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def run(size: int, doc_chunks: tuple[int, int], router: bool) -> tuple[int, float, float]:
    """``(documents, bytes per chunk beyond the vectors, of which BM25 arrays)``."""
    from speed_corpus import Corpus, load_sentences
    from speed_query import build_rse

    corpus = Corpus(size, 5, load_sentences(), doc_chunks=doc_chunks)
    _, _, b = build_rse(corpus, **({} if router else {"router": None}))
    return b.documents, (b.rss_total - b.faiss_bytes) / b.chunks, b.lexical_bytes / b.chunks


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", type=int, default=100_000, help="chunks")
    p.add_argument("--lengths", default="50-100,3-8,1-2", help="chunks per document, lo-hi")
    args = p.parse_args()
    spawn = multiprocessing.get_context("spawn")
    lines = [
        f"{args.size:,} chunks; bytes per chunk beyond the vectors",
        "",
        "| chunks per document | documents | with the router (default) | without | the leads "
        "| of which BM25 arrays |",
        "|---|---|---|---|---|---|",
    ]
    for spec in args.lengths.split(","):
        lo, hi = (int(x) for x in spec.split("-"))
        found = []
        for router in (True, False):
            with ProcessPoolExecutor(max_workers=1, mp_context=spawn) as pool:
                found.append(pool.submit(run, args.size, (lo, hi), router).result())
            print(spec, "router" if router else "no router", found[-1], file=sys.stderr, flush=True)
        (docs, on, arrays), (_, off, _) = found
        row = [f"{lo}-{hi}", f"{docs:,}", f"{on:,.0f}", f"{off:,.0f}", f"{on - off:,.0f}"]
        lines.append("| " + " | ".join([*row, f"{arrays:,.0f}"]) + " |")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
