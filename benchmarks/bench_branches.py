"""Branches beside or in turn (``RSERetriever.parallel_branches``): what the worker thread
beside the dense search buys and costs, at one corpus size.

On the synthetic corpus of ``bench_speed.py`` (``speed_corpus``), over the exact store
and an IVF copy of it:

- latency on an otherwise idle machine: the median wall ms and the mean CPU ms (both
  threads) of ``invoke``, the branches beside each other (the default) and in turn,
  alternated over ``--rounds`` rounds of every query;
- throughput: queries per second summed over 1, 2 and 4 query processes forked after
  the build, each running queries for ``--seconds``, beside and in turn alternated.

    python benchmarks/bench_branches.py [--size 100000] [--rounds 6] [--seconds 8]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

from speed_corpus import Corpus, load_sentences
from speed_query import build_rse, ivf_copy, using_store

from langchain_rse import RSERetriever

MODES = {"beside": True, "in turn": False}


def latency(r: RSERetriever, queries: list[str]) -> tuple[float, float]:
    """Median wall ms and mean CPU ms per query over ``queries``."""
    wall, cpu = [], []
    for q in queries:
        w, c = time.perf_counter(), time.process_time()
        r.invoke(q)
        wall.append(time.perf_counter() - w)
        cpu.append(time.process_time() - c)
    return statistics.median(wall) * 1e3, statistics.mean(cpu) * 1e3


def throughput(r: RSERetriever, queries: list[str], procs: int, seconds: float) -> float:
    """Queries per second of ``procs`` forked processes querying flat out, summed."""
    read, write = os.pipe()
    children = []
    for _ in range(procs):
        pid = os.fork()
        if pid == 0:  # the child: its own thread pool (see langchain_rse.threads)
            n, start = 0, time.perf_counter()
            while time.perf_counter() - start < seconds:
                r.invoke(queries[n % len(queries)])
                n += 1
            os.write(write, f"{n / (time.perf_counter() - start)}\n".encode())
            os._exit(0)
        children.append(pid)
    for pid in children:
        os.waitpid(pid, 0)
    os.close(write)
    with os.fdopen(read) as f:
        return sum(float(line) for line in f)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", type=int, default=100_000, help="chunks (default 100,000)")
    p.add_argument("--rounds", type=int, default=6, help="latency rounds per mode")
    p.add_argument("--seconds", type=float, default=8.0, help="per throughput run")
    p.add_argument("--procs", default="1,2,4", help="query processes of the throughput runs")
    args = p.parse_args()
    corpus = Corpus(args.size, 50, load_sentences())
    r, store, _ = build_rse(corpus)
    queries = corpus.queries
    print(f"N={args.size:,} chunks, {len(queries)} queries, {os.cpu_count()} CPUs\n")
    rows: list[list[Any]] = []
    for name, vs in (("exact (FAISS-Flat)", store), ("IVF", ivf_copy(store))):
        with using_store(r, vs):
            found: dict[str, list[tuple[float, float]]] = {m: [] for m in MODES}
            qps: dict[str, dict[int, list[float]]] = {m: {} for m in MODES}
            for _ in range(args.rounds):
                for mode, beside in MODES.items():
                    r.parallel_branches = beside
                    found[mode].append(latency(r, queries))
            for procs in map(int, args.procs.split(",")):
                for _ in range(2):
                    for mode, beside in MODES.items():
                        r.parallel_branches = beside
                        latency(r, queries[:5])  # warm
                        qps[mode].setdefault(procs, []).append(
                            throughput(r, queries, procs, args.seconds)
                        )
            r.parallel_branches = True
            for mode in MODES:
                wall = statistics.median(x[0] for x in found[mode])
                cpu = statistics.median(x[1] for x in found[mode])
                cells = [f"{statistics.mean(v):.0f}" for v in qps[mode].values()]
                rows.append([name, mode, f"{wall:.2f}", f"{cpu:.2f}", *cells])
    procs = args.procs.split(",")
    head = ["store", "branches", "wall ms (median)", "CPU ms (mean)",
            *(f"q/s, {n} process{'es' if n != '1' else ''}" for n in procs)]  # fmt: skip
    print("| " + " | ".join(head) + " |")
    print("|---" * len(head) + "|")
    for row in rows:
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
